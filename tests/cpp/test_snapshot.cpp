// Snapshots: the records.bin codec round-trips records (with history and children), tombstones
// and the graph table, and refuses damaged or inconsistent files; the CURRENT pointer round-trips;
// a Store written, snapshotted and reopened in a temp dir (flat and HNSW indexes) comes back the same.
#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "check.h"
#include "memkern/errors.h"
#include "memkern/snapshot.h"
#include "memkern/store.h"
#include "memkern/wal.h"

using namespace memkern;

namespace {

SnapshotParams params() {
  SnapshotParams p;
  p.dim = 2;
  p.metric = 0;
  p.M = 16;
  p.ef_construction = 200;
  p.next_id = 10;
  return p;
}

std::unordered_map<int64_t, Record> records() {
  std::unordered_map<int64_t, Record> m;
  Record t;
  t.id = 3;
  t.ns = 1;
  t.summary = "topic";
  t.turns_json = "[]";
  t.meta_json = "{}";
  t.version = 2;
  t.op = static_cast<uint8_t>(VersionOp::Merge);
  t.children = {4, 5};
  Version old;
  old.version = 1;
  old.summary = "first";
  old.embedding = {0.5f, 0.25f};
  old.updated_at = 1.0;
  t.history.push_back(old);
  m[3] = t;
  for (int64_t c : {4, 5}) {
    Record r;
    r.id = c;
    r.ns = 1;
    r.level = kTurn;
    r.parent = 3;
    r.status = Status::Invalidated;
    r.reason = "why";
    m[c] = r;
  }
  return m;
}

std::vector<GraphFile> graphs() {
  GraphFile a;
  a.ns = 1;
  a.level = kTopic;
  a.name = "g1_0.flat";
  a.size = 123;
  a.crc = 0xDEADBEEF;
  GraphFile b = a;
  b.level = kTurn;
  b.name = "g1_1.hnsw";
  return {a, b};
}

std::string sample_file() {
  return encode_records_file(params(), {"a", "b"}, records(), {7, 8}, graphs());
}

}  // namespace

TEST(snapshot, records_file_round_trips) {
  SnapshotContents s = decode_records_file(sample_file(), "records.bin");
  CHECK(s.params.dim == 2 && s.params.metric == 0 && s.params.M == 16 && s.params.ef_construction == 200 &&
        s.params.next_id == 10);
  CHECK((s.namespaces == std::vector<std::string>{"a", "b"}));
  CHECK_EQ(s.records.size(), size_t(3));
  const Record& t = s.records.at(3);
  CHECK_EQ(t.summary, std::string("topic"));
  CHECK_EQ(t.version, uint32_t(2));
  CHECK((t.children == std::vector<int64_t>{4, 5}));
  CHECK_EQ(t.history.size(), size_t(1));
  if (t.history.size() == 1) {
    CHECK_EQ(t.history[0].summary, std::string("first"));
    CHECK((t.history[0].embedding == std::vector<float>{0.5f, 0.25f}));
  }
  const Record& c = s.records.at(5);
  CHECK(c.level == kTurn && c.parent == 3 && c.status == Status::Invalidated && c.reason == "why");
  std::vector<int64_t> tomb = s.tombstones;
  std::sort(tomb.begin(), tomb.end());
  CHECK((tomb == std::vector<int64_t>{7, 8}));
  CHECK_EQ(s.graphs.size(), size_t(2));
  if (s.graphs.size() == 2) {
    CHECK(s.graphs[1].ns == 1 && s.graphs[1].level == kTurn && s.graphs[1].name == "g1_1.hnsw" &&
          s.graphs[1].size == 123 && s.graphs[1].crc == 0xDEADBEEF);
  }
}

