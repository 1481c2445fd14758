// Metadata filters and time ranges evaluated INSIDE a search: one compiled predicate, used as an
// hnswlib BaseFilterFunctor by HnswIndex (the graph search keeps walking until it has enough
// allowed points), as the FlatIndex scan's predicate, and as the BM25 candidates' check.
//
// Filterable metadata: the top-level scalar values of a record's meta JSON (strings, numbers,
// booleans; nested objects / arrays and null are not filterable). They are parsed from meta_json
// in C++ whenever a record is applied (write, log replay, snapshot load), so nothing extra is
// persisted: the canonical map is derived state, like the BM25 index.
//
// Canonical value (JSON equality: 1 == 1.0, true != 1, "1" != 1):
//   string  's' + its UTF-8 bytes (JSON escapes decoded)
//   number  'n' + the 8 little-endian bytes of the IEEE double nearest to it (-0.0 read as 0.0)
//   bool    'b1' / 'b0'
// memkern/store.py encodes a filter's values the same way (_canonical_filter_value).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <climits>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <hnswlib/hnswlib.h>

#include "memkern/lexical.h"
#include "memkern/record.h"

namespace memkern {

// Sorted by key; one entry per top-level scalar key.
using MetaScalars = std::vector<std::pair<std::string, std::string>>;

namespace detail {

struct JsonScan {
  const std::string& s;
  size_t i = 0;
  bool ok = true;

  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
  }
  bool hex4(uint32_t* v) {
    if (i + 4 > s.size()) return false;
    uint32_t r = 0;
    for (int j = 0; j < 4; ++j) {
      char c = s[i + j];
      r <<= 4;
      if (c >= '0' && c <= '9') r |= c - '0';
      else if (c >= 'a' && c <= 'f') r |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') r |= c - 'A' + 10;
      else return false;
    }
    i += 4;
    *v = r;
    return true;
  }
  // At '"': the decoded string.
  bool str(std::string* out) {
    ++i;
    while (i < s.size()) {
      char c = s[i];
      if (c == '"') {
        ++i;
        return true;
      }
      if (c != '\\') {
        out->push_back(c);
        ++i;
        continue;
      }
      if (++i >= s.size()) return false;
      char e = s[i++];
      switch (e) {
        case '"': out->push_back('"'); break;
        case '\\': out->push_back('\\'); break;
        case '/': out->push_back('/'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          uint32_t v;
          if (!hex4(&v)) return false;
          if (v >= 0xD800 && v <= 0xDBFF && i + 6 <= s.size() && s[i] == '\\' && s[i + 1] == 'u') {
            size_t save = i;
            i += 2;
            uint32_t lo;
            if (hex4(&lo) && lo >= 0xDC00 && lo <= 0xDFFF) {
              v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
            } else {
              i = save;
            }
          }
          lexical::append_utf8(*out, v);
          break;
        }
        default: return false;
      }
    }
    return false;
  }
  // Skips any JSON value (bounded nesting: meta is checked <= 32 deep when written).
  bool skip(int depth) {
    if (depth > 64) return false;
    ws();
    if (i >= s.size()) return false;
    char c = s[i];
    if (c == '"') {
      std::string tmp;
      return str(&tmp);
    }
    if (c == '{' || c == '[') {
      char close = c == '{' ? '}' : ']';
      ++i;
      ws();
      if (i < s.size() && s[i] == close) {
        ++i;
        return true;
      }
      while (true) {
        if (c == '{') {
          ws();
          if (i >= s.size() || s[i] != '"') return false;
          std::string tmp;
          if (!str(&tmp)) return false;
          ws();
          if (i >= s.size() || s[i] != ':') return false;
          ++i;
        }
        if (!skip(depth + 1)) return false;
        ws();
        if (i >= s.size()) return false;
        if (s[i] == ',') {
          ++i;
          continue;
        }
        if (s[i] == close) {
          ++i;
          return true;
        }
        return false;
      }
    }
    size_t start = i;
    while (i < s.size() && s[i] != ',' && s[i] != '}' && s[i] != ']' && s[i] != ' ' && s[i] != '\n' &&
           s[i] != '\t' && s[i] != '\r')
      ++i;
    return i > start;
  }
};

inline std::string canonical_number(double d) {
  if (d == 0.0) d = 0.0;  // -0.0 == 0.0
  std::string out("n");
  char b[8];
  std::memcpy(b, &d, 8);  // little-endian hosts only (x86-64, aarch64)
  out.append(b, 8);
  return out;
}

}  // namespace detail

