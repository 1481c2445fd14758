// pybind11 binding of the store's tokeniser (memkern/lexical.h) as memkern._store._tokenize, so
// tests can compare it with the Python reference memkern.lexical.tokenize.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "memkern/errors.h"
#include "memkern/lexical.h"

namespace py = pybind11;

void register_lexical(py::module_& m) {
  m.def(
      "_tokenize",
      [](py::object text, bool keep_stop_words) {
        std::string s;
        if (py::isinstance<py::bytes>(text)) {
          s = text.cast<std::string>();
        } else if (py::isinstance<py::str>(text)) {
          PyObject* b = PyUnicode_AsUTF8String(text.ptr());
          if (!b) {
            PyErr_Clear();
            throw memkern::ValueError("text: expected a str encodable as UTF-8 (no lone surrogates)");
          }
          s = py::reinterpret_steal<py::bytes>(b).cast<std::string>();
        } else {
          throw memkern::ValueError("text: expected a str or UTF-8 bytes, got " +
                                    std::string(py::str(py::type::of(text).attr("__name__"))));
        }
        std::vector<std::string> toks;
        {
          py::gil_scoped_release rel;
          toks = memkern::lexical::tokenize(s, "text", keep_stop_words);
        }
        py::list out;
        for (const auto& t : toks) out.append(py::str(t));
        return out;
      },
      py::arg("text"), py::arg("keep_stop_words") = false,
      "Tokens of `text` by the store's C++ tokeniser (twin of memkern.lexical.tokenize; tests).");
}
