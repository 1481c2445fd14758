// The log entry codec (log_codec.h): every op round-trips through encode + decode, op codes and
// the byte layout stay as documented, and a damaged payload (any truncation, an unknown op code,
// trailing bytes, a vector of the wrong length) is refused as a whole.
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "memkern/errors.h"
#include "memkern/log_codec.h"

using namespace memkern;

namespace {

constexpr uint32_t kDim = 3;

Record topic(int64_t id) {
  Record r;
  r.id = id;
  r.level = kTopic;
  r.created_at = r.updated_at = 100.0 + id;
  r.summary = "topic " + std::to_string(id);
  r.turns_json = R"([{"role":"user","content":"x"}])";
  r.meta_json = "{}";
  return r;
}

// One entry holding one op of every kind (a Version with every field).
std::string every_op_entry() {
  Writer w;
  encode_op_count(w, 4);
  float v[kDim] = {1.0f, 2.0f, 3.0f};
  encode_add(w, "alice", topic(5), v, kDim);
  std::string s = "new summary", t = "[]", m = R"({"a":1})";
  float v2[kDim] = {-1.0f, 0.5f, 0.25f};
  encode_version(w, 5, VersionOp::Merge, &s, v2, kDim, &t, &m, 200.5);
  encode_invalidate(w, 5, "outdated", 300.25);
  encode_delete(w, 5);
  return w.buf;
}

}  // namespace

TEST(log_codec, op_codes_are_the_documented_bytes) {
  CHECK_EQ(static_cast<int>(LogOp::Add), 1);
  CHECK_EQ(static_cast<int>(LogOp::Version), 2);
  CHECK_EQ(static_cast<int>(LogOp::Invalidate), 3);
  CHECK_EQ(static_cast<int>(LogOp::Delete), 4);
  CHECK_EQ(std::string(log_op_name(LogOp::Invalidate)), std::string("invalidate"));
  Writer w;
  encode_op_count(w, 1);
  encode_delete(w, 0x1122334455667788);
  // u32 n_ops = 1, u8 op = 4, i64 id (little-endian)
  const unsigned char want[] = {1, 0, 0, 0, 4, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11};
  CHECK_EQ(w.buf.size(), sizeof(want));
  CHECK(std::memcmp(w.buf.data(), want, sizeof(want)) == 0);
}

TEST(log_codec, every_op_round_trips) {
  std::vector<LogOperation> ops = decode_log_entry(every_op_entry(), kDim);
  CHECK_EQ(ops.size(), size_t(4));
  if (ops.size() != 4) return;
  const LogOperation& a = ops[0];
  CHECK(a.kind == LogOp::Add);
  CHECK_EQ(a.ns, std::string("alice"));
  CHECK_EQ(a.record.id, int64_t(5));
  CHECK_EQ(a.record.summary, std::string("topic 5"));
  CHECK_EQ(a.record.created_at, 105.0);
  CHECK((a.embedding == std::vector<float>{1.0f, 2.0f, 3.0f}));
  const LogOperation& v = ops[1];
  CHECK(v.kind == LogOp::Version);
  CHECK_EQ(v.id, int64_t(5));
  CHECK_EQ(static_cast<int>(v.version_op), static_cast<int>(VersionOp::Merge));
  CHECK_EQ(static_cast<int>(v.fields), kHasSummary | kHasEmbedding | kHasTurns | kHasMeta);
  CHECK_EQ(v.summary, std::string("new summary"));
  CHECK_EQ(v.turns_json, std::string("[]"));
  CHECK_EQ(v.meta_json, std::string(R"({"a":1})"));
  CHECK((v.embedding == std::vector<float>{-1.0f, 0.5f, 0.25f}));
  CHECK_EQ(v.time, 200.5);
  const LogOperation& i = ops[2];
  CHECK(i.kind == LogOp::Invalidate);
  CHECK_EQ(i.id, int64_t(5));
  CHECK_EQ(i.reason, std::string("outdated"));
  CHECK_EQ(i.time, 300.25);
  CHECK(ops[3].kind == LogOp::Delete);
  CHECK_EQ(ops[3].id, int64_t(5));
}

TEST(log_codec, version_carries_exactly_the_fields_given) {
  std::string s = "S", t = "[1]", m = "{}";
  float vec[kDim] = {4.0f, 5.0f, 6.0f};
  for (int mask = 0; mask < 16; ++mask) {
    Writer w;
    encode_op_count(w, 1);
    encode_version(w, 9, VersionOp::Update, (mask & 1) ? &s : nullptr, (mask & 2) ? vec : nullptr, kDim,
                   (mask & 4) ? &t : nullptr, (mask & 8) ? &m : nullptr, 1.0);
    std::vector<LogOperation> ops = decode_log_entry(w.buf, kDim);
    CHECK_EQ(ops.size(), size_t(1));
    if (ops.size() != 1) continue;
    const LogOperation& o = ops[0];
    CHECK_EQ(static_cast<int>(o.fields), mask);  // kHasSummary 1, kHasEmbedding 2, kHasTurns 4, kHasMeta 8
    CHECK_EQ(o.summary, std::string((mask & 1) ? "S" : ""));
    CHECK_EQ(o.embedding.size(), size_t((mask & 2) ? kDim : 0));
    CHECK_EQ(o.turns_json, std::string((mask & 4) ? "[1]" : ""));
    CHECK_EQ(o.meta_json, std::string((mask & 8) ? "{}" : ""));
    CHECK_EQ(static_cast<int>(o.version_op), static_cast<int>(VersionOp::Update));
    CHECK_EQ(o.time, 1.0);
  }
}

