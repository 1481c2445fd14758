// Lexical retrieval inside the store: the UTF-8 tokeniser (the exact twin of the Python reference
// memkern.lexical.tokenize, whose module docstring is the specification) and a BM25 inverted
// index of one (namespace, level).
//
// Tokeniser: decode UTF-8 -> lowercase each code point with the fixed table lower_code_point()
// -> class it with kCharClasses (word / ideograph / separator) -> a token is a maximal run of
// word code points or one ideograph -> drop kStopWords. Nothing depends on the C++ locale.
//
// BM25 (k1 = 1.2, b = 0.75): score(d) = sum over the query's distinct terms t of
//   idf(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * |d| / avgdl)),
//   idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5)),
// with N, df and avgdl over every document the index holds (active and invalidated records of the
// namespace level; deleted ones are removed), computed in double.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "memkern/errors.h"

namespace memkern {
namespace lexical {

constexpr double kK1 = 1.2;
constexpr double kB = 0.75;
constexpr uint8_t kSep = 0, kWord = 1, kIdeo = 2;

struct CharRange {
  uint32_t lo, hi;
  uint8_t cls;
};

// Sorted, disjoint, inclusive; everything outside is a separator. Same table as
// memkern.lexical.CHAR_CLASSES (tests/store/test_lexical.py compares the two tokenisers).
inline constexpr CharRange kCharClasses[] = {
    {0x0030, 0x0039, kWord}, {0x0041, 0x005A, kWord}, {0x0061, 0x007A, kWord}, {0x00C0, 0x00D6, kWord},
    {0x00D8, 0x00F6, kWord}, {0x00F8, 0x0373, kWord}, {0x0376, 0x037D, kWord}, {0x037F, 0x037F, kWord},
    {0x0386, 0x0386, kWord}, {0x0388, 0x0481, kWord}, {0x0483, 0x0588, kWord}, {0x058A, 0x05BD, kWord},
    {0x05BF, 0x05BF, kWord}, {0x05C1, 0x05C2, kWord}, {0x05C4, 0x05C5, kWord}, {0x05C7, 0x05F2, kWord},
    {0x05F5, 0x060B, kWord}, {0x060D, 0x061A, kWord}, {0x061C, 0x061E, kWord}, {0x0620, 0x0669, kWord},
    {0x066E, 0x06D3, kWord}, {0x06D5, 0x0963, kWord}, {0x0966, 0x0E4E, kWord}, {0x0E50, 0x0E59, kWord},
    {0x0E5C, 0x10FA, kWord}, {0x10FC, 0x135F, kWord}, {0x1369, 0x166C, kWord}, {0x166F, 0x167F, kWord},
    {0x1681, 0x16EA, kWord}, {0x16EE, 0x17D3, kWord}, {0x17DB, 0x17FF, kWord}, {0x180B, 0x180D, kWord},
    {0x180F, 0x1FFF, kWord}, {0x2C00, 0x2DFF, kWord}, {0x2E80, 0x2FDF, kIdeo}, {0x3041, 0x30FA, kIdeo},
    {0x30FC, 0x30FF, kIdeo}, {0x3100, 0x318F, kWord}, {0x3400, 0x4DBF, kIdeo}, {0x4E00, 0x9FFF, kIdeo},
    {0xA000, 0xABFF, kWord}, {0xAC00, 0xD7FF, kWord}, {0xF900, 0xFAFF, kIdeo}, {0xFB00, 0xFDFF, kWord},
    {0xFE70, 0xFEFE, kWord}, {0xFF10, 0xFF19, kWord}, {0xFF21, 0xFF3A, kWord}, {0xFF41, 0xFF5A, kWord},
    {0xFF66, 0xFF9F, kIdeo}, {0xFFA0, 0xFFDC, kWord}, {0x10000, 0x1CFFF, kWord}, {0x20000, 0x3FFFF, kIdeo},
};

// memkern.lexical.STOP_WORDS, sorted.
inline const std::unordered_set<std::string>& stop_words() {
  static const std::unordered_set<std::string> s = {
      "a", "about", "above", "after", "again", "against", "all", "am", "an", "and", "any", "are",
      "as", "at", "be", "because", "been", "before", "being", "below", "between", "both", "but", "by",
      "can", "could", "d", "did", "do", "does", "doing", "down", "during", "each", "few", "for",
      "from", "further", "had", "has", "have", "having", "he", "her", "here", "hers", "herself",
      "him", "himself", "his", "how", "i", "if", "in", "into", "is", "it", "its", "itself", "just",
      "ll", "m", "me", "more", "most", "my", "myself", "no", "nor", "not", "now", "of", "off", "on",
      "once", "only", "or", "other", "our", "ours", "ourselves", "out", "over", "own", "re", "s",
      "same", "she", "should", "so", "some", "such", "t", "than", "that", "the", "their", "theirs",
      "them", "themselves", "then", "there", "these", "they", "this", "those", "through", "to", "too",
      "under", "until", "up", "ve", "very", "was", "we", "were", "what", "when", "where", "which",
      "while", "who", "whom", "why", "will", "with", "would", "you", "your", "yours", "yourself",
      "yourselves"};
  return s;
}

inline uint32_t lower_code_point(uint32_t c) {
  if (c < 0x80) return (c >= 0x41 && c <= 0x5A) ? c + 0x20 : c;
  if (c <= 0xDE) return (c >= 0xC0 && c != 0xD7) ? c + 0x20 : c;
  if (c >= 0x0100 && c <= 0x017F) {
    if (c == 0x0130) return 0x69;
    if (c == 0x0178) return 0xFF;
    bool even = (c % 2) == 0;
    if (even && (c <= 0x012F || (c >= 0x0132 && c <= 0x0137) || (c >= 0x014A && c <= 0x0177))) return c + 1;
    if (!even && ((c >= 0x0139 && c <= 0x0148) || (c >= 0x0179 && c <= 0x017E))) return c + 1;
    return c;
  }
  if (c >= 0x0386 && c <= 0x03C2) {
    if (c == 0x0386) return 0x03AC;
    if (c >= 0x0388 && c <= 0x038A) return c + 0x25;
    if (c == 0x038C) return 0x03CC;
    if (c >= 0x038E && c <= 0x038F) return c + 0x3F;
    if (c >= 0x0391 && c <= 0x03AB && c != 0x03A2) return c + 0x20;
    if (c == 0x03C2) return 0x03C3;
    return c;
  }
  if (c >= 0x0400 && c <= 0x04FF) {
    if (c <= 0x040F) return c + 0x50;
    if (c <= 0x042F) return c + 0x20;
    if (c == 0x04C0) return 0x04CF;
    bool even = (c % 2) == 0;
    if (even && ((c >= 0x0460 && c <= 0x0481) || (c >= 0x048A && c <= 0x04BF) || c >= 0x04D0)) return c + 1;
    if (!even && c >= 0x04C1 && c <= 0x04CE) return c + 1;
    return c;
  }
  if (c >= 0xFF21 && c <= 0xFF3A) return c + 0x20;
  return c;
}

inline uint8_t char_class(uint32_t c) {
  const CharRange* b = std::begin(kCharClasses);
  const CharRange* e = std::end(kCharClasses);
  const CharRange* it = std::upper_bound(b, e, c, [](uint32_t v, const CharRange& r) { return v < r.lo; });
  if (it == b) return kSep;
  --it;
  return c <= it->hi ? it->cls : kSep;
}

inline void append_utf8(std::string& out, uint32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

// Decodes one code point at s[i] (strict UTF-8: no overlongs, surrogates or values > 0x10FFFF).
// Returns the code point and advances i, or returns UINT32_MAX (i advanced by one byte) for an
// invalid sequence.
inline uint32_t decode_utf8(const std::string& s, size_t& i) {
  const unsigned char* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  unsigned char c0 = p[i];
  if (c0 < 0x80) {
    ++i;
    return c0;
  }
  size_t len;
  uint32_t cp, min;
  if ((c0 & 0xE0) == 0xC0) {
    len = 2, cp = c0 & 0x1F, min = 0x80;
  } else if ((c0 & 0xF0) == 0xE0) {
    len = 3, cp = c0 & 0x0F, min = 0x800;
  } else if ((c0 & 0xF8) == 0xF0) {
    len = 4, cp = c0 & 0x07, min = 0x10000;
  } else {
    ++i;
    return UINT32_MAX;
  }
  if (i + len > n) {
    ++i;
    return UINT32_MAX;
  }
  for (size_t j = 1; j < len; ++j) {
    unsigned char cj = p[i + j];
    if ((cj & 0xC0) != 0x80) {
      ++i;
      return UINT32_MAX;
    }
    cp = (cp << 6) | (cj & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    ++i;
    return UINT32_MAX;
  }
  i += len;
  return cp;
}

// Offset of the first invalid UTF-8 byte of s, or npos when s is valid.
inline size_t invalid_utf8_at(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    size_t at = i;
    if (decode_utf8(s, i) == UINT32_MAX) return at;
  }
  return std::string::npos;
}

// Tokens of UTF-8 text `s` (see the file comment). Invalid UTF-8: with `what` set, ValueError
// naming it; with `what` null (stored text, already validated when it was written) an invalid
// byte is a separator.
inline std::vector<std::string> tokenize(const std::string& s, const char* what = nullptr,
                                         bool keep_stop_words = false) {
  std::vector<std::string> out;
  std::string run;
  const auto& stops = stop_words();
  auto flush = [&]() {
    if (run.empty()) return;
    if (keep_stop_words || !stops.count(run)) out.push_back(run);
    run.clear();
  };
  for (size_t i = 0; i < s.size();) {
    size_t at = i;
    uint32_t c = decode_utf8(s, i);
    if (c == UINT32_MAX) {
      if (what) throw ValueError(std::string(what) + ": expected valid UTF-8 text, got an invalid byte at offset " +
                                 std::to_string(at));
      flush();
      continue;
    }
    c = lower_code_point(c);
    uint8_t cls = char_class(c);
    if (cls == kWord) {
      append_utf8(run, c);
      continue;
    }
    flush();
    if (cls == kIdeo) {
      std::string one;
      append_utf8(one, c);
      if (keep_stop_words || !stops.count(one)) out.push_back(std::move(one));
    }
  }
  flush();
  return out;
}

// Tokens of the B query texts of a lexical / hybrid search, one list per query: ValueError naming
// `texts` unless there are exactly B, and `texts[b]` for one over `max_bytes` bytes or not UTF-8.
inline std::vector<std::vector<std::string>> tokenize_queries(const std::vector<std::string>& texts, size_t B,
                                                              size_t max_bytes) {
  if (texts.size() != B)
    throw ValueError("texts: expected " + std::to_string(B) + " texts (one per query), got " + std::to_string(texts.size()));
  std::vector<std::vector<std::string>> qterms(B);
  for (size_t b = 0; b < B; ++b) {
    if (texts[b].size() > max_bytes)
      throw ValueError("texts[" + std::to_string(b) + "]: expected at most " + std::to_string(max_bytes) +
                       " bytes, got " + std::to_string(texts[b].size()));
    std::string what = "texts[" + std::to_string(b) + "]";
    qterms[b] = tokenize(texts[b], what.c_str());
  }
  return qterms;
}

// BM25 inverted index of one (namespace, level): documents are record ids, their text the
// record's summary. Writer-only mutation (the store's writer lock); search() is const and safe
// for concurrent readers.
class LexicalIndex {
 public:
  // Indexes (or re-indexes) document `id` with the tokens of `text`.
  void put(int64_t id, const std::string& text) {
    remove(id);
    std::vector<std::string> toks = tokenize(text);
    std::unordered_map<uint32_t, uint32_t> tf;
    for (const auto& t : toks) {
      auto it = term_ids_.find(t);
      uint32_t tid;
      if (it == term_ids_.end()) {
        tid = static_cast<uint32_t>(postings_.size());
        term_ids_.emplace(t, tid);
        postings_.emplace_back();
      } else {
        tid = it->second;
      }
      ++tf[tid];
    }
    Doc d;
    d.len = static_cast<uint32_t>(toks.size());
    d.terms.reserve(tf.size());
    for (const auto& kv : tf) {
      postings_[kv.first].push_back({id, kv.second, static_cast<uint32_t>(toks.size())});
      d.terms.push_back(kv.first);
    }
    total_len_ += d.len;
    docs_.emplace(id, std::move(d));
  }

  void remove(int64_t id) {
    auto it = docs_.find(id);
    if (it == docs_.end()) return;
    for (uint32_t tid : it->second.terms) {
      auto& pl = postings_[tid];
      for (size_t j = 0; j < pl.size(); ++j) {
        if (pl[j].id == id) {
          pl[j] = pl.back();
          pl.pop_back();
          break;
        }
      }
    }
    total_len_ -= it->second.len;
    docs_.erase(it);
  }

  bool contains(int64_t id) const { return docs_.count(id) != 0; }
  size_t size() const { return docs_.size(); }
  size_t terms() const { return term_ids_.size(); }

  // Top `k` documents by BM25 for the distinct `terms` among those `allow(id)` accepts:
  // (score, id), score descending then id ascending; only documents holding a query term.
  template <class Allow>
  std::vector<std::pair<double, int64_t>> search(const std::vector<std::string>& terms, size_t k,
                                                 Allow&& allow) const {
    std::vector<std::pair<double, int64_t>> out;
    if (docs_.empty() || k == 0 || total_len_ == 0) return out;
    double N = static_cast<double>(docs_.size());
    double avgdl = static_cast<double>(total_len_) / N;
    std::unordered_map<int64_t, double> acc;
    std::unordered_set<std::string> seen;
    for (const auto& t : terms) {
      if (!seen.insert(t).second) continue;
      auto it = term_ids_.find(t);
      if (it == term_ids_.end()) continue;
      const auto& pl = postings_[it->second];
      if (pl.empty()) continue;
      double df = static_cast<double>(pl.size());
      double idf = std::log(1.0 + (N - df + 0.5) / (df + 0.5));
      for (const auto& p : pl) {
        double tf = static_cast<double>(p.tf);
        double len = static_cast<double>(p.len);
        acc[p.id] += idf * tf * (kK1 + 1.0) / (tf + kK1 * (1.0 - kB + kB * len / avgdl));
      }
    }
    out.reserve(acc.size());
    for (const auto& kv : acc)
      if (allow(kv.first)) out.emplace_back(kv.second, kv.first);
    size_t m = std::min(k, out.size());
    auto better = [](const std::pair<double, int64_t>& a, const std::pair<double, int64_t>& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    std::partial_sort(out.begin(), out.begin() + m, out.end(), better);
    out.resize(m);
    return out;
  }

  // Top `k` documents by idf-weighted query-term coverage among those `allow(id)` accepts:
  //   coverage(d) = sum of idf(t) over the distinct query terms t that d holds
  //                 / sum of idf(t) over all the distinct query terms,
  // idf as in BM25 (a term no document holds has df = 0: it counts in the denominator only).
  // In [0, 1]; no term frequency and no length normalisation, so a short document that only
  // shares a name with the query does not outrank a long one that shares the name and more.
  // (score, id), score descending then id ascending; only documents holding a query term.
  template <class Allow>
  std::vector<std::pair<double, int64_t>> coverage(const std::vector<std::string>& terms, size_t k,
                                                   Allow&& allow) const {
    std::vector<std::pair<double, int64_t>> out;
    if (docs_.empty() || k == 0) return out;
    double N = static_cast<double>(docs_.size());
    std::unordered_map<int64_t, double> acc;
    std::unordered_set<std::string> seen;
    double total = 0.0;
    for (const auto& t : terms) {
      if (!seen.insert(t).second) continue;
      auto it = term_ids_.find(t);
      const std::vector<Posting>* pl = it == term_ids_.end() ? nullptr : &postings_[it->second];
      double df = pl ? static_cast<double>(pl->size()) : 0.0;
      double term_idf = std::log(1.0 + (N - df + 0.5) / (df + 0.5));  // BM25's idf
      total += term_idf;
      if (pl)
        for (const auto& p : *pl) acc[p.id] += term_idf;
    }
    if (!(total > 0.0)) return out;
    out.reserve(acc.size());
    for (const auto& kv : acc)
      if (allow(kv.first)) out.emplace_back(kv.second / total, kv.first);
    size_t m = std::min(k, out.size());
    auto better = [](const std::pair<double, int64_t>& a, const std::pair<double, int64_t>& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    std::partial_sort(out.begin(), out.begin() + m, out.end(), better);
    out.resize(m);
    return out;
  }

  size_t memory_bytes() const {
    size_t b = docs_.size() * (sizeof(int64_t) + sizeof(Doc) + 32);
    for (const auto& kv : docs_) b += kv.second.terms.capacity() * sizeof(uint32_t);
    for (const auto& pl : postings_) b += pl.capacity() * sizeof(Posting) + sizeof(pl);
    for (const auto& kv : term_ids_) b += kv.first.capacity() + 48;
    return b;
  }

 private:
  struct Posting {
    int64_t id;
    uint32_t tf;   // occurrences of the term in the document
    uint32_t len;  // the document's length in tokens (a copy: no lookup while scoring)
  };
  struct Doc {
    uint32_t len = 0;
    std::vector<uint32_t> terms;  // distinct term ids
  };
  std::unordered_map<std::string, uint32_t> term_ids_;
  std::vector<std::vector<Posting>> postings_;  // by term id
  std::unordered_map<int64_t, Doc> docs_;
  uint64_t total_len_ = 0;
};

}  // namespace lexical
}  // namespace memkern
