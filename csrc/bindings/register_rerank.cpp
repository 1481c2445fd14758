// pybind11 bindings of the reranker's fused CPU path (memkern/rerank.h), called by
// memkern.score.ops.native on numpy views of CPU tensors: every array is checked (dtype, C order,
// shape, writable outputs) and named in the error; the kernels run without the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "memkern/errors.h"
#include "memkern/rerank.h"

namespace py = pybind11;

namespace {

std::string shape_str(const py::array& a) {
  std::string s = "(";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

// The data of `h` as T* after checking it: a C-contiguous numpy array of T (bool: 1-byte bool) with
// `shape` (-1 = any extent); null for None when `optional`.
template <typename T>
T* arr(py::handle h, const char* name, std::vector<int64_t> shape, bool optional = false, bool writable = false,
       bool is_bool = false) {
  if (h.is_none()) {
    if (optional) return nullptr;
    throw memkern::ValueError(std::string(name) + ": expected an array, got None");
  }
  if (!py::isinstance<py::array>(h)) throw memkern::ValueError(std::string(name) + ": expected a numpy array");
  py::array a = py::reinterpret_borrow<py::array>(h);
  const bool dtype_ok = is_bool ? (a.dtype().kind() == 'b' && a.itemsize() == 1) : a.dtype().is(py::dtype::of<T>());
  if (!dtype_ok) throw memkern::ValueError(std::string(name) + ": expected dtype " + (is_bool ? "bool" : std::string(py::str(py::dtype::of<T>()))) + ", got " + std::string(py::str(a.dtype())));
  if (!(a.flags() & py::array::c_style)) throw memkern::ValueError(std::string(name) + ": expected a C-contiguous array");
  bool ok = a.ndim() == static_cast<py::ssize_t>(shape.size());
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = shape[i] < 0 || a.shape(i) == shape[i];
  if (!ok) throw memkern::ValueError(std::string(name) + ": expected shape of rank " + std::to_string(shape.size()) + " matching the batch, got " + shape_str(a));
  if (writable && !a.writeable()) throw memkern::ValueError(std::string(name) + ": expected a writable array");
  return static_cast<T*>(writable ? a.mutable_data() : const_cast<void*>(a.data()));
}

memkern::rerank::Cands cands(py::handle dense, py::handle table, py::handle ids, py::handle mask, int64_t B,
                             int64_t K, int64_t d) {
  memkern::rerank::Cands c;
  if (!dense.is_none()) {
    c.dense = arr<float>(dense, "candidates", {B, K, d});
  } else {
    c.table = arr<float>(table, "table", {-1, d});
    c.n_table = py::reinterpret_borrow<py::array>(table).shape(0);
    c.ids = arr<int64_t>(ids, "ids", {B, K});
  }
  c.mask = reinterpret_cast<const uint8_t*>(arr<bool>(mask, "mask", {B, K}, true, false, true));
  return c;
}

}  // namespace

void register_rerank(py::module_& m) {
  m.def("rerank_kernel", &memkern::rerank::kernel_name,
        "The instruction set of the reranker's fused CPU kernels (\"avx512\", \"avx2+fma\" or \"scalar\").");
  m.def("rerank_philox", [](uint64_t seed, uint64_t offset) { return memkern::rerank::philox_uniform(seed, offset); },
        py::arg("seed"), py::arg("offset"), "Philox4x32-10 uniform at counter `offset` under `seed` (tests).");
  m.def(
      "rerank_select",
      [](py::array q, py::array Wq, py::array Wm, py::object dense, py::object table, py::object ids, py::object mask,
         py::object prior, int64_t K, int64_t m, float tau, uint64_t seed, uint64_t offset, bool greedy,
         bool plackett_luce) {
        memkern::rerank::SelectArgs a;
        if (q.ndim() != 2) throw memkern::ValueError("q: expected shape [B, d], got " + shape_str(q));
        a.B = q.shape(0);
        a.d = q.shape(1);
        a.K = K;
        a.m = m;
        if (K < 1 || m < 1 || m > K) throw memkern::ValueError("m: expected 1 <= m <= K = " + std::to_string(K) + ", got " + std::to_string(m));
        a.q = arr<float>(q, "q", {a.B, a.d});
        a.Wq = arr<float>(Wq, "Wq", {a.d, a.d});
        a.Wm = arr<float>(Wm, "Wm", {a.d, a.d});
        a.c = cands(dense, table, ids, mask, a.B, K, a.d);
        a.prior = arr<float>(prior, "prior", {a.B, K}, true);
        a.tau = tau;
        a.seed = seed;
        a.offset = offset;
        a.greedy = greedy;
        a.plackett_luce = plackett_luce;
        py::array_t<float> qp({a.B, a.d}), scores({a.B, K}), lp({a.B, m});
        py::array_t<int64_t> idx({a.B, m});
        py::object drawn = py::none();
        a.qp = qp.mutable_data();
        a.scores = scores.mutable_data();
        a.idx = idx.mutable_data();
        a.logp = lp.mutable_data();
        if (a.prior) {
          py::array_t<float> dr({a.B, K});
          a.drawn = dr.mutable_data();
          drawn = dr;
        }
        double w_sq = 0;
        a.w_sq = &w_sq;
        {
          py::gil_scoped_release nogil;
          memkern::rerank::select(a);
        }
        return py::make_tuple(idx, lp, scores, qp, drawn, w_sq);
      },
      py::arg("q"), py::arg("Wq"), py::arg("Wm"), py::arg("dense"), py::arg("table"), py::arg("ids"), py::arg("mask"),
      py::arg("prior"), py::arg("K"), py::arg("m"), py::arg("tau"), py::arg("seed"), py::arg("offset"),
      py::arg("greedy"), py::arg("plackett_luce"),
      "Fused select: (idx [B, m] int64, logp [B, m], adapter scores [B, K], q' [B, d], drawn scores [B, K] or "
      "None, |Wq|^2 + |Wm|^2) of memkern.Reranker.select on float32 arrays (memkern.score.ops.native).");
  m.def(
      "rerank_step",
      [](py::array Wq, py::array Wm, py::array q, py::object dense, py::object table, py::object ids, py::object mask,
         py::array idx, py::array R, py::object prior, py::object qp_cached, py::object s_cached, double w_sq_cached,
         py::object pick, int64_t replay_size, int64_t replay_len, uint64_t replay_seed, uint64_t replay_draws,
         py::object ring, bool use_P, bool write_ring, int64_t rpos, int baseline_mode, float baseline,
         py::object running, bool running_first, float momentum, bool normalize, float tau, bool plackett_luce,
         py::array gWq, py::array gWm, bool apply, float clip, float lr, float decay, float max_norm, bool scale,
         py::object win, py::object loss) {
        memkern::rerank::StepArgs a;
        if (q.ndim() != 2 || idx.ndim() != 2) throw memkern::ValueError("q, indices: expected [B, d] and [B, M] arrays");
        a.Bn = q.shape(0);
        a.d = q.shape(1);
        a.M = idx.shape(1);
        const int64_t d = a.d;
        a.K = !dense.is_none() ? py::reinterpret_borrow<py::array>(dense).shape(1)
                               : py::reinterpret_borrow<py::array>(ids).shape(1);
        const int64_t K = a.K, M = a.M, Bn = a.Bn;
        a.Wq = arr<float>(Wq, "Wq", {d, d}, false, true);
        a.Wm = arr<float>(Wm, "Wm", {d, d}, false, true);
        a.q = arr<float>(q, "q", {Bn, d});
        a.c = cands(dense, table, ids, mask, Bn, K, d);
        a.idx = arr<int64_t>(idx, "indices", {Bn, M});
        a.R = arr<float>(R, "rewards", {Bn, M});
        a.prior = arr<float>(prior, "prior", {Bn, K}, true);
        a.qp_cached = arr<float>(qp_cached, "qp_cached", {Bn, d}, true);
        a.s_cached = arr<float>(s_cached, "s_cached", {Bn, K}, true);
        a.w_sq_cached = w_sq_cached;
        if (!ring.is_none()) {
          py::tuple t = ring.cast<py::tuple>();
          if (t.size() != 6) throw memkern::ValueError("ring: expected (q, C, valid, idx, R, P)");
          a.ring_q = arr<float>(t[0], "ring q", {-1, d}, false, true);
          a.cap = py::reinterpret_borrow<py::array>(t[0]).shape(0);
          a.ring_C = arr<float>(t[1], "ring C", {a.cap, K, d}, false, true);
          a.ring_valid = reinterpret_cast<uint8_t*>(arr<bool>(t[2], "ring valid", {a.cap, K}, false, true, true));
          a.ring_idx = arr<int64_t>(t[3], "ring idx", {a.cap, M}, false, true);
          a.ring_R = arr<float>(t[4], "ring R", {a.cap, M}, false, true);
          a.ring_P = arr<float>(t[5], "ring P", {a.cap, K}, false, true);
          a.write_ring = write_ring;
          a.rpos = rpos;
          if (write_ring && (Bn > a.cap || rpos < 0 || rpos >= a.cap))
            throw memkern::ValueError("ring: expected B <= capacity and 0 <= rpos < capacity");
        } else if (write_ring || !pick.is_none()) {
          throw memkern::ValueError("ring: expected the ring's arrays with pick / write_ring");
        }
        if (replay_size > 0) {
          if (!pick.is_none() || a.cap == 0 || replay_len < 1 || replay_len > a.cap)
            throw memkern::ValueError("replay_len: expected 1 <= replay_len <= capacity without pick");
          a.replay_size = replay_size;
          a.replay_len = replay_len;
          a.replay_seed = replay_seed;
          a.replay_draws = replay_draws;
        }
        if (!pick.is_none()) {
          a.pick = arr<int64_t>(pick, "pick", {-1});
          a.Br = py::reinterpret_borrow<py::array>(pick).shape(0);
          for (int64_t i = 0; i < a.Br; ++i)
            if (a.pick[i] < 0 || a.pick[i] >= a.cap)
              throw memkern::ValueError("pick: expected ring rows in [0, " + std::to_string(a.cap) + "), got " + std::to_string(a.pick[i]));
        }
        a.use_P = use_P;
        a.baseline_mode = baseline_mode;
        a.baseline = baseline;
        a.running = arr<float>(running, "running", {}, true, true);
        if (baseline_mode == 2 && !a.running) throw memkern::ValueError("running: expected a 0-dim float32 array");
        a.running_first = running_first;
        a.momentum = momentum;
        a.normalize = normalize;
        a.tau = tau;
        a.plackett_luce = plackett_luce;
        a.gWq = arr<float>(gWq, "gWq", {d, d}, false, true);
        a.gWm = arr<float>(gWm, "gWm", {d, d}, false, true);
        a.apply = apply;
        a.clip = clip;
        a.lr = lr;
        a.decay = decay;
        a.max_norm = max_norm;
        a.scale = scale;
        a.win = arr<float>(win, "win", {3}, true, true);
        float* o = arr<float>(loss, "loss", {}, true, true);
        memkern::rerank::StepResult r;
        {
          py::gil_scoped_release nogil;
          r = memkern::rerank::step(a);
        }
        if (o) *o = static_cast<float>(r.loss);
        return py::make_tuple(static_cast<float>(r.grad_norm), static_cast<float>(r.adapter_norm),
                              static_cast<float>(r.baseline), r.n_pos, r.n_valid, r.finite, r.grads_written,
                              static_cast<float>(r.loss));
      },
      py::arg("Wq"), py::arg("Wm"), py::arg("q"), py::arg("dense"), py::arg("table"), py::arg("ids"), py::arg("mask"),
      py::arg("idx"), py::arg("R"), py::arg("prior"), py::arg("qp_cached"), py::arg("s_cached"),
      py::arg("w_sq_cached"), py::arg("pick"), py::arg("replay_size"), py::arg("replay_len"), py::arg("replay_seed"),
      py::arg("replay_draws"), py::arg("ring"), py::arg("use_P"), py::arg("write_ring"), py::arg("rpos"), py::arg("baseline_mode"),
      py::arg("baseline"), py::arg("running"), py::arg("running_first"), py::arg("momentum"), py::arg("normalize"),
      py::arg("tau"), py::arg("plackett_luce"), py::arg("gWq"), py::arg("gWm"), py::arg("apply"), py::arg("clip"),
      py::arg("lr"), py::arg("decay"), py::arg("max_norm"), py::arg("scale"), py::arg("win"), py::arg("loss") = py::none(),
      "Fused trainer step of memkern.ReinforceTrainer on float32 arrays (memkern.score.ops.native): writes the "
      "loss into the 0-dim `loss` when one is given, returns (grad_norm, adapter_norm or NaN, baseline, n_pos, "
      "n_valid, finite, grads_written, loss).");
}