TEST(log_codec, every_truncation_is_refused) {
  std::string e = every_op_entry();
  for (size_t n = 0; n < e.size(); ++n) CHECK_THROWS(decode_log_entry(e.substr(0, n), kDim), CorruptedError, "log entry: ");
}

TEST(log_codec, unknown_op_trailing_bytes_and_wrong_dim_are_refused) {
  Writer w;
  encode_op_count(w, 1);
  w.u8(9);
  w.i64(1);
  CHECK_THROWS(decode_log_entry(w.buf, kDim), CorruptedError, "unknown operation 9");
  Writer z;
  encode_op_count(z, 1);
  z.u8(0);
  CHECK_THROWS(decode_log_entry(z.buf, kDim), CorruptedError, "unknown operation 0");
  std::string e = every_op_entry() + std::string(1, '\x04');
  CHECK_THROWS(decode_log_entry(e, kDim), CorruptedError, "trailing bytes");
  CHECK_THROWS(decode_log_entry(every_op_entry(), kDim + 1), CorruptedError, "vector length 3 != dim 4");
  // An op count larger than the ops present is a truncation, not a silent partial entry.
  std::string more = every_op_entry();
  more[0] = 5;
  CHECK_THROWS(decode_log_entry(more, kDim), CorruptedError, "truncated");
}

TEST(log_codec, empty_entry_and_multi_add_batches) {
  Writer w;
  encode_op_count(w, 0);
  CHECK(decode_log_entry(w.buf, kDim).empty());
  Writer b;
  encode_op_count(b, 100);
  for (int i = 0; i < 100; ++i) {
    float v[kDim] = {float(i), 0.0f, 1.0f};
    Record r = topic(i);
    if (i % 2) {
      r.level = kTurn;
      r.parent = i - 1;
    }
    encode_add(b, "ns", r, v, kDim);
  }
  std::vector<LogOperation> ops = decode_log_entry(b.buf, kDim);
  CHECK_EQ(ops.size(), size_t(100));
  for (size_t i = 0; i < ops.size(); ++i) {
    CHECK(ops[i].kind == LogOp::Add);
    CHECK_EQ(ops[i].record.id, int64_t(i));
    CHECK_EQ(ops[i].record.parent, int64_t(i % 2 ? i - 1 : -1));
    CHECK_EQ(ops[i].embedding[0], float(i));
  }
}

TEST(log_codec, import_round_trips_id_history_and_times) {
  // LogOp::Import (6): the record's own id, status, reason, version, op, timestamps, event time and
  // every older version with its vector travel in one op; a truncation anywhere is refused.
  Record r = topic(int64_t(3) << 48 | 7);
  r.status = Status::Invalidated;
  r.reason = "stale";
  r.version = 3;
  r.op = static_cast<uint8_t>(VersionOp::Update);
  r.updated_at = 250.75;
  r.event_time = 1.7e9;
  for (uint32_t j = 1; j <= 2; ++j) {
    Version v;
    v.version = j;
    v.summary = "old " + std::to_string(j);
    v.turns_json = "[]";
    v.meta_json = "{}";
    v.embedding = {float(j), 0.0f, -1.0f};
    v.updated_at = 100.0 + j;
    v.op = j == 1 ? 0 : 1;
    r.history.push_back(v);
  }
  Writer w;
  encode_op_count(w, 1);
  float cur[kDim] = {0.0f, 1.0f, 0.0f};
  encode_import(w, "bob", r, cur, kDim);
  CHECK_EQ(static_cast<int>(static_cast<unsigned char>(w.buf[4])), 6);
  CHECK_EQ(std::string(log_op_name(LogOp::Import)), std::string("import"));
  std::vector<LogOperation> ops = decode_log_entry(w.buf, kDim);
  CHECK_EQ(ops.size(), size_t(1));
  if (ops.size() != 1) return;
  const LogOperation& o = ops[0];
  CHECK(o.kind == LogOp::Import);
  CHECK_EQ(o.ns, std::string("bob"));
  CHECK_EQ(o.record.id, (int64_t(3) << 48) | 7);
  CHECK(o.record.status == Status::Invalidated);
  CHECK_EQ(o.record.reason, std::string("stale"));
  CHECK_EQ(o.record.version, uint32_t(3));
  CHECK_EQ(static_cast<int>(o.record.op), static_cast<int>(VersionOp::Update));
  CHECK_EQ(o.record.created_at, r.created_at);
  CHECK_EQ(o.record.updated_at, 250.75);
  CHECK_EQ(o.record.event_time, 1.7e9);
  CHECK_EQ(o.record.history.size(), size_t(2));
  if (o.record.history.size() == 2) {
    CHECK_EQ(o.record.history[1].summary, std::string("old 2"));
    CHECK_EQ(o.record.history[1].updated_at, 102.0);
    CHECK_EQ(static_cast<int>(o.record.history[1].op), 1);
    CHECK((o.record.history[0].embedding == std::vector<float>{1.0f, 0.0f, -1.0f}));
  }
  CHECK((o.embedding == std::vector<float>{0.0f, 1.0f, 0.0f}));
  for (size_t n = 0; n < w.buf.size(); ++n)
    CHECK_THROWS(decode_log_entry(w.buf.substr(0, n), kDim), CorruptedError, "log entry: ");
}