TEST(snapshot, damaged_files_are_refused) {
  const std::string good = sample_file();
  for (size_t at = 0; at < good.size(); ++at) {  // any flipped byte: magic, header or checksum
    std::string bad = good;
    bad[at] ^= 0x10;
    CHECK_THROWS(decode_records_file(bad, "f"), CorruptedError, "snapshot f: ");
  }
  for (size_t n = 0; n < good.size(); n += 3) CHECK_THROWS(decode_records_file(good.substr(0, n), "f"), CorruptedError, "snapshot f: ");
  CHECK_THROWS(decode_records_file(good + "x", "f"), CorruptedError, "does not match its header");
}

TEST(snapshot, inconsistent_contents_are_refused_under_a_valid_checksum) {
  auto recs = records();
  recs[3].ns = 2;  // only namespaces 0 and 1 exist
  CHECK_THROWS(decode_records_file(encode_records_file(params(), {"a", "b"}, recs, {}, {}), "f"), CorruptedError,
               "record namespace out of range");
  recs = records();
  recs[3].id = -1;  // ids are >= 0
  CHECK_THROWS(decode_records_file(encode_records_file(params(), {"a", "b"}, recs, {}, {}), "f"), CorruptedError,
               "record id out of range");
  // A record id past next_id is a record imported with its own id (Store::import_records): kept.
  SnapshotParams p = params();
  p.next_id = 4;  // record 5 is beyond it
  CHECK_EQ(decode_records_file(encode_records_file(p, {"a", "b"}, records(), {}, {}), "f").records.size(),
           records().size());
  p = params();
  p.dim = 0;
  CHECK_THROWS(decode_records_file(encode_records_file(p, {}, {}, {}, {}), "f"), CorruptedError, "bad dim/metric");
  p = params();
  p.M = 1;
  CHECK_THROWS(decode_records_file(encode_records_file(p, {}, {}, {}, {}), "f"), CorruptedError, "bad graph parameters");
  auto g = graphs();
  g[1].level = kTopic;  // the same (namespace, level) twice
  CHECK_THROWS(decode_records_file(encode_records_file(params(), {"a", "b"}, {}, {}, g), "f"), CorruptedError,
               "bad graph table entry");
  g = graphs();
  g[0].name = "../escape";
  CHECK_THROWS(decode_records_file(encode_records_file(params(), {"a", "b"}, {}, {}, g), "f"), CorruptedError,
               "bad graph table entry");
}

TEST(snapshot, current_pointer_round_trips) {
  memkern_test::TempDir d;
  CHECK_EQ(read_current(d.path()).generation, kNoGeneration);  // no CURRENT yet
  write_file_atomic(d.path(), "CURRENT", encode_current(41, 0x1234));
  Current c = read_current(d.path());
  CHECK_EQ(c.generation, uint64_t(41));
  CHECK_EQ(c.store_id, uint64_t(0x1234));
  CHECK_EQ(c.format, kCurrentFormat);
  std::string bad = encode_current(41, 0x1234);
  bad[12] ^= 1;
  write_file_atomic(d.path(), "CURRENT", bad);
  CHECK_THROWS(read_current(d.path()), CorruptedError, "checksum mismatch");
  CHECK_EQ(snapshot_dir_name(7), std::string("snap-7"));
  CHECK(new_store_id() != 0);
}

