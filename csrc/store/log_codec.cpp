#include "memkern/log_codec.h"

#include <algorithm>

#include "memkern/errors.h"

namespace memkern {

const char* log_op_name(LogOp op) {
  switch (op) {
    case LogOp::Add: return "add";
    case LogOp::Version: return "version";
    case LogOp::Invalidate: return "invalidate";
    case LogOp::Delete: return "delete";
    case LogOp::EventTime: return "event_time";
    case LogOp::Import: return "import";
  }
  return "?";
}

void encode_op_count(Writer& w, uint32_t n_ops) { w.u32(n_ops); }

void encode_add(Writer& w, const std::string& ns, const Record& r, const float* vec, uint32_t dim) {
  w.u8(static_cast<uint8_t>(LogOp::Add));
  w.str(ns);
  write_record_fields(w, r);
  w.floats(vec, dim);
}

void encode_version(Writer& w, int64_t id, VersionOp version_op, const std::string* summary, const float* vec,
                    uint32_t dim, const std::string* turns_json, const std::string* meta_json, double updated_at) {
  w.u8(static_cast<uint8_t>(LogOp::Version));
  w.i64(id);
  w.u8(static_cast<uint8_t>(version_op));
  uint8_t fields = (summary ? kHasSummary : 0) | (vec ? kHasEmbedding : 0) | (turns_json ? kHasTurns : 0) |
                   (meta_json ? kHasMeta : 0);
  w.u8(fields);
  if (summary) w.str(*summary);
  if (vec) w.floats(vec, dim);
  if (turns_json) w.str(*turns_json);
  if (meta_json) w.str(*meta_json);
  w.f64(updated_at);
}

void encode_invalidate(Writer& w, int64_t id, const std::string& reason, double time) {
  w.u8(static_cast<uint8_t>(LogOp::Invalidate));
  w.i64(id);
  w.str(reason);
  w.f64(time);
}

void encode_delete(Writer& w, int64_t id) {
  w.u8(static_cast<uint8_t>(LogOp::Delete));
  w.i64(id);
}

void encode_event_time(Writer& w, int64_t id, double event_time) {
  w.u8(static_cast<uint8_t>(LogOp::EventTime));
  w.i64(id);
  w.f64(event_time);
}

void encode_import(Writer& w, const std::string& ns, const Record& r, const float* vec, uint32_t dim) {
  w.u8(static_cast<uint8_t>(LogOp::Import));
  w.str(ns);
  write_record_fields(w, r);
  w.f64(r.event_time);
  w.u64(r.history.size());
  for (const auto& v : r.history) write_version(w, v);
  w.floats(vec, dim);
}

std::vector<LogOperation> decode_log_entry(const std::string& payload, uint32_t dim) {
  Reader rd(payload.data(), payload.size(), "log entry");
  uint32_t n_ops = rd.u32();
  std::vector<LogOperation> ops;
  ops.reserve(std::min<size_t>(n_ops, payload.size()));  // each op takes at least one byte
  for (uint32_t k = 0; k < n_ops; ++k) {
    LogOperation o;
    uint8_t code = rd.u8();
    switch (static_cast<LogOp>(code)) {
      case LogOp::Add:
        o.kind = LogOp::Add;
        o.ns = rd.str();
        o.record = read_record_fields(rd);
        o.embedding = rd.floats(dim);
        break;
      case LogOp::Version:
        o.kind = LogOp::Version;
        o.id = rd.i64();
        o.version_op = rd.u8();
        o.fields = rd.u8();
        if (o.fields & kHasSummary) o.summary = rd.str();
        if (o.fields & kHasEmbedding) o.embedding = rd.floats(dim);
        if (o.fields & kHasTurns) o.turns_json = rd.str();
        if (o.fields & kHasMeta) o.meta_json = rd.str();
        o.time = rd.f64();
        break;
      case LogOp::Invalidate:
        o.kind = LogOp::Invalidate;
        o.id = rd.i64();
        o.reason = rd.str();
        o.time = rd.f64();
        break;
      case LogOp::Delete:
        o.kind = LogOp::Delete;
        o.id = rd.i64();
        break;
      case LogOp::EventTime:
        o.kind = LogOp::EventTime;
        o.id = rd.i64();
        o.time = rd.f64();
        break;
      case LogOp::Import: {
        o.kind = LogOp::Import;
        o.ns = rd.str();
        o.record = read_record_fields(rd);
        o.record.event_time = rd.f64();
        uint64_t nh = rd.count(40);
        o.record.history.reserve(nh);
        for (uint64_t j = 0; j < nh; ++j) o.record.history.push_back(read_version(rd, dim));
        o.embedding = rd.floats(dim);
        break;
      }
      default:
        rd.fail("unknown operation " + std::to_string(code));
    }
    ops.push_back(std::move(o));
  }
  if (rd.left() != 0) rd.fail("trailing bytes");
  return ops;
}

}  // namespace memkern
