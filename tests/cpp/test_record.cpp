// Record field encoding (record.h), shared by the log and the snapshot: round trips, the exact
// byte layout, and rejection of damaged bytes (every truncation, bad level/status).
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "memkern/errors.h"
#include "memkern/record.h"
#include "memkern/serial.h"

using namespace memkern;

namespace {

Record sample() {
  Record r;
  r.id = 0x0102030405060708;
  r.ns = 7;
  r.level = kTurn;
  r.parent = 42;
  r.status = Status::Invalidated;
  r.version = 3;
  r.op = static_cast<uint8_t>(VersionOp::Update);
  r.created_at = 1700000000.25;
  r.updated_at = 1700000100.5;
  r.summary = std::string("caf\xc3\xa9 with a \0 NUL", 17);
  r.turns_json = R"([{"role":"user","content":"hi"}])";
  r.meta_json = R"({"k":1})";
  r.reason = "superseded";
  return r;
}

bool same_fields(const Record& a, const Record& b) {
  return a.id == b.id && a.ns == b.ns && a.level == b.level && a.parent == b.parent && a.status == b.status &&
         a.version == b.version && a.op == b.op && a.created_at == b.created_at && a.updated_at == b.updated_at &&
         a.summary == b.summary && a.turns_json == b.turns_json && a.meta_json == b.meta_json && a.reason == b.reason;
}

}  // namespace

TEST(record, fields_round_trip) {
  Record r = sample();
  Writer w;
  write_record_fields(w, r);
  Reader rd(w.buf.data(), w.buf.size(), "test");
  Record back = read_record_fields(rd);
  CHECK(same_fields(r, back));
  CHECK_EQ(rd.left(), size_t(0));
  CHECK(back.history.empty() && back.children.empty());  // travel apart (snapshot) or not at all (log)
}

TEST(record, field_layout_is_fixed) {
  // i64 id, u32 ns, u8 level, i64 parent, u8 status, u32 version, u8 op, f64 created, f64 updated,
  // then four strings (u64 length + bytes): the on-disk layout of records.bin and of log adds.
  Record r = sample();
  Writer w;
  write_record_fields(w, r);
  size_t fixed = 8 + 4 + 1 + 8 + 1 + 4 + 1 + 8 + 8;
  CHECK_EQ(w.buf.size(), fixed + 4 * 8 + r.summary.size() + r.turns_json.size() + r.meta_json.size() + r.reason.size());
  int64_t id;
  std::memcpy(&id, w.buf.data(), 8);
  CHECK_EQ(id, r.id);
  CHECK_EQ(static_cast<int>(static_cast<unsigned char>(w.buf[12])), static_cast<int>(kTurn));  // level after id + ns
  CHECK_EQ(static_cast<int>(static_cast<unsigned char>(w.buf[21])), 1);                        // status: invalidated
  uint64_t len;
  std::memcpy(&len, w.buf.data() + fixed, 8);
  CHECK_EQ(len, uint64_t(r.summary.size()));
  CHECK(std::memcmp(w.buf.data() + fixed + 8, r.summary.data(), r.summary.size()) == 0);
}

TEST(record, every_truncation_is_detected) {
  Writer w;
  write_record_fields(w, sample());
  for (size_t n = 0; n < w.buf.size(); ++n) {
    Reader rd(w.buf.data(), n, "record");
    CHECK_THROWS(read_record_fields(rd), CorruptedError, "record: ");
  }
}

TEST(record, bad_level_and_status_are_refused) {
  Writer w;
  write_record_fields(w, sample());
  std::string bad = w.buf;
  bad[12] = 2;  // level
  Reader r1(bad.data(), bad.size(), "record");
  CHECK_THROWS(read_record_fields(r1), CorruptedError, "bad record level");
  bad = w.buf;
  bad[21] = 2;  // status
  Reader r2(bad.data(), bad.size(), "record");
  CHECK_THROWS(read_record_fields(r2), CorruptedError, "bad record status");
}

TEST(record, huge_string_length_is_refused_before_allocating) {
  Writer w;
  write_record_fields(w, sample());
  std::string bad = w.buf;
  uint64_t huge = ~uint64_t(0) - 3;
  std::memcpy(&bad[8 + 4 + 1 + 8 + 1 + 4 + 1 + 8 + 8], &huge, 8);
  Reader rd(bad.data(), bad.size(), "record");
  CHECK_THROWS(read_record_fields(rd), CorruptedError, "truncated");
}

TEST(record, version_round_trip_and_dim_check) {
  Version v;
  v.version = 2;
  v.summary = "old summary";
  v.turns_json = "[]";
  v.meta_json = "{}";
  v.embedding = {1.5f, -2.0f, 0.0f, 3.25f};
  v.updated_at = 12.5;
  v.op = static_cast<uint8_t>(VersionOp::Merge);
  Writer w;
  write_version(w, v);
  Reader rd(w.buf.data(), w.buf.size(), "version");
  Version b = read_version(rd, 4);
  CHECK(b.version == v.version && b.summary == v.summary && b.turns_json == v.turns_json &&
        b.meta_json == v.meta_json && b.embedding == v.embedding && b.updated_at == v.updated_at && b.op == v.op);
  CHECK_EQ(rd.left(), size_t(0));
  Reader wrong(w.buf.data(), w.buf.size(), "version");
  CHECK_THROWS(read_version(wrong, 8), CorruptedError, "vector length 4 != dim 8");
}
