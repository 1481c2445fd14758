// Runs the tests of the suite named by argv[1] (every suite without an argument); ctest runs one
// process per suite (tests/cpp/CMakeLists.txt). Exit status 1 when a check failed, 2 when the suite
// is unknown (a typo in CMakeLists must not pass as "no failures").
#include <cstring>
#include <exception>

#include "check.h"

int main(int argc, char** argv) {
  using namespace memkern_test;
  const char* only = argc > 1 ? argv[1] : nullptr;
  int ran = 0;
  for (const Case& c : registry()) {
    if (only && std::strcmp(only, c.suite) != 0) continue;
    int before = failures();
    try {
      c.fn();
    } catch (const std::exception& e) {
      fail(c.suite, 0, std::string(c.name) + ": unexpected exception: " + e.what());
    }
    std::printf("%s %s.%s\n", failures() == before ? "ok  " : "FAIL", c.suite, c.name);
    ++ran;
  }
  if (ran == 0) {
    std::fprintf(stderr, "no tests in suite %s\n", only ? only : "(all)");
    return 2;
  }
  std::printf("%d tests, %d failed checks\n", ran, failures());
  return failures() == 0 ? 0 : 1;
}