// Top-level scalars of a meta JSON object (see the file comment). Malformed text (never written
// by the store) gives an empty map.
inline MetaScalars parse_meta_scalars(const std::string& json) {
  MetaScalars out;
  detail::JsonScan sc{json};
  sc.ws();
  if (sc.i >= json.size() || json[sc.i] != '{') return out;
  ++sc.i;
  sc.ws();
  if (sc.i < json.size() && json[sc.i] == '}') return out;
  while (sc.i < json.size()) {
    sc.ws();
    if (sc.i >= json.size() || json[sc.i] != '"') return {};
    std::string key;
    if (!sc.str(&key)) return {};
    sc.ws();
    if (sc.i >= json.size() || json[sc.i] != ':') return {};
    ++sc.i;
    sc.ws();
    if (sc.i >= json.size()) return {};
    char c = json[sc.i];
    if (c == '"') {
      std::string v("s");
      if (!sc.str(&v)) return {};
      out.emplace_back(std::move(key), std::move(v));
    } else if (c == 't' && json.compare(sc.i, 4, "true") == 0) {
      sc.i += 4;
      out.emplace_back(std::move(key), "b1");
    } else if (c == 'f' && json.compare(sc.i, 5, "false") == 0) {
      sc.i += 5;
      out.emplace_back(std::move(key), "b0");
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      size_t start = sc.i;
      while (sc.i < json.size() && (std::strchr("+-.eE", json[sc.i]) || (json[sc.i] >= '0' && json[sc.i] <= '9')))
        ++sc.i;
      std::string num = json.substr(start, sc.i - start);
      char* end = nullptr;
      double d = std::strtod(num.c_str(), &end);  // correctly rounded, like Python's float()
      if (end != num.c_str() + num.size()) return {};
      out.emplace_back(std::move(key), detail::canonical_number(d));
    } else {
      if (!sc.skip(0)) return {};  // null, object, array: not filterable
    }
    sc.ws();
    if (sc.i < json.size() && json[sc.i] == ',') {
      ++sc.i;
      continue;
    }
    if (sc.i < json.size() && json[sc.i] == '}') break;
    return {};
  }
  std::sort(out.begin(), out.end());
  // JSON objects written by Python have unique keys; keep the last of duplicates like json.loads.
  MetaScalars uniq;
  for (auto& kv : out) {
    if (!uniq.empty() && uniq.back().first == kv.first) uniq.back() = std::move(kv);
    else uniq.push_back(std::move(kv));
  }
  return uniq;
}

// One clause of a filter: meta[key] must equal one of `values` (canonical, sorted).
struct FilterClause {
  std::string key;
  std::vector<std::string> values;
};

enum class TimeField : uint8_t { Event = 0, Created = 1, Updated = 2 };

// Everything a search restricts on, besides the (namespace, level) it searches.
struct SearchFilter {
  std::vector<FilterClause> clauses;  // AND of clauses
  bool has_time = false;
  double t_lo = -std::numeric_limits<double>::infinity();  // inclusive
  double t_hi = std::numeric_limits<double>::infinity();   // exclusive
  TimeField time_field = TimeField::Event;

  bool empty() const { return clauses.empty() && !has_time; }

  bool meta_ok(const MetaScalars& m) const {
    for (const auto& c : clauses) {
      auto it = std::lower_bound(m.begin(), m.end(), c.key,
                                 [](const std::pair<std::string, std::string>& kv, const std::string& k) {
                                   return kv.first < k;
                                 });
      if (it == m.end() || it->first != c.key) return false;
      if (!std::binary_search(c.values.begin(), c.values.end(), it->second)) return false;
    }
    return true;
  }
  bool time_ok(double t) const { return !has_time || (t >= t_lo && t < t_hi); }
};

