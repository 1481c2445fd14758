// In-memory layout of a memory record (a topic, or a turn linked to its topic).
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "memkern/serial.h"

namespace memkern {

enum class Status : uint8_t { Active = 0, Invalidated = 1 };
// Record::event_time when the record has none.
constexpr double kNoEventTime = std::numeric_limits<double>::quiet_NaN();
// Index level of a record: topics and turns live in separate HNSW indexes of one namespace.
enum Level : uint8_t { kTopic = 0, kTurn = 1, kNumLevels = 2 };
// How a version of a record came to be (Record::op, Version::op; stored as its byte value).
enum class VersionOp : uint8_t { Add = 0, Merge = 1, Update = 2 };

// A superseded version of a record (kept for history()).
struct Version {
  uint32_t version = 1;
  std::string summary;
  std::string turns_json;  // JSON array text, UTF-8
  std::string meta_json;   // JSON object text, UTF-8
  std::vector<float> embedding;
  double updated_at = 0;   // when this version was written
  uint8_t op = 0;          // 0 add, 1 merge, 2 update
};

struct Record {
  int64_t id = -1;
  uint32_t ns = 0;          // index into the namespace table
  uint8_t level = kTopic;
  int64_t parent = -1;      // topic id of a turn record, -1 for topics
  Status status = Status::Active;
  uint32_t version = 1;
  uint8_t op = 0;           // how the current version came (0 add, 1 merge, 2 update)
  double created_at = 0;
  double updated_at = 0;
  double event_time = kNoEventTime;  // the conversation's own time; NaN: none. Logged as its own
                                     // operation and kept in the snapshot's event-time section.
  std::string summary, turns_json, meta_json, reason;
  std::vector<Version> history;  // older versions, oldest first
  std::vector<int64_t> children;  // turn record ids of a topic
};

// Field encoding shared by the log and the snapshot (embedding excluded: it travels apart).
inline void write_record_fields(Writer& w, const Record& r) {
  w.i64(r.id);
  w.u32(r.ns);
  w.u8(r.level);
  w.i64(r.parent);
  w.u8(static_cast<uint8_t>(r.status));
  w.u32(r.version);
  w.u8(r.op);
  w.f64(r.created_at);
  w.f64(r.updated_at);
  w.str(r.summary);
  w.str(r.turns_json);
  w.str(r.meta_json);
  w.str(r.reason);
}

inline Record read_record_fields(Reader& rd) {
  Record r;
  r.id = rd.i64();
  r.ns = rd.u32();
  r.level = rd.u8();
  if (r.level >= kNumLevels) rd.fail("bad record level");
  r.parent = rd.i64();
  uint8_t st = rd.u8();
  if (st > 1) rd.fail("bad record status");
  r.status = static_cast<Status>(st);
  r.version = rd.u32();
  r.op = rd.u8();
  r.created_at = rd.f64();
  r.updated_at = rd.f64();
  r.summary = rd.str();
  r.turns_json = rd.str();
  r.meta_json = rd.str();
  r.reason = rd.str();
  return r;
}

inline void write_version(Writer& w, const Version& v) {
  w.u32(v.version);
  w.str(v.summary);
  w.str(v.turns_json);
  w.str(v.meta_json);
  w.floats(v.embedding.data(), v.embedding.size());
  w.f64(v.updated_at);
  w.u8(v.op);
}

inline Version read_version(Reader& rd, size_t dim) {
  Version v;
  v.version = rd.u32();
  v.summary = rd.str();
  v.turns_json = rd.str();
  v.meta_json = rd.str();
  v.embedding = rd.floats(dim);
  v.updated_at = rd.f64();
  v.op = rd.u8();
  return v;
}

}  // namespace memkern
