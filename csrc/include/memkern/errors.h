// C++ exceptions of the native store; the bindings translate them to memkern.errors classes.
#pragma once
#include <stdexcept>
#include <string>

namespace memkern {

// A store file is corrupted, truncated, of another format version, or has a bad header.
struct CorruptedError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// An id (or namespace) that the store does not hold.
struct KeyError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A well-typed argument with a bad value (dim, metric, state of a record, ...).
struct ValueError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Operating-system level failure (open, write, fsync, lock held by another process).
struct IOError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace memkern
