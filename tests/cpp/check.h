// A tiny test harness for the C++ unit tests (no third-party framework): TEST(suite, name)
// registers a test, CHECK* record failures without stopping the test, CHECK_THROWS expects an
// exception of a type whose what() contains a text. main.cpp runs the tests of one suite (the
// ctest entry) or all of them, and exits nonzero when any check failed.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace memkern_test {

struct Case {
  const char* suite;
  const char* name;
  std::function<void()> fn;
};

inline std::vector<Case>& registry() {
  static std::vector<Case> r;
  return r;
}

inline int& failures() {
  static int n = 0;
  return n;
}

struct Register {
  Register(const char* suite, const char* name, std::function<void()> fn) {
    registry().push_back({suite, name, std::move(fn)});
  }
};

inline void fail(const char* file, int line, const std::string& what) {
  ++failures();
  std::fprintf(stderr, "%s:%d: FAILED: %s\n", file, line, what.c_str());
}

template <typename T>
std::string show(const T& v) {
  std::ostringstream o;
  o << v;
  return o.str();
}
inline std::string show(const std::string& s) { return "\"" + s + "\" (" + std::to_string(s.size()) + " bytes)"; }
inline std::string show(uint8_t v) { return std::to_string(static_cast<int>(v)); }

// A fresh empty directory under $TMPDIR (or /tmp), removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/memkern-cpp-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data())) {
      std::perror("mkdtemp");
      std::exit(2);
    }
    path_ = buf.data();
  }
  ~TempDir() {
    std::string cmd = "rm -rf '" + path_ + "'";
    if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", path_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace memkern_test

#define MK_CAT2(a, b) a##b
#define MK_CAT(a, b) MK_CAT2(a, b)
#define TEST(suite, name)                                                                              \
  static void MK_CAT(test_##suite##_, name)();                                                         \
  static ::memkern_test::Register MK_CAT(reg_##suite##_, name)(#suite, #name, MK_CAT(test_##suite##_, name)); \
  static void MK_CAT(test_##suite##_, name)()

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) ::memkern_test::fail(__FILE__, __LINE__, "CHECK(" #cond ")"); \
  } while (0)

#define CHECK_EQ(a, b)                                                                                  \
  do {                                                                                                  \
    const auto& mk_a_ = (a);                                                                            \
    const auto& mk_b_ = (b);                                                                            \
    if (!(mk_a_ == mk_b_))                                                                              \
      ::memkern_test::fail(__FILE__, __LINE__,                                                          \
                           "CHECK_EQ(" #a ", " #b "): " + ::memkern_test::show(mk_a_) + " != " +        \
                               ::memkern_test::show(mk_b_));                                            \
  } while (0)

// Expects `expr` to throw `Type` whose what() contains `text`.
#define CHECK_THROWS(expr, Type, text)                                                                  \
  do {                                                                                                  \
    bool mk_thrown_ = false;                                                                            \
    try {                                                                                               \
      (void)(expr);                                                                                     \
    } catch (const Type& e) {                                                                           \
      mk_thrown_ = true;                                                                                \
      if (std::string(e.what()).find(text) == std::string::npos)                                        \
        ::memkern_test::fail(__FILE__, __LINE__,                                                        \
                             "CHECK_THROWS(" #expr "): message \"" + std::string(e.what()) +             \
                                 "\" lacks \"" + std::string(text) + "\"");                             \
    } catch (const std::exception& e) {                                                                 \
      mk_thrown_ = true;                                                                                \
      ::memkern_test::fail(__FILE__, __LINE__,                                                          \
                           "CHECK_THROWS(" #expr "): wrong exception type: " + std::string(e.what()));  \
    }                                                                                                   \
    if (!mk_thrown_) ::memkern_test::fail(__FILE__, __LINE__, "CHECK_THROWS(" #expr "): nothing thrown"); \
  } while (0)
