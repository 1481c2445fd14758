// The log file (wal.h framing + log_codec.h payloads) in a temp dir: entries written with
// Wal::append come back intact; a cut at any byte of the last entry or a zero tail is a torn
// (never acknowledged) write; a complete entry with a bad checksum, a bad entry header or a bad
// file header is damage (CorruptedError), wherever it is.
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "check.h"
#include "memkern/errors.h"
#include "memkern/log_codec.h"
#include "memkern/wal.h"

using namespace memkern;

namespace {

constexpr uint32_t kDim = 2;

std::string payload(int64_t id) {
  Writer w;
  encode_op_count(w, 2);
  Record r;
  r.id = id;
  r.summary = "record " + std::to_string(id);
  r.turns_json = "[]";
  r.meta_json = "{}";
  float v[kDim] = {1.0f + id, 2.0f};
  encode_add(w, "ns", r, v, kDim);
  encode_invalidate(w, id, "reason", 7.0);
  return w.buf;
}

void write_bytes(const std::string& file, const std::string& data) {
  std::ofstream f(file, std::ios::binary | std::ios::trunc);
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
}

std::string bytes_of(const std::string& file) {
  std::string data;
  read_file(file, &data);
  return data;
}

struct Log {
  std::string file;
  std::vector<uint64_t> ends;  // file offset after each entry (ends[0]: after the header)
};

Log make_log(const std::string& dir, int n) {
  WalHeader h;
  h.dim = kDim;
  h.metric = 0;
  h.generation = 3;
  h.store_id = 0xABCDEF;
  Wal::create(dir, "wal.log", h);
  Log log{dir + "/wal.log", {}};
  log.ends.push_back(bytes_of(log.file).size());
  Wal w;
  w.open_append(log.file);
  for (int i = 0; i < n; ++i) {
    w.append(payload(i));
    log.ends.push_back(bytes_of(log.file).size());
  }
  w.sync();
  w.close();
  return log;
}

}  // namespace

TEST(wal, entries_round_trip_through_the_file) {
  memkern_test::TempDir d;
  Log log = make_log(d.path(), 3);
  CHECK_EQ(log.ends[0], uint64_t(44));  // the documented header size
  std::vector<std::string> entries;
  WalScan scan;
  WalHeader h = Wal::read(log.file, &entries, &scan);
  CHECK_EQ(h.format, kWalFormat);
  CHECK_EQ(h.dim, kDim);
  CHECK_EQ(h.generation, uint64_t(3));
  CHECK_EQ(h.store_id, uint64_t(0xABCDEF));
  CHECK(!scan.torn);
  CHECK_EQ(scan.good_end, log.ends.back());
  CHECK_EQ(entries.size(), size_t(3));
  for (size_t i = 0; i < entries.size(); ++i) {
    CHECK(entries[i] == payload(static_cast<int64_t>(i)));
    CHECK_EQ(log.ends[i + 1] - log.ends[i], uint64_t(12 + entries[i].size()));  // u32 len, u32 crc, u32 hdr crc
    std::vector<LogOperation> ops = decode_log_entry(entries[i], kDim);
    CHECK(ops.size() == 2 && ops[0].kind == LogOp::Add && ops[0].record.id == int64_t(i) &&
          ops[1].kind == LogOp::Invalidate);
  }
}

TEST(wal, a_cut_anywhere_in_the_last_entry_is_a_torn_tail) {
  memkern_test::TempDir d;
  Log log = make_log(d.path(), 3);
  const std::string full = bytes_of(log.file);
  const uint64_t end2 = log.ends[2];
  for (uint64_t cut = end2 + 1; cut < full.size(); ++cut) {
    write_bytes(log.file, full.substr(0, cut));
    std::vector<std::string> entries;
    WalScan scan;
    Wal::read(log.file, &entries, &scan);
    if (!scan.torn || entries.size() != 2 || scan.good_end != end2) {
      CHECK(scan.torn);
      CHECK_EQ(entries.size(), size_t(2));
      CHECK_EQ(scan.good_end, end2);
      return;
    }
  }
  // Cutting the torn tail off leaves a log that takes new entries at a clean boundary.
  write_bytes(log.file, full.substr(0, end2 + 5));
  Wal::cut(log.file, end2);
  Wal w;
  w.open_append(log.file);
  w.append(payload(9));
  w.close();
  std::vector<std::string> entries;
  WalScan scan;
  Wal::read(log.file, &entries, &scan);
  CHECK(!scan.torn);
  CHECK(entries.size() == 3 && entries[2] == payload(9));
}

TEST(wal, a_zero_tail_is_torn_not_damage) {
  memkern_test::TempDir d;
  Log log = make_log(d.path(), 2);
  write_bytes(log.file, bytes_of(log.file) + std::string(4096, '\0'));
  std::vector<std::string> entries;
  WalScan scan;
  Wal::read(log.file, &entries, &scan);
  CHECK(scan.torn);
  CHECK_EQ(entries.size(), size_t(2));
  CHECK_EQ(scan.good_end, log.ends[2]);
}

TEST(wal, a_complete_entry_with_a_bad_checksum_is_damage_wherever_it_is) {
  memkern_test::TempDir d;
  Log log = make_log(d.path(), 3);
  const std::string full = bytes_of(log.file);
  for (int entry = 1; entry <= 3; ++entry) {  // the middle ones and the last one alike
    for (uint64_t at = log.ends[entry - 1] + 12; at < log.ends[entry]; at += 7) {
      std::string bad = full;
      bad[at] ^= 0x40;
      write_bytes(log.file, bad);
      std::vector<std::string> entries;
      WalScan scan;
      CHECK_THROWS(Wal::read(log.file, &entries, &scan), CorruptedError, "fails its checksum");
    }
  }
}

TEST(wal, damaged_entry_or_file_headers_are_refused) {
  memkern_test::TempDir d;
  Log log = make_log(d.path(), 2);
  const std::string full = bytes_of(log.file);
  std::vector<std::string> entries;
  WalScan scan;
  std::string bad = full;
  bad[log.ends[1] + 1] ^= 0x01;  // length field of the second entry
  write_bytes(log.file, bad);
  CHECK_THROWS(Wal::read(log.file, &entries, &scan), CorruptedError, "entry header at offset");
  bad = full;
  bad[20] ^= 0x01;  // inside the file header (metric)
  write_bytes(log.file, bad);
  CHECK_THROWS(Wal::read(log.file, &entries, &scan), CorruptedError, "header checksum mismatch");
  bad = full;
  bad[0] = 'X';
  write_bytes(log.file, bad);
  CHECK_THROWS(Wal::read(log.file, &entries, &scan), CorruptedError, "bad magic");
  write_bytes(log.file, full.substr(0, 30));
  CHECK_THROWS(Wal::read(log.file, &entries, &scan), CorruptedError, "header truncated");
  ::unlink(log.file.c_str());
  CHECK_THROWS(Wal::read(log.file, &entries, &scan), CorruptedError, "is missing");
}
