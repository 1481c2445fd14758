// The log file (wal.h framing + log_codec.h payloads) in a temp dir: entries written with
// Wal::append come back intact with their sync watermarks; whatever a crash can leave past the
// last completed sync (a cut at any byte, zeroed or stale pages, pages persisted in any subset and
// order, for every split point between synced and unsynced entries) is cut back to a prefix that
// keeps every synced entry, never refused; damage to synced bytes that a later entry proves is
// refused (CorruptedError), as is a bad file header.
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "memkern/errors.h"
#include "memkern/log_codec.h"
#include "memkern/wal.h"

using namespace memkern;

namespace {

constexpr uint32_t kDim = 2;
constexpr size_t kPage = 4096;

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
  std::vector<uint64_t> ends;      // file offset after each entry (ends[0]: after the header)
  std::vector<std::string> items;  // the payloads
};

// A log of `payloads`; `synced` of them (the first ones) are each followed by a sync, like writes
// under fsync "always", the rest are appended without one (in flight when a crash comes).
Log make_log(const std::string& dir, const std::vector<std::string>& payloads, size_t synced) {
  WalHeader h;
  h.dim = kDim;
  h.metric = 0;
  h.generation = 3;
  h.store_id = 0xABCDEF;
  Wal::create(dir, "wal.log", h);
  Log log{dir + "/wal.log", {}, payloads};
  log.ends.push_back(bytes_of(log.file).size());
  Wal w;
  w.open_append(log.file, true);
  for (size_t i = 0; i < payloads.size(); ++i) {
    w.append(payloads[i]);
    if (i < synced) w.sync();
    log.ends.push_back(w.end());
  }
  w.close();
  return log;
}

Log make_log(const std::string& dir, int n) {
  std::vector<std::string> p;
  for (int i = 0; i < n; ++i) p.push_back(payload(i));
  return make_log(dir, p, static_cast<size_t>(n));
}

struct Read {
  bool threw = false;
  std::string what;
  std::vector<std::string> entries;
  WalScan scan;
};

Read read_log(const std::string& file) {
  Read r;
  try {
    Wal::read(file, &r.entries, &r.scan);
  } catch (const CorruptedError& e) {
    r.threw = true;
    r.what = e.what();
  }
  return r;
}

}  // namespace

