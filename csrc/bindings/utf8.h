// Shared by the bindings: stored text goes to Python decoded strictly; invalid UTF-8 read back
// from disk means a damaged store (StoreCorruptedError), never a UnicodeDecodeError.
#pragma once
#include <pybind11/pybind11.h>

#include <string>

#include "memkern/errors.h"

namespace memkern_py {

inline pybind11::str utf8(const std::string& s, const char* what) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "strict");
  if (!o) {
    PyErr_Clear();
    throw memkern::CorruptedError(std::string("stored ") + what + " is not valid UTF-8");
  }
  return pybind11::reinterpret_steal<pybind11::str>(o);
}

}  // namespace memkern_py
