"""Cost as work grows: each path's time against its size, with the log-log slope.

* ``store``: one namespace grown chunk by chunk to 10k, 30k, 100k, 300k (and 1M with ``--max-n
  1000000``) records, d=128, interleaved chunk by chunk with raw hnswlib at the same ``M`` /
  ``ef_construction`` on one thread (:func:`harness.interleaved_add_vs_hnswlib`); at each size the
  cumulative add time and the single-query search p50 / p99 (k=10, same ``ef``, the sides called
  alternately query by query; clustered unit vectors, ``memkern.data.vectors.clustered_vectors``),
  checked: both reach recall@10 >= 0.8 of an exact scan, within 0.03 of each other.
* ``rmm``: ``end_session`` (a three-turn session through the embedding extractor and decider) and
  ``retrieve`` (top-20 + rerank, greedy) in one bank of 100 to 100k turn records, with hashed unit
  vectors for the embedder and a fixed reply for the chat model: memkern's own cost, not the models'.
* ``memreread``: ``answer`` (one reread) against document length, 1k to 16k tokens, with the tiny
  random-weight Llama on SmolLM2's tokenizer; the number of model calls is checked to be
  ``2 * chunks + 4`` (linear work), so the slope measures the time per chunk staying flat.

The slope is the least-squares slope of ``log(time)`` on ``log(size)``: 1 is linear; a search's
should be far below 1. One thread everywhere (``OMP_NUM_THREADS=1``, torch pinned).

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_scaling.py [--parts store,rmm,memreread]
        [--max-n 300000] [--write-section] [--charts DIR]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

PARTS = ("store", "rmm", "memreread")
D, M_, EFC, EF, K = 128, 16, 100, 128, 10
STORE_SIZES = (10_000, 30_000, 100_000, 300_000, 1_000_000)
BANK_SIZES = (100, 1_000, 10_000, 100_000)
DOC_TOKENS = (1024, 2048, 4096, 8192, 16384)


def slope(xs, ys) -> float:
    """Least-squares slope of log(y) on log(x)."""
    lx, ly = np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float))
    return float(np.polyfit(lx, ly, 1)[0])


# ------------------------------------------------------------------------------------------ store
def run_store(max_n: int = 300_000, n_queries: int = 200, log=print) -> dict:
    import hnswlib

    from bench_peers import exact_top, recall
    from harness import Side, interleaved_add_vs_hnswlib, latencies
    from memkern import MemoryStore
    from memkern.data.vectors import clustered_vectors

    sizes = [n for n in STORE_SIZES if n <= max_n]
    c = max(20, sizes[-1] // 1000)  # clustered unit vectors, as embeddings are (the store benchmark's data)
    x = clustered_vectors(sizes[-1], D, c, seed=0)
    q = clustered_vectors(n_queries, D, c, seed=0, sample_seed=1)
    texts = [f"record {i}" for i in range(len(x))]
    rows, t_store, t_base, done = [], 0.0, 0.0, 0
    with tempfile.TemporaryDirectory(prefix="memkern-scaling-") as tmp:
        store = MemoryStore(Path(tmp) / "s", dim=D, metric="ip", fsync="never", M=M_, ef_construction=EFC,
                            ef_search=EF, num_threads=1)
        ix = hnswlib.Index(space="ip", dim=D)
        ix.init_index(max_elements=sizes[-1], M=M_, ef_construction=EFC, random_seed=100)
        ix.set_ef(EF)
        ix.set_num_threads(1)
        pos = np.full(2 * sizes[-1] + 16, -1, np.int64)
        for n in sizes:
            part = slice(done, n)
            before = store.count("bench")
            res = interleaved_add_vs_hnswlib(store, ix, x[part], texts[part], chunk=5000, start=done)
            ids = np.sort(store.ids("bench"))
            pos[ids[before:]] = np.arange(done, n)  # ids grow with insertion: the new ones map to the new rows
            t_store += res["t_store"]
            t_base += res["t_base"]
            done = n
            exact = exact_top(q, x[:n], K)
            lat = latencies(Side("memkern", None, threads=1), Side("hnswlib", None, threads=1),
                            calls=[lambda s, j: store.search("bench", q[j:j + 1], k=K),
                                   lambda s, j: ix.knn_query(q[j:j + 1], k=K, num_threads=1)],
                            n=n_queries, warmup=10, label=f"single query, {n:,} records")
            sid = store.search("bench", q, k=K)[0]
            got_m = np.where(sid >= 0, pos[np.maximum(sid, 0)], -1)
            got_h = ix.knn_query(q, k=K, num_threads=1)[0].astype(np.int64)
            rm, rh = recall(got_m, exact, K), recall(got_h, exact, K)
            assert min(rm, rh) >= 0.8 and abs(rm - rh) <= 0.03, f"{n}: recall@10 memkern {rm:.4f} vs hnswlib {rh:.4f}"
            row = {"n": n, "add_s": {"memkern": t_store, "hnswlib": t_base},
                   "search_p50_ms": {s: 1e3 * lat[s]["p50_s"] for s in ("memkern", "hnswlib")},
                   "search_p99_ms": {s: 1e3 * lat[s]["p99_s"] for s in ("memkern", "hnswlib")},
                   "recall": {"memkern": rm, "hnswlib": rh}}
            rows.append(row)
            log(f"[scaling] store {n:>9,}: add {t_store:.1f} s vs hnswlib {t_base:.1f} s; single query p50 "
                f"{row['search_p50_ms']['memkern']:.3f} vs {row['search_p50_ms']['hnswlib']:.3f} ms; recall "
                f"{rm:.3f} / {rh:.3f}")
        store.close()
    ns = [r["n"] for r in rows]
    out = {"rows": rows, "dim": D, "M": M_, "ef_construction": EFC, "ef": EF, "k": K, "queries": n_queries}
    if len(ns) >= 2:
        out["slopes"] = {f"{what} {side}": slope(ns, [r[key][side] for r in rows])
                         for what, key in (("add", "add_s"), ("search p50", "search_p50_ms"))
                         for side in ("memkern", "hnswlib")}
    return out


# ------------------------------------------------------------------------------------------ rmm
def run_rmm(sizes=BANK_SIZES, calls: int = 30, log=print) -> dict:
    from bench_rmm import DIM, FastEmbedder, FixedChat
    from memkern.loops.rmm import RMM
    from memkern.store import MemoryStore

    rows = []
    with tempfile.TemporaryDirectory(prefix="memkern-scaling-rmm-") as tmp:
        for n in sizes:
            store = MemoryStore(Path(tmp) / f"bank-{n}", dim=DIM, metric="cos", fsync="never")
            emb = FastEmbedder()
            texts = [f"User said: memory number {i} about subject {i % 97}." for i in range(n)]
            turns = [[{"role": "user", "content": s, "session_id": f"s{i // 5}", "turn_index": i % 5}]
                     for i, s in enumerate(texts)]
            for a in range(0, n, 2000):
                store.add_batch("bench", texts[a:a + 2000], emb.encode(texts[a:a + 2000]), turns=turns[a:a + 2000])
            rmm = RMM(store, chat_model=FixedChat(), embedder=emb, namespace="bench", extractor="embedding")
            rmm.retrieve("warm-up question")
            t_ret, t_end = [], []
            for i in range(calls):
                t0 = time.perf_counter()
                got = rmm.retrieve(f"question number {i} about subject {i % 97}?")
                t_ret.append(time.perf_counter() - t0)
                assert len(got.memory_ids) > 0
                session = [{"role": "user", "content": f"I have news number {i}. My hobby {i} is climbing rock {i}."},
                           {"role": "assistant", "content": "Nice!"},
                           {"role": "user", "content": f"Also my cousin {i} moved to city {i}."}]
                t0 = time.perf_counter()
                rmm.end_session(session, session_id=f"new-{i}")
                t_end.append(time.perf_counter() - t0)
            rows.append({"turns": n, "retrieve_ms": 1e3 * float(np.median(t_ret)),
                         "end_session_ms": 1e3 * float(np.median(t_end))})
            log(f"[scaling] rmm bank {n:>7,} turns: retrieve {rows[-1]['retrieve_ms']:.2f} ms, "
                f"end_session {rows[-1]['end_session_ms']:.2f} ms")
            store.close()
    ns = [r["turns"] for r in rows]
    return {"rows": rows, "calls": calls,
            "slopes": {k: slope(ns, [r[k] for r in rows]) for k in ("retrieve_ms", "end_session_ms")}}


# ------------------------------------------------------------------------------------------ memreread
def run_memreread(lengths=DOC_TOKENS, log=print) -> dict:
    import torch

    from bench_memreread import _reader
    from memkern.data.haystack import make_haystack_item
    from memkern.models import tiny_chat_model

    torch.set_num_threads(1)
    chat = tiny_chat_model(seed=0)
    reader = _reader(chat, max_rereads=1)
    rows = []
    for L in lengths:
        it = make_haystack_item("single", L, seed=11, tokenizer=chat.tokenizer)
        reader.answer(it.context, it.question) if L == lengths[0] else None  # warm-up
        t0 = time.perf_counter()
        r = reader.answer(it.context, it.question)
        dt = time.perf_counter() - t0
        assert sum(r.calls.values()) == 2 * r.n_chunks + 4, r.calls
        rows.append({"tokens": it.n_tokens, "chunks": r.n_chunks, "calls": sum(r.calls.values()), "seconds": dt})
        log(f"[scaling] memreread {it.n_tokens:>6,} tokens: {r.n_chunks} chunks, {dt:.2f} s")
    return {"rows": rows, "slope": slope([r["tokens"] for r in rows], [r["seconds"] for r in rows])}


# ------------------------------------------------------------------------------------------ output
def format_tables(res: dict) -> str:
    L = []
    if "store" in res:
        s = res["store"]
        L += [f"**Store** (d={s['dim']}, M={s['M']}, ef_construction={s['ef_construction']}, ef={s['ef']}, k={s['k']}, "
              f"one thread; {s['queries']} single queries per size):", "",
              "| records | add, cumulative (s): memkern / hnswlib | single query p50 (ms): memkern / hnswlib | "
              "p99 (ms) | recall@10 |", "|---|---|---|---|---|"]
        for r in s["rows"]:
            L.append(f"| {r['n']:,} | {r['add_s']['memkern']:.1f} / {r['add_s']['hnswlib']:.1f} | "
                     f"{r['search_p50_ms']['memkern']:.3f} / {r['search_p50_ms']['hnswlib']:.3f} | "
                     f"{r['search_p99_ms']['memkern']:.3f} / {r['search_p99_ms']['hnswlib']:.3f} | "
                     f"{r['recall']['memkern']:.3f} / {r['recall']['hnswlib']:.3f} |")
        if "slopes" in s:
            L += ["", "Log-log slopes: " + ", ".join(f"{k} {v:.2f}" for k, v in s["slopes"].items()) + "."]
        L.append("")
    if "rmm" in res:
        r = res["rmm"]
        L += [f"**RMM** (one bank; hashed embeddings, fixed chat reply; median of {r['calls']} calls):", "",
              "| turns in the bank | retrieve (ms) | end_session (ms) |", "|---|---|---|"]
        L += [f"| {x['turns']:,} | {x['retrieve_ms']:.2f} | {x['end_session_ms']:.2f} |" for x in r["rows"]]
        L += ["", "Log-log slopes: " + ", ".join(f"{k.replace('_ms', '')} {v:.2f}" for k, v in r["slopes"].items())
              + ".", ""]
    if "memreread" in res:
        m = res["memreread"]
        L += ["**MemReread** (one reread; tiny random-weight Llama, SmolLM2 tokenizer, 256-token chunks):", "",
              "| document tokens | chunks | model calls | seconds |", "|---|---|---|---|"]
        L += [f"| {x['tokens']:,} | {x['chunks']} | {x['calls']} | {x['seconds']:.2f} |" for x in m["rows"]]
        L += ["", f"Log-log slope of time on length: {m['slope']:.2f} (target <= 1.1).", ""]
    return "\n".join(L)


def charts(res: dict, folder: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    out = []
    series = []
    if "store" in res:
        s = res["store"]
        ns = [r["n"] for r in s["rows"]]
        series.append(("store add (cumulative s)", ns, {k: [r["add_s"][k] for r in s["rows"]] for k in ("memkern", "hnswlib")}))
        series.append(("store single query p50 (ms)", ns,
                       {k: [r["search_p50_ms"][k] for r in s["rows"]] for k in ("memkern", "hnswlib")}))
    if "rmm" in res:
        ns = [r["turns"] for r in res["rmm"]["rows"]]
        series.append(("RMM per call (ms)", ns, {k: [r[f"{k}_ms"] for r in res["rmm"]["rows"]]
                                                 for k in ("retrieve", "end_session")}))
    if "memreread" in res:
        rows = res["memreread"]["rows"]
        series.append(("MemReread answer (s)", [r["tokens"] for r in rows], {"memkern": [r["seconds"] for r in rows]}))
    for title, xs, ys in series:
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for name, y in ys.items():
            ax.loglog(xs, y, "o-", label=f"{name} (slope {slope(xs, y):.2f})")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("size")
        ax.legend(fontsize=8)
        fig.tight_layout()
        p = folder / ("scaling-" + "".join(c if c.isalnum() else "-" for c in title.lower()).strip("-") + ".png")
        fig.savefig(p, dpi=100)
        plt.close(fig)
        out.append(p)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--max-n", type=int, default=300_000, help="largest store size (1,000,000 for the full curve)")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--bank-max", type=int, default=100_000, help="largest RMM bank (turns)")
    ap.add_argument("--doc-max", type=int, default=16384, help="longest MemReread document (tokens)")
    ap.add_argument("--json", default=str(HERE / "results" / "scaling.json"))
    ap.add_argument("--charts", default=str(HERE / "results"), help="folder for the PNG charts")
    ap.add_argument("--write-section", action="store_true", help="refresh bench/sections/scaling.md")
    a = ap.parse_args(argv)
    parts = [p for p in a.parts.split(",") if p]
    bad = [p for p in parts if p not in PARTS]
    if bad:
        ap.error(f"--parts: expected names from {','.join(PARTS)}, got {bad}")
    import harness

    res: dict = {"machine": harness.machine_info()}
    with harness.pin_threads(1):
        if "store" in parts:
            res["store"] = run_store(a.max_n, a.queries)
        if "rmm" in parts:
            res["rmm"] = run_rmm(tuple(n for n in BANK_SIZES if n <= a.bank_max))
        if "memreread" in parts:
            res["memreread"] = run_memreread(tuple(n for n in DOC_TOKENS if n <= a.doc_max))
    text = format_tables(res)
    print(text)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(res, indent=1, default=str))
    for p in charts(res, Path(a.charts)):
        print(f"chart: {p}")
    if a.write_section:
        import report

        headline = []
        if "store" in res and "slopes" in res["store"]:
            sl = res["store"]["slopes"]
            headline.append(["store single query p50, log-log slope", f"{sl['search p50 memkern']:.2f}",
                             f"hnswlib {sl['search p50 hnswlib']:.2f}", "—"])
        if "memreread" in res:
            headline.append(["MemReread time vs document length, log-log slope", f"{res['memreread']['slope']:.2f}",
                             "linear 1.0", "—"])
        cmd = " ".join(["bench/bench_scaling.py"] + (argv if argv is not None else sys.argv[1:]))
        report.write_section("scaling", "Cost as work grows (log-log slopes)", text, cmd, machine=res["machine"],
                             raw_json="bench/results/scaling.json", headline=headline or None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