TEST(wal, entries_round_trip_through_the_file) {
  memkern_test::TempDir d;
  Log log = make_log(d.path(), 3);
  CHECK_EQ(log.ends[0], uint64_t(kWalHeaderSize));  // the documented header size
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
  const std::string data = bytes_of(log.file);
  for (size_t i = 0; i < entries.size(); ++i) {
    CHECK(entries[i] == payload(static_cast<int64_t>(i)));
    // u32 len, u32 crc, u64 synced, u32 header crc: every entry of an fsync-"always" log was
    // written with everything before it synced.
    CHECK_EQ(log.ends[i + 1] - log.ends[i], uint64_t(20 + entries[i].size()));
    uint64_t synced;
    std::memcpy(&synced, data.data() + log.ends[i] + 8, 8);
    CHECK_EQ(synced, log.ends[i]);
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
    Read r = read_log(log.file);
    if (r.threw || !r.scan.torn || r.entries.size() != 2 || r.scan.good_end != end2) {
      CHECK(!r.threw);
      CHECK(r.scan.torn);
      CHECK_EQ(r.entries.size(), size_t(2));
      CHECK_EQ(r.scan.good_end, end2);
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
  Read r = read_log(log.file);
  CHECK(!r.scan.torn);
  CHECK(r.entries.size() == 3 && r.entries[2] == payload(9));
}

TEST(wal, a_zero_tail_is_torn_not_damage) {
  memkern_test::TempDir d;
  Log log = make_log(d.path(), 2);
  write_bytes(log.file, bytes_of(log.file) + std::string(4096, '\0'));
  Read r = read_log(log.file);
  CHECK(!r.threw && r.scan.torn);
  CHECK_EQ(r.entries.size(), size_t(2));
  CHECK_EQ(r.scan.good_end, log.ends[2]);
}

TEST(wal, damage_that_a_later_entry_proves_synced_is_refused_the_last_entry_is_cut) {
  memkern_test::TempDir d;
  Log log = make_log(d.path(), 4);
  const std::string full = bytes_of(log.file);
  for (int entry = 1; entry <= 4; ++entry) {
    for (uint64_t at = log.ends[entry - 1]; at < log.ends[entry]; at += 5) {
      std::string bad = full;
      bad[at] ^= 0x40;
      write_bytes(log.file, bad);
      Read r = read_log(log.file);
      if (entry < 4) {
        // Entry 4 was written after entries 1-3 had been synced: their bytes cannot be torn.
        CHECK(r.threw);
        CHECK(r.what.find("synced") != std::string::npos && r.what.find("is damaged") != std::string::npos);
      } else {
        // Nothing records that entry 4 was synced: a torn write leaves the same bytes. Cut back.
        CHECK(!r.threw && r.scan.torn && r.entries.size() == 3 && r.scan.good_end == log.ends[3]);
      }
    }
  }
}

TEST(wal, unsynced_damage_is_a_torn_tail_wherever_it_starts) {
  // fsync "batch" / "never": entries 2-5 appended after the last sync; damage in any of them
  // (pages persisted out of order) keeps the prefix before it and is never refused.
  memkern_test::TempDir d;
  std::vector<std::string> p;
  for (int i = 0; i < 5; ++i) p.push_back(payload(i));
  Log log = make_log(d.path(), p, 1);
  const std::string full = bytes_of(log.file);
  for (int entry = 2; entry <= 5; ++entry) {
    for (uint64_t at = log.ends[entry - 1]; at < log.ends[entry]; at += 7) {
      std::string bad = full;
      bad[at] ^= 0x10;
      write_bytes(log.file, bad);
      Read r = read_log(log.file);
      CHECK(!r.threw && r.scan.torn);
      CHECK_EQ(r.entries.size(), size_t(entry - 1));
    }
  }
}

TEST(wal, page_level_persistence_of_the_unsynced_tail_for_every_split_point) {
  // A crash while entries past the last sync were being written: each 4 KiB page of the file that
  // holds bytes past the sync point reached the disk or not (any subset: any persistence order),
  // a page that did not holds its state at the sync (zeros past the synced end, or a file
  // system's stale blocks), and the file size is the final one, the synced one, or a page
  // boundary between. For every split point (how many entries were synced), every image must
  // read as a prefix of what was written that keeps every synced entry.
  memkern_test::TempDir d;
  std::mt19937_64 rng(7);
  std::vector<std::string> p;
  for (int i = 0; i < 6; ++i) {  // entries of 1.5-6 KiB: most straddle pages
    std::string s(1500 + rng() % 4500, '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    p.push_back(s);
  }
  size_t images = 0, torn = 0;
  for (size_t synced = 0; synced <= p.size(); ++synced) {
    Log log = make_log(d.path(), p, synced);
    const std::string final_bytes = bytes_of(log.file);
    const uint64_t sync_end = log.ends[synced];  // durable before the crash (the header is synced too)
    const size_t first = sync_end / kPage, pages = (final_bytes.size() + kPage - 1) / kPage;
    const size_t m = pages - first;  // pages holding unsynced bytes
    CHECK(m <= 12);
    for (int stale = 0; stale < 2; ++stale) {
      for (uint64_t mask = 0; mask < (uint64_t(1) << m); ++mask) {
        std::string img = final_bytes;
        for (size_t k = 0; k < m; ++k) {
          if (mask >> k & 1) continue;  // this page reached the disk
          size_t lo = std::max<size_t>((first + k) * kPage, sync_end), hi = std::min(img.size(), (first + k + 1) * kPage);
          for (size_t b = lo; b < hi; ++b) img[b] = stale ? static_cast<char>(rng()) : '\0';
        }
        std::vector<uint64_t> sizes = {img.size(), sync_end};
        if (m > 1) sizes.push_back((first + 1 + mask % (m - 1)) * kPage);
        for (uint64_t size : sizes) {
          if (size < sync_end || size > img.size()) continue;
          write_bytes(log.file, img.substr(0, size));
          Read r = read_log(log.file);
          ++images;
          CHECK(!r.threw);
          if (r.threw) {
            std::fprintf(stderr, "split %zu mask %llu stale %d size %llu: %s\n", synced,
                         static_cast<unsigned long long>(mask), stale, static_cast<unsigned long long>(size),
                         r.what.c_str());
            return;
          }
          CHECK(r.entries.size() >= synced && r.entries.size() <= p.size());
          for (size_t i = 0; i < r.entries.size(); ++i) CHECK(r.entries[i] == p[i]);
          CHECK_EQ(r.scan.good_end, log.ends[r.entries.size()]);
          CHECK_EQ(r.scan.torn, r.scan.good_end != size);
          torn += r.scan.torn;
        }
      }
    }
    ::unlink(log.file.c_str());
  }
  std::printf("%zu crash images, %zu with a torn tail\n", images, torn);
  CHECK(images > 500 && torn > images / 4);
}

TEST(wal, zeroed_synced_pages_are_refused_where_a_later_entry_proves_them) {
  // Every entry synced (fsync "always"): zeroing any page that lies wholly before the last
  // entry's start is damage a later entry's watermark proves (refused, naming the offsets); a page
  // inside the last entry alone reads as that entry torn (documented: nothing written after it
  // records its sync).
  memkern_test::TempDir d;
  std::mt19937_64 rng(3);
  std::vector<std::string> p;
  for (int i = 0; i < 5; ++i) {
    std::string s(5000, '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    p.push_back(s);
  }
  Log log = make_log(d.path(), p, p.size());
  const std::string full = bytes_of(log.file);
  const uint64_t last_start = log.ends[4];
  for (size_t page = 0; page * kPage < full.size(); ++page) {
    size_t lo = std::max<size_t>(page * kPage, kWalHeaderSize), hi = std::min(full.size(), (page + 1) * kPage);
    std::string img = full;
    for (size_t b = lo; b < hi; ++b) img[b] = '\0';
    write_bytes(log.file, img);
    Read r = read_log(log.file);
    if (hi <= last_start) {
      CHECK(r.threw && r.what.find("synced") != std::string::npos);
    } else if (lo >= last_start) {
      CHECK(!r.threw && r.scan.torn && r.entries.size() == 4);
    }
  }
}

TEST(wal, damaged_file_headers_are_refused) {
  memkern_test::TempDir d;
  Log log = make_log(d.path(), 2);
  const std::string full = bytes_of(log.file);
  std::vector<std::string> entries;
  WalScan scan;
  std::string bad = full;
  bad[log.ends[0] + 1] ^= 0x01;  // length field of the first entry: the second one proves it synced
  write_bytes(log.file, bad);
  CHECK_THROWS(Wal::read(log.file, &entries, &scan), CorruptedError, "is damaged (an entry header that fails its checksum)");
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

TEST(wal, a_format_2_log_is_read_and_appended_in_its_own_framing) {
  // Formats 1-2 (12-byte entry framing, no watermark: read as "everything before it synced").
  memkern_test::TempDir d;
  WalHeader h;
  h.format = 2;
  h.dim = kDim;
  Wal::create(d.path(), "wal.log", h);
  const std::string file = d.path() + "/wal.log";
  Wal w;
  w.open_append(file, true);
  for (int i = 0; i < 3; ++i) {
    w.append(payload(i));
    w.sync();
  }
  w.close();
  const std::string full = bytes_of(file);
  CHECK_EQ(full.size(), kWalHeaderSize + 3 * (12 + payload(0).size()));
  Read r = read_log(file);
  CHECK(!r.threw && !r.scan.torn && r.entries.size() == 3 && r.entries[1] == payload(1));
  std::string bad = full;
  bad[kWalHeaderSize + 12 + 3] ^= 1;  // the first entry's payload, with two entries after it
  write_bytes(file, bad);
  CHECK(read_log(file).threw);
  bad = full;
  bad[full.size() - 3] ^= 1;  // the last entry's payload: torn
  write_bytes(file, bad);
  r = read_log(file);
  CHECK(!r.threw && r.scan.torn && r.entries.size() == 2);
}
