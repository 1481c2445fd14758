// The pybind11 module memkern._store: one register_* function per bound class, and the
// translation of native exceptions to memkern.errors classes.
#include <pybind11/pybind11.h>

#include <cstring>

#include "memkern/errors.h"

namespace py = pybind11;

void register_records(py::module_& m);
void register_store(py::module_& m);
void register_lexical(py::module_& m);
void register_rerank(py::module_& m);

namespace {
// Messages may quote stored text (namespace names): decode leniently so a damaged name can never
// turn the error into a UnicodeDecodeError.
void set_error(PyObject* type, const char* msg) {
  PyObject* text = PyUnicode_DecodeUTF8(msg, static_cast<Py_ssize_t>(std::strlen(msg)), "replace");
  if (!text) {
    PyErr_Clear();
    PyErr_SetString(type, "memkern store error (message not decodable)");
    return;
  }
  PyErr_SetObject(type, text);
  Py_DECREF(text);
}
}  // namespace

PYBIND11_MODULE(_store, m) {
  m.doc() = "memkern native memory store (HNSW indexes + topic records)";
  py::module_ errors = py::module_::import("memkern.errors");
  // Kept alive for the interpreter's lifetime by the module attributes below.
  m.attr("_StoreCorruptedError") = errors.attr("StoreCorruptedError");
  m.attr("_MemkernKeyError") = errors.attr("MemkernKeyError");
  m.attr("_MemkernValueError") = errors.attr("MemkernValueError");
  m.attr("_MemkernError") = errors.attr("MemkernError");
  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    py::module_ mod = py::module_::import("memkern._store");
    try {
      std::rethrow_exception(p);
    } catch (const memkern::CorruptedError& e) {
      set_error(mod.attr("_StoreCorruptedError").ptr(), e.what());
    } catch (const memkern::KeyError& e) {
      set_error(mod.attr("_MemkernKeyError").ptr(), e.what());
    } catch (const memkern::ValueError& e) {
      set_error(mod.attr("_MemkernValueError").ptr(), e.what());
    } catch (const memkern::IOError& e) {
      set_error(mod.attr("_MemkernError").ptr(), e.what());
    }
  });
  register_records(m);  // the enums and record classes the Store's methods take and return
  register_store(m);
  register_lexical(m);
  register_rerank(m);  // the reranker's fused CPU path (memkern.score.ops.native)
}
