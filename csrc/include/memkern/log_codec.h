// The write-ahead log's format (the one place it is written down) and the codec of its entries'
// payloads. wal.cpp reads and writes the file framing; log_codec.cpp encodes and decodes payloads;
// store.cpp builds entries (write path) and applies decoded ones (write path and replay).
//
// Log files (all integers little-endian). The store's log is a chain of files, each a header
// then entries: normally one, wal.log; while a snapshot is being written (or after one failed)
// also wal-<generation>.log, the log that continues past the snapshot's starting point (how the
// chain is read and retired: snapshot.h, "Logs").
//   header (44 bytes): magic "MKWAL\0\0\0", u32 format, u32 dim, u32 metric, u32 flags (0),
//                      u64 generation, u64 store_id, u32 crc32 of the preceding 40 bytes.
//     format 3 (written now) frames entries with a sync watermark (below); format 2 (still read,
//     and appended to in its own framing until the next snapshot replaces it) carries the
//     store's random id; format 1 had a reserved zero there, read as store_id 0 ("unknown").
//     generation orders the files of the chain: the first continues the snapshot of that
//     generation (0: none yet), each next one continues the one before. Opening refuses a log
//     whose store_id is not the snapshot's (another store's log) and a chain with a gap.
//   entry, format 3: u32 len, u32 crc32(payload), u64 synced, u32 crc32(the first 16 bytes),
//                    payload[len]. `synced` is the file offset up to which the log was durable
//                    (its last fdatasync had returned) when the entry was written: under fsync
//                    "always" the start of the entry's commit group (its own start when it
//                    committed alone), under "batch" / "never" the last sync point.
//   entry, formats 1-2: u32 len, u32 crc32(payload), u32 crc32(the first 8 bytes), payload[len]
//                    (no watermark: read as the entry's own start).
//   payload: u32 n_ops, then n_ops operations, applied all-or-nothing (one write call = one entry).
//   operation: u8 op code (LogOp), then by op:
//     Add (1):        str namespace, record fields (record.h: write_record_fields), f32 vector
//                     (u64 dim + dim floats; normalised already for metric "cos")
//     Version (2):    i64 id, u8 version op (VersionOp), u8 fields (VersionField bits), then the
//                     fields present in this order: str summary, f32 vector, str turns_json,
//                     str meta_json; then f64 updated_at
//     Invalidate (3): i64 id, str reason, f64 time (the record and its turn records)
//     Delete (4):     i64 id (the record and its turn records)
//     EventTime (5):  i64 id, f64 event_time (the conversation's own time of a record; follows the
//                     Add / Version of that record in the same entry; logs without it are older
//                     stores' or records without an event time)
//     Import (6):     str namespace, record fields (its own id, status, reason, version, op,
//                     created_at, updated_at: kept as they were), f64 event_time (NaN: none),
//                     u64 n older versions + each (record.h: write_version), f32 vector (current).
//                     An id-preserving insert (Store::import_records, the rebalance of a sharded
//                     store): unlike Add it never moves the store's next id.
//   str = u64 length + bytes (UTF-8 text); f32 vector = u64 n + n float32.
// Reading: entries are taken in order while each is intact (its header checksum holds, its length
// fits the file, its payload checksum holds, its watermark is not past its own start). At the
// first offset X where none is, the rest of the file is
//   * a torn tail, cut back to X on open (never refused), unless
//   * an intact entry further on carries a watermark past X: it was written after bytes at X had
//     been synced, so what is at X was acknowledged and has since been lost or altered: damage,
//     CorruptedError naming both offsets (nothing is dropped silently).
// What this means. A crash (process kill, OS crash, power loss) can only leave bytes written
// after the last completed sync in any state: missing, zeroed, a file system's stale blocks, or
// pages persisted in any order and any subset. Those bytes hold only unacknowledged entries under
// fsync "always" (an entry is acknowledged after the fdatasync that covers it returns: one per
// commit group, store.h), and the
// entries of the last interval under "batch"; they are cut back to the last intact entry, so the
// log replays a prefix of what was written, never an entry after a gap. Synced bytes cannot be
// changed by a crash: damage to them is reported (above) wherever a later entry proves it; the one
// case no file can prove is the very last entry, whose acknowledgment no later write records: if
// the disk zeroes or alters an entry after its sync returned and nothing was written after it, it
// reads as a torn tail and is cut back (a torn write and such loss leave identical bytes).
// A payload that decode_log_entry cannot parse completely (truncated field, unknown op, trailing
// bytes) is damage wherever it is (its checksum held, so it was written like that).
// Appending: one write() per entry. A failed or short write is cut back off the file
// (ftruncate to the previous end + fdatasync) before the error is raised; when even that fails
// the log refuses every later append (poisoned) until a retry of the cut succeeds.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "memkern/record.h"
#include "memkern/serial.h"

namespace memkern {

// Op code of one logged operation (the byte that starts it; values are on disk: never renumber).
enum class LogOp : uint8_t { Add = 1, Version = 2, Invalidate = 3, Delete = 4, EventTime = 5, Import = 6 };

// Which fields a Version operation carries (bit set).
enum VersionField : uint8_t { kHasSummary = 1, kHasEmbedding = 2, kHasTurns = 4, kHasMeta = 8 };

const char* log_op_name(LogOp op);

// One decoded operation; only the members of its kind are set.
struct LogOperation {
  LogOp kind = LogOp::Add;
  int64_t id = -1;                // Version, Invalidate, Delete: the target record
  std::string ns;                 // Add, Import: namespace name
  Record record;                  // Add: the new record's fields (ns index, history, children unset);
                                  // Import: also its history and event time
  std::vector<float> embedding;   // Add, Import; Version with kHasEmbedding: [dim]
  uint8_t version_op = 0;         // Version: VersionOp byte as stored (1 merge, 2 update)
  uint8_t fields = 0;             // Version: VersionField bits
  std::string summary, turns_json, meta_json;  // Version: the fields present
  std::string reason;             // Invalidate
  double time = 0;                // Version: updated_at; Invalidate: when; EventTime: the event time
};

// Encoding: a payload is encode_op_count(n) followed by exactly n encode_* calls.
void encode_op_count(Writer& w, uint32_t n_ops);
void encode_add(Writer& w, const std::string& ns, const Record& r, const float* vec, uint32_t dim);
// Null pointers are fields the version does not change.
void encode_version(Writer& w, int64_t id, VersionOp version_op, const std::string* summary, const float* vec,
                    uint32_t dim, const std::string* turns_json, const std::string* meta_json, double updated_at);
void encode_invalidate(Writer& w, int64_t id, const std::string& reason, double time);
void encode_delete(Writer& w, int64_t id);
void encode_event_time(Writer& w, int64_t id, double event_time);
// `r` with its history and event time; `vec` is its current vector (stored as given).
void encode_import(Writer& w, const std::string& ns, const Record& r, const float* vec, uint32_t dim);

// Decodes a whole payload (every vector must have `dim` floats). Throws CorruptedError naming
// "log entry" when it is truncated, holds an unknown op code, or has bytes after its last op.
std::vector<LogOperation> decode_log_entry(const std::string& payload, uint32_t dim);

}  // namespace memkern