// Inverted index of one (namespace, level)'s filterable meta: (key, canonical value) -> ids. It
// lets a selective filter enumerate its few matching records instead of walking the graph.
class MetaIndex {
 public:
  void put(int64_t id, const MetaScalars& m) {
    for (const auto& kv : m) ids_[slot(kv.first, kv.second)].insert(id);
  }
  void remove(int64_t id, const MetaScalars& m) {
    for (const auto& kv : m) {
      auto it = ids_.find(slot(kv.first, kv.second));
      if (it == ids_.end()) continue;
      it->second.erase(id);
      if (it->second.empty()) ids_.erase(it);
    }
  }
  // Ids holding meta[key] == value (null: none).
  const std::unordered_set<int64_t>* find(const std::string& key, const std::string& value) const {
    auto it = ids_.find(slot(key, value));
    return it == ids_.end() ? nullptr : &it->second;
  }
  // The distinct canonical values of `key` held by any id (one pass over the index's slots, no
  // record is read): e.g. the ingest ledger, the session ids of a namespace's records.
  std::vector<std::string> values(const std::string& key) const {
    std::string prefix = slot(key, "");
    std::vector<std::string> out;
    for (const auto& kv : ids_)
      if (!kv.second.empty() && kv.first.compare(0, prefix.size(), prefix) == 0) out.push_back(kv.first.substr(prefix.size()));
    std::sort(out.begin(), out.end());
    return out;
  }
  size_t count(const FilterClause& c) const {
    size_t n = 0;
    for (const auto& v : c.values)
      if (auto* s = find(c.key, v)) n += s->size();
    return n;
  }
  size_t memory_bytes() const {
    size_t b = 0;
    for (const auto& kv : ids_) b += kv.first.capacity() + 64 + kv.second.size() * 32;
    return b;
  }

 private:
  static std::string slot(const std::string& key, const std::string& value) {
    std::string s = std::to_string(key.size());  // length-prefixed: no two (key, value) pairs collide
    s.push_back(':');
    s.append(key);
    s.append(value);
    return s;
  }
  std::unordered_map<std::string, std::unordered_set<int64_t>> ids_;
};

// The time a filter / recency prior reads: the event time (else created_at), created_at or updated_at.
inline double record_time(const Record& r, TimeField f) {
  switch (f) {
    case TimeField::Created: return r.created_at;
    case TimeField::Updated: return r.updated_at;
    case TimeField::Event: break;
  }
  return std::isnan(r.event_time) ? r.created_at : r.event_time;
}

// Ids of one (namespace, level) ordered by each TimeField's time: a selective time range
// enumerates its few matches instead of walking the graph.
class TimeIndex {
 public:
  void put(const Record& r) {
    for (int f = 0; f < 3; ++f) by_[f].emplace(record_time(r, static_cast<TimeField>(f)), r.id);
  }
  void remove(const Record& r) {
    for (int f = 0; f < 3; ++f) by_[f].erase({record_time(r, static_cast<TimeField>(f)), r.id});
  }
  // Ids with lo <= t < hi, counting at most `cap`.
  size_t count(TimeField f, double lo, double hi, size_t cap) const {
    size_t n = 0;
    const auto& s = by_[static_cast<int>(f)];
    for (auto it = s.lower_bound({lo, INT64_MIN}); it != s.end() && it->first < hi && n < cap; ++it) ++n;
    return n;
  }
  std::vector<int64_t> ids(TimeField f, double lo, double hi) const {
    std::vector<int64_t> out;
    const auto& s = by_[static_cast<int>(f)];
    for (auto it = s.lower_bound({lo, INT64_MIN}); it != s.end() && it->first < hi; ++it) out.push_back(it->second);
    return out;
  }
  size_t memory_bytes() const { return (by_[0].size() + by_[1].size() + by_[2].size()) * 48; }

 private:
  std::set<std::pair<double, int64_t>> by_[3];
};

// hnswlib adapter: `Pred` is any callable bool(int64_t id).
template <class Pred>
class PredicateFunctor : public hnswlib::BaseFilterFunctor {
 public:
  explicit PredicateFunctor(const Pred* p) : p_(p) {}
  bool operator()(hnswlib::labeltype id) override { return (*p_)(static_cast<int64_t>(id)); }

 private:
  const Pred* p_;
};

}  // namespace memkern