namespace {

struct Seen {
  std::vector<int64_t> ids;
  std::vector<std::string> summaries;
  std::vector<uint32_t> versions;
  std::vector<int> status;
  std::vector<std::vector<int64_t>> children;
  std::vector<float> vectors;
  std::vector<int64_t> hits;
  bool operator==(const Seen& o) const {
    return ids == o.ids && summaries == o.summaries && versions == o.versions && status == o.status &&
           children == o.children && vectors == o.vectors && hits == o.hits;
  }
};

Seen look(const Store& s, const std::vector<float>& queries, size_t B) {
  Seen out;
  for (uint8_t level : {uint8_t(kTopic), uint8_t(kTurn)})
    for (int64_t id : s.ids("user", true, level)) out.ids.push_back(id);
  for (int64_t id : out.ids) {
    RecordView v = s.get(id);
    out.summaries.push_back(v.rec.summary);
    out.versions.push_back(v.rec.version);
    out.status.push_back(static_cast<int>(v.rec.status));
    out.children.push_back(v.rec.children);
    out.vectors.insert(out.vectors.end(), v.embedding.begin(), v.embedding.end());
    out.versions.push_back(static_cast<uint32_t>(s.history(id).size()));
  }
  SearchResult r = s.search("user", queries.data(), B, 5, 50, false, kTopic);
  out.hits = r.ids;
  SearchResult t = s.search_turn_topic("user", queries.data(), B, 5, 50, true, 0.5f, 10);
  out.hits.insert(out.hits.end(), t.ids.begin(), t.ids.end());
  return out;
}

void store_round_trip(uint64_t flat_limit, const char* kind) {
  memkern_test::TempDir d;
  const std::string path = d.path() + "/store";
  constexpr uint32_t D = 8;
  uint32_t x = 7;
  auto rnd = [&]() {
    x = x * 1664525u + 1013904223u;
    return static_cast<float>(x >> 8) / 16777216.0f - 0.5f;
  };
  std::vector<float> q(3 * D);
  for (auto& v : q) v = rnd();
  Seen before;
  StoreOptions o;
  o.dim = D;
  o.metric = 0;
  o.fsync = FsyncMode::Never;
  o.flat_limit = flat_limit;
  {
    Store s(path, o);
    std::vector<std::vector<float>> vecs(60, std::vector<float>(D));
    std::vector<NewItem> items;
    for (int i = 0; i < 20; ++i) {  // 20 topics, each followed by two turns
      NewItem t;
      t.summary = "topic " + std::to_string(i);
      t.turns_json = "[]";
      t.meta_json = "{}";
      for (auto& v : vecs[3 * i]) v = rnd();
      t.embedding = vecs[3 * i].data();
      items.push_back(t);
      int64_t topic_index = static_cast<int64_t>(items.size()) - 1;
      for (int j = 1; j <= 2; ++j) {
        NewItem c;
        c.level = kTurn;
        c.parent = -2 - topic_index;
        c.summary = "turn " + std::to_string(j);
        c.turns_json = "[]";
        c.meta_json = "{}";
        for (auto& v : vecs[3 * i + j]) v = rnd();
        c.embedding = vecs[3 * i + j].data();
        items.push_back(c);
      }
    }
    std::vector<int64_t> ids = s.add("user", items);
    CHECK_EQ(ids.size(), size_t(60));
    std::string merged = "merged";
    std::vector<float> nv(D, 0.25f);
    s.new_version(ids[0], VersionOp::Merge, &merged, nv.data(), nullptr, nullptr, {}, nullptr);
    s.invalidate(ids[3], "stale");
    s.remove(ids[6]);
    s.snapshot();
    CHECK_EQ(s.generation(), uint64_t(1));
    CHECK_EQ(s.index_kind("user", kTopic), std::string(kind));
    before = look(s, q, 3);
    s.close();
  }
  Store s(path, StoreOptions{});
  CHECK_EQ(s.replayed_entries(), uint64_t(0));  // everything came from the snapshot
  CHECK_EQ(s.dim(), D);
  CHECK_EQ(s.index_kind("user", kTopic), std::string(kind));
  Seen after = look(s, q, 3);
  CHECK(before == after);
  CHECK_EQ(after.ids.size(), size_t(57));  // 60 - a deleted topic and its two turns
  CHECK_THROWS(s.get(6), KeyError, "was deleted");
  CHECK_EQ(s.get(0).rec.summary, std::string("merged"));
  CHECK(s.get(4).rec.status == Status::Invalidated);  // a turn of the invalidated topic 3
}

}  // namespace

TEST(snapshot, store_round_trip_flat) { store_round_trip(kDefaultFlatLimit, "flat"); }

TEST(snapshot, store_round_trip_hnsw) { store_round_trip(0, "hnsw"); }
