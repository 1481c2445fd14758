// The store with persistence off (StoreOptions::in_memory): every operation (add with turns,
// new_version, invalidate, remove, import_records, compact, search, flush, snapshot, close) creates
// no file in the working directory and issues no write / fsync / rename, and the store reads back
// exactly as a disk store fed the same calls.
#include <dirent.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "check.h"
#include "memkern/errors.h"
#include "memkern/io.h"
#include "memkern/store.h"

using namespace memkern;

namespace {

constexpr uint32_t D = 8;

struct View {
  std::vector<int64_t> ids, children, hits;
  std::vector<std::string> summaries;
  std::vector<uint32_t> versions;
  std::vector<int> status;
  std::vector<float> vectors;
  bool operator==(const View& o) const {
    return ids == o.ids && children == o.children && hits == o.hits && summaries == o.summaries &&
           versions == o.versions && status == o.status && vectors == o.vectors;
  }
};

size_t entries(const std::string& dir) {
  size_t n = 0;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return SIZE_MAX;
  while (dirent* e = ::readdir(d))
    if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") ++n;
  ::closedir(d);
  return n;
}

// The same calls on either store; returns what it reads back.
View session(Store& s) {
  uint32_t x = 11;
  auto rnd = [&]() {
    x = x * 1664525u + 1013904223u;
    return static_cast<float>(x >> 8) / 16777216.0f - 0.5f;
  };
  std::vector<std::vector<float>> vecs(45, std::vector<float>(D));
  for (auto& v : vecs)
    for (auto& f : v) f = rnd();
  std::vector<NewItem> items;
  for (int i = 0; i < 15; ++i) {
    NewItem t;
    t.summary = "topic " + std::to_string(i);
    t.turns_json = "[]";
    t.meta_json = "{\"k\":" + std::to_string(i % 3) + "}";
    t.embedding = vecs[3 * i].data();
    items.push_back(t);
    int64_t ti = static_cast<int64_t>(items.size()) - 1;
    for (int j = 1; j <= 2; ++j) {
      NewItem c;
      c.level = kTurn;
      c.parent = -2 - ti;
      c.summary = "turn " + std::to_string(j) + " of " + std::to_string(i);
      c.turns_json = "[]";
      c.meta_json = "{}";
      c.embedding = vecs[3 * i + j].data();
      c.event_time = 1000.0 * i + j;
      items.push_back(c);
    }
  }
  std::vector<int64_t> ids = s.add("user", items);
  std::string merged = "merged";
  std::vector<float> nv(D, 0.25f);
  s.new_version(ids[0], VersionOp::Merge, &merged, nv.data(), nullptr, nullptr, {}, nullptr);
  s.invalidate(ids[3], "stale");
  s.remove(ids[6]);
  CHECK_THROWS(s.remove(ids[6]), KeyError, "was deleted");
  ImportItem im;  // a record with its own id, outside the store's range [0, 1000)
  im.rec.id = 5000;
  im.rec.summary = "imported";
  im.rec.turns_json = "[]";
  im.rec.meta_json = "{}";
  im.rec.created_at = im.rec.updated_at = 1.0;
  im.embedding.assign(D, 0.5f);
  s.import_records("user", {im});
  s.remove(5000);
  CHECK_THROWS(s.import_records("user", {im}), KeyError, "compact() it first");
  s.flush();
  s.snapshot();
  s.compact();
  s.import_records("user", {im});  // compact forgot the deleted id (both modes)
  View out;
  for (uint8_t level : {uint8_t(kTopic), uint8_t(kTurn)})
    for (int64_t id : s.ids("user", true, level)) out.ids.push_back(id);
  for (int64_t id : out.ids) {
    RecordView v = s.get(id);
    out.summaries.push_back(v.rec.summary);
    out.versions.push_back(v.rec.version);
    out.status.push_back(static_cast<int>(v.rec.status));
    out.children.insert(out.children.end(), v.rec.children.begin(), v.rec.children.end());
    out.vectors.insert(out.vectors.end(), v.embedding.begin(), v.embedding.end());
    out.versions.push_back(static_cast<uint32_t>(s.history(id).size()));
  }
  std::vector<float> q(vecs[9].begin(), vecs[9].end());
  q.insert(q.end(), vecs[20].begin(), vecs[20].end());
  SearchResult r = s.search("user", q.data(), 2, 5, 50, false, kTopic);
  out.hits = r.ids;
  SearchResult t = s.search_turn_topic("user", q.data(), 2, 5, 50, true, 0.5f, 10);
  out.hits.insert(out.hits.end(), t.ids.begin(), t.ids.end());
  return out;
}

StoreOptions options(bool memory, uint64_t flat_limit) {
  StoreOptions o;
  o.dim = D;
  o.metric = 0;
  o.fsync = FsyncMode::Never;
  o.flat_limit = flat_limit;
  o.id_end = 1000;
  o.in_memory = memory;
  return o;
}

void same_as_disk(uint64_t flat_limit) {
  memkern_test::TempDir disk_dir, work;
  View on_disk;
  {
    Store s(disk_dir.path() + "/store", options(false, flat_limit));
    on_disk = session(s);
    s.close();
  }
  char old_cwd[4096];
  CHECK(::getcwd(old_cwd, sizeof old_cwd) != nullptr);
  CHECK_EQ(::chdir(work.path().c_str()), 0);
  const io::Counters before = io::counters();
  View in_memory;
  {
    Store s("ignored", options(true, flat_limit));
    CHECK(s.in_memory());
    CHECK_EQ(s.path(), std::string());
    CHECK(s.log_files().empty());
    in_memory = session(s);
    s.close();
    s.close();
    CHECK_THROWS(s.flush(), ValueError, "in-memory store is closed");
  }
  const io::Counters after = io::counters();
  CHECK_EQ(::chdir(old_cwd), 0);
  CHECK_EQ(after.writes, before.writes);
  CHECK_EQ(after.syncs, before.syncs);
  CHECK_EQ(after.renames, before.renames);
  CHECK_EQ(entries(work.path()), size_t(0));
  CHECK(entries(disk_dir.path() + "/store") > 0);  // the check can see files
  CHECK(in_memory == on_disk);
  CHECK_EQ(in_memory.ids.size(), size_t(43));  // 45 - a deleted topic and its two turns + 1 imported
}

}  // namespace

TEST(store_memory, flat_no_file_same_as_disk) { same_as_disk(1024); }

TEST(store_memory, hnsw_no_file_same_as_disk) { same_as_disk(0); }

TEST(store_memory, needs_dim_and_metric) {
  StoreOptions o;
  o.in_memory = true;
  o.metric = 0;
  CHECK_THROWS(Store("", o), ValueError, "in-memory store needs dim");
  o.dim = 4;
  o.metric = -1;
  CHECK_THROWS(Store("", o), ValueError, "needs a metric");
  o.metric = 0;
  o.M = 1;
  CHECK_THROWS(Store("", o), ValueError, "M: expected");
}
