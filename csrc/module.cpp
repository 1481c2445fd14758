// The pybind11 module memkern._store: one register_* function per bound class.
#include <pybind11/pybind11.h>

namespace py = pybind11;

PYBIND11_MODULE(_store, m) {
  m.doc() = "memkern native memory store (HNSW indexes + topic records)";
}
