// pybind11 binding of the typed record contract of memkern._store: the enums Level, Status and Op,
// and the read-only record classes StoredRecord (a record's current state, what get/get_batch
// return) and StoredVersion (one entry of history). memkern.store turns them into the public
// memkern.Record; stored text is decoded (strictly, UTF-8) when a property is read.
#include <cmath>

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "memkern/errors.h"
#include "memkern/record.h"
#include "memkern/store.h"
#include "utf8.h"

namespace py = pybind11;
using memkern_py::utf8;
using memkern::Level;
using memkern::RecordView;
using memkern::Status;
using memkern::Version;
using memkern::VersionOp;

namespace {

// A float32 [n] copy (a later update of the record does not change it).
py::array_t<float> vector_copy(const std::vector<float>& v) { return py::array_t<float>(v.size(), v.data()); }

// The Python objects of an enum's values (Level.topic, ...), looked up once after the enum is
// bound: a property returns the same object every time (no allocation per read; `is` and dict
// lookups by identity work as for Python enums). A byte outside the table (a damaged record) is
// cast to a fresh enum object instead.
template <typename E>
class EnumObjects {
 public:
  void fill(const py::object& cls, std::initializer_list<const char*> names) {
    for (const char* n : names) objs_.push_back(cls.attr(n));
  }
  py::object get(uint8_t value) const {
    if (value < objs_.size()) return objs_[value];
    return py::cast(static_cast<E>(value));
  }

 private:
  std::vector<py::object> objs_;
};

// Kept for the interpreter's lifetime (never destroyed: no Python calls after finalisation).
EnumObjects<Level>& level_objects() {
  static auto* o = new EnumObjects<Level>();
  return *o;
}
EnumObjects<Status>& status_objects() {
  static auto* o = new EnumObjects<Status>();
  return *o;
}
EnumObjects<VersionOp>& op_objects() {
  static auto* o = new EnumObjects<VersionOp>();
  return *o;
}

}  // namespace

void register_records(py::module_& m) {
  auto level = py::enum_<Level>(m, "Level", "Index level of a record: a topic, or a turn linked to its topic.")
                   .value("topic", memkern::kTopic)
                   .value("turn", memkern::kTurn);
  auto status = py::enum_<Status>(m, "Status", "A record's status.")
                    .value("active", Status::Active)
                    .value("invalidated", Status::Invalidated);
  auto op = py::enum_<VersionOp>(m, "Op", "How a version of a record came to be.")
                .value("add", VersionOp::Add)
                .value("merge", VersionOp::Merge)
                .value("update", VersionOp::Update);
  level_objects().fill(level, {"topic", "turn"});  // in value order
  status_objects().fill(status, {"active", "invalidated"});
  op_objects().fill(op, {"add", "merge", "update"});

  py::class_<RecordView>(m, "StoredRecord", "A copy of one record's current state (read-only).")
      .def_property_readonly("id", [](const RecordView& v) { return v.rec.id; })
      .def_property_readonly("namespace", [](const RecordView& v) { return utf8(v.ns_name, "namespace"); })
      .def_property_readonly("level", [](const RecordView& v) { return level_objects().get(v.rec.level); })
      .def_property_readonly("parent", [](const RecordView& v) { return v.rec.parent; },
                             "topic id of a turn record, -1 for a topic")
      .def_property_readonly("status",
                             [](const RecordView& v) { return status_objects().get(static_cast<uint8_t>(v.rec.status)); })
      .def_property_readonly("version", [](const RecordView& v) { return v.rec.version; })
      .def_property_readonly("op", [](const RecordView& v) { return op_objects().get(v.rec.op); })
      .def_property_readonly("created_at", [](const RecordView& v) { return v.rec.created_at; })
      .def_property_readonly("updated_at", [](const RecordView& v) { return v.rec.updated_at; })
      .def_property_readonly("event_time", [](const RecordView& v) -> py::object {
            if (std::isnan(v.rec.event_time)) return py::none();
            return py::float_(v.rec.event_time);
          }, "the conversation's own time (unix seconds), None when the record has none")
      .def_property_readonly("summary", [](const RecordView& v) { return utf8(v.rec.summary, "summary"); })
      .def_property_readonly("turns_json", [](const RecordView& v) { return utf8(v.rec.turns_json, "turns_json"); })
      .def_property_readonly("meta_json", [](const RecordView& v) { return utf8(v.rec.meta_json, "meta_json"); })
      .def_property_readonly("reason", [](const RecordView& v) { return utf8(v.rec.reason, "reason"); })
      .def_property_readonly("children", [](const RecordView& v) { return v.rec.children; },
                             "turn record ids of a topic, oldest first")
      .def_property_readonly("embedding", [](const RecordView& v) { return vector_copy(v.embedding); },
                             "float32 [dim], a copy of the vector when the record was read");

  py::class_<Version>(m, "StoredVersion", "One version of a record (read-only; history() lists them).")
      .def_property_readonly("version", [](const Version& v) { return v.version; })
      .def_property_readonly("op", [](const Version& v) { return op_objects().get(v.op); })
      .def_property_readonly("updated_at", [](const Version& v) { return v.updated_at; })
      .def_property_readonly("summary", [](const Version& v) { return utf8(v.summary, "summary"); })
      .def_property_readonly("turns_json", [](const Version& v) { return utf8(v.turns_json, "turns_json"); })
      .def_property_readonly("meta_json", [](const Version& v) { return utf8(v.meta_json, "meta_json"); })
      .def_property_readonly("embedding", [](const Version& v) { return vector_copy(v.embedding); },
                             "float32 [dim], the vector of this version");
}
