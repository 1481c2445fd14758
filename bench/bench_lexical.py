"""Lexical (BM25) index, hybrid search and filters inside the store: cost and retrieval quality.

Measured in one run, as ratios between sides run interleaved through ``bench/harness.py`` (one
thread everywhere unless stated):

* **add cost of the lexical index**: ``add_batch`` of the same records (384-d vectors, dialogue
  turn texts, small meta) into a fresh store with the derived indexes (BM25 postings + filterable
  meta) maintained, vs with them switched off by the test-only hook ``_store._test_set_lexical``
  (dense-only, what the store did before). Target: <= 1.30x.
* **filtered search**: a 20,000-record HNSW namespace (384-d, M=16, ef_construction=200, ef=128,
  k=10), batches of single-thread queries: unfiltered vs a 1% meta filter (exact scan of the
  matching records, chosen because they are few), a 1% time window (hnswlib's filter functor
  inside the graph search) and a 10% meta filter (functor). Each filtered call is checked to
  return k results, all allowed. Target at 1%: <= 2x unfiltered latency.
* **hybrid vs dense retrieval**: turn-level Recall@5/10/20 (each unit one turn, embedded as
  ``"{speaker}: {content}"`` by the MiniLM embedder, questions as queries) on realistic generated
  dialogues (:func:`memkern.data.generate_dialogues`) and on the old generated data
  (:func:`memkern.data.generate_history`): store ``mode="dense"`` vs ``mode="hybrid"`` (RRF and
  weighted fusion) vs ``mode="lexical"``.
* **open time**: reopening a store (snapshot load) holding the 20,000 records, with the derived
  indexes rebuilt from the record texts vs with the hook off.

Run: ``OMP_NUM_THREADS=1 python bench/bench_lexical.py [--n 20000] [--conversations 6]
[--sessions 12] [--json out.json] [--write-section]``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from harness import Side, compare, machine_info, to_jsonable  # noqa: E402

D = 384
K = 10
EF = 128


def _native():
    from memkern import _store

    return _store


def dialogue_texts(n: int, seed: int = 0) -> list[str]:
    """``n`` realistic turn texts (speaker-prefixed) from generated dialogues, repeated as needed."""
    from memkern.data import generate_dialogues

    ds = generate_dialogues(8, 12, seed=seed)
    base = [f"{t.speaker}: {t.content}" for c in ds.conversations for t in c.turns()]
    return [base[i % len(base)] for i in range(n)]


def unit_vectors(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, D), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def bench_add(n: int, batch: int, rounds: int) -> dict:
    from memkern.store import MemoryStore

    texts = dialogue_texts(n)
    x = unit_vectors(n, 1)
    metas = [{"user": f"u{i % 50}", "session": i // 20} for i in range(n)]
    root = Path(tempfile.mkdtemp(prefix="bench-lex-add-"))
    counter = [0]

    def run(lexical: bool):
        _native()._test_set_lexical(lexical)
        counter[0] += 1
        p = root / f"s{counter[0]}"
        try:
            with MemoryStore(p, dim=D, metric="cos", fsync="never", snapshot_every=0) as s:
                for i in range(0, n, batch):
                    s.add_batch("u", texts[i:i + batch], x[i:i + batch], metas=metas[i:i + batch])
                c = s.count("u")
        finally:
            _native()._test_set_lexical(True)
            shutil.rmtree(p, ignore_errors=True)
        return c

    c = compare(Side("lexical+meta indexed", lambda: run(True), threads=1),
                Side("dense only", lambda: run(False), threads=1),
                check=lambda a, b: a == b == n, rounds=rounds, warmup=1, label=f"add {n} records")
    shutil.rmtree(root, ignore_errors=True)
    return dict(n=n, batch=batch, comparison=c.to_dict(), ratio=c.ratio, summary=c.summary())


def bench_filters(n: int, queries: int, rounds: int) -> dict:
    from memkern.store import MemoryStore

    root = Path(tempfile.mkdtemp(prefix="bench-lex-filter-"))
    x = unit_vectors(n, 2)
    texts = dialogue_texts(n)
    s = MemoryStore(root / "s", dim=D, metric="cos", fsync="never", snapshot_every=0)
    for i in range(0, n, 5000):
        s.add_batch("u", texts[i:i + 5000], x[i:i + 5000],
                    metas=[{"bucket": j % 100, "tenth": j % 10} for j in range(i, min(n, i + 5000))],
                    event_times=[float(j) for j in range(i, min(n, i + 5000))])
    assert s._native.index_kind("u", 0) == "hnsw"
    q = unit_vectors(queries, 3)
    lo = n // 2
    win = n // 100
    cases = {
        "meta filter 1% (exact scan of the matches)": (dict(filter={"bucket": 7}), lambda i: i % 100 == 7),
        "time window 1% (graph search + filter functor)": (dict(time_range=(lo, lo + win)),
                                                            lambda i: lo <= i < lo + win),
        "meta filter 10% (graph search + filter functor)": (dict(filter={"tenth": 3}), lambda i: i % 10 == 3),
    }
    out = {}
    for name, (kw, ok) in cases.items():
        def check(a, b, ok=ok):
            ids = b[0]
            assert (ids >= 0).all(), "fewer than k results"
            assert all(ok(int(i)) for i in ids.ravel()), "a result outside the filter"
            return True

        c = compare(Side("unfiltered", lambda: s.search("u", q, k=K, ef=EF), threads=1),
                    Side(name, lambda kw=kw: s.search("u", q, k=K, ef=EF, **kw), threads=1),
                    check=check, rounds=rounds, warmup=1, label=name)
        # ratio = unfiltered / filtered time: its inverse is the filtered slowdown
        out[name] = dict(comparison=c.to_dict(), slowdown=1.0 / c.ratio, summary=c.summary())
    # open time: snapshot load rebuilding the derived indexes from the record texts, vs hook off
    s.close()
    times = {"with derived indexes": [], "dense only": []}
    for _ in range(3):
        for name, flag in (("with derived indexes", True), ("dense only", False)):
            _native()._test_set_lexical(flag)
            t0 = time.perf_counter()
            s2 = MemoryStore(root / "s")
            s2.search("u", q[:1], k=K)
            times[name].append(time.perf_counter() - t0)
            s2.close()
            _native()._test_set_lexical(True)
    shutil.rmtree(root, ignore_errors=True)
    out["open"] = {k: float(np.median(v)) for k, v in times.items()}
    return dict(n=n, queries=queries, k=K, ef=EF, cases=out)


def bench_recall(source: str, conversations: int, sessions: int) -> dict:
    from memkern.data import generate_dialogues, generate_history
    from memkern.eval.memory import CachedEmbedder
    from memkern.eval.metrics import recall_at_k
    from memkern.store import MemoryStore

    ds = (generate_dialogues(conversations, sessions, seed=0) if source == "dialogues"
          else generate_history(conversations, sessions, seed=0))
    emb = CachedEmbedder()
    root = Path(tempfile.mkdtemp(prefix="bench-lex-recall-"))
    configs = {
        "dense": dict(mode="dense"),
        "lexical": dict(mode="lexical"),
        "hybrid rrf w=0.5": dict(mode="hybrid", fusion="rrf", lexical_weight=0.5),
        "hybrid rrf w=0.3": dict(mode="hybrid", fusion="rrf", lexical_weight=0.3),
        "hybrid weighted w=0.3": dict(mode="hybrid", fusion="weighted", lexical_weight=0.3),
        "hybrid weighted w=0.5": dict(mode="hybrid", fusion="weighted", lexical_weight=0.5),
    }
    ks = (5, 10, 20)
    rows = {c: {k: [] for k in ks} for c in configs}
    with MemoryStore(root / "s", dim=emb.dim, metric="cos", fsync="never") as s:
        for c in ds.conversations:
            qs = [q for q in c.questions if q.evidence_turn_ids]
            if not qs:
                continue
            turns = list(c.turns())
            texts = [f"{t.speaker}: {t.content}" if t.speaker else t.content for t in turns]
            ids = s.add_batch(c.conversation_id, texts, emb.encode(texts, kind="passage"))
            tid = {int(i): t.turn_id for i, t in zip(ids, turns)}
            qe = emb.encode([q.question for q in qs], kind="query")
            for name, kw in configs.items():
                got, _ = s.search(c.conversation_id, qe, k=max(ks), texts=[q.question for q in qs], **kw)
                for qi, q in enumerate(qs):
                    ranked = [[tid[int(i)]] for i in got[qi] if i >= 0]
                    for k in ks:
                        rows[name][k].append(recall_at_k(ranked, q.evidence_turn_ids, k))
    emb.flush()
    shutil.rmtree(root, ignore_errors=True)
    return dict(source=source, conversations=conversations, sessions=sessions, turns=ds.n_turns,
                questions=len(rows["dense"][5]), embedder=emb.model_name,
                recall={c: {f"R@{k}": float(np.mean(v[k])) for k in ks} for c, v in rows.items()})


def markdown(res: dict) -> str:
    a = res["add"]
    L = ["### Add cost of the lexical + meta indexes", "",
         f"`add_batch` of {a['n']:,} records ({a['batch']} per call, 384-d, dialogue turn texts, 2 meta keys), "
         "fresh store each round, `fsync=\"never\"`, one thread; interleaved rounds.", "",
         "| side | median s | ratio (indexed / dense-only) |", "|---|---|---|"]
    cmp = a["comparison"]
    sides = cmp["sides"]
    L.append(f"| {sides[0]['name']} | {sides[0]['median']:.3f} | **{a['ratio']:.3f}x** (target <= 1.30) |")
    L.append(f"| {sides[1]['name']} | {sides[1]['median']:.3f} | 1 |")
    f = res["filters"]
    L += ["", "### Filtered search vs unfiltered", "",
          f"{f['n']:,} records in one HNSW namespace (384-d cos, M=16, ef_construction=200), batches of "
          f"{f['queries']} queries, k={f['k']}, ef={f['ef']}, one thread; each filtered call checked: k results, "
          "all allowed.", "",
          "| filter | unfiltered ms/batch | filtered ms/batch | filtered / unfiltered |", "|---|---|---|---|"]
    for name, c in f["cases"].items():
        if name == "open":
            continue
        sd = c["comparison"]["sides"]
        L.append(f"| {name} | {sd[0]['median'] * 1e3:.1f} | {sd[1]['median'] * 1e3:.1f} | **{c['slowdown']:.2f}x** |")
    o = f["cases"]["open"]
    L += ["", f"Open (snapshot load + first query) of that store: {o['with derived indexes']:.3f} s with the BM25 "
          f"and meta indexes rebuilt from the record texts, {o['dense only']:.3f} s without "
          f"({o['with derived indexes'] / o['dense only']:.2f}x).", ""]
    for r in res["recall"]:
        L += [f"### Turn-level recall, {r['source']} ({r['conversations']} conversations, {r['turns']} turns, "
              f"{r['questions']} questions, {r['embedder']})", "",
              "| search | R@5 | R@10 | R@20 |", "|---|---|---|---|"]
        for c, m in r["recall"].items():
            L.append(f"| {c} | {m['R@5']:.3f} | {m['R@10']:.3f} | {m['R@20']:.3f} |")
        L.append("")
    return "\n".join(L)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--add-n", type=int, default=5000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--conversations", type=int, default=6)
    ap.add_argument("--sessions", type=int, default=12)
    ap.add_argument("--json", default=None)
    ap.add_argument("--write-section", action="store_true")
    a = ap.parse_args(argv)
    res = dict(machine=machine_info())
    res["add"] = bench_add(a.add_n, 250, a.rounds)
    print(res["add"]["summary"], flush=True)
    res["filters"] = bench_filters(a.n, a.queries, a.rounds)
    for name, c in res["filters"]["cases"].items():
        print(name, c if name == "open" else c["summary"], flush=True)
    res["recall"] = [bench_recall("dialogues", a.conversations, a.sessions),
                     bench_recall("generated", a.conversations, a.sessions)]
    for r in res["recall"]:
        print(json.dumps(r["recall"], indent=1), flush=True)
    md = markdown(res)
    print(md)
    if a.json:
        Path(a.json).write_text(json.dumps(to_jsonable(res), indent=1))
    if a.write_section:
        import report

        cmd = "OMP_NUM_THREADS=1 .venv/bin/python bench/bench_lexical.py " + " ".join(argv or sys.argv[1:])
        p = report.write_section("lexical", "Lexical index, hybrid search and filters (`bench/bench_lexical.py`)",
                                 md, cmd.replace(" --write-section", "").strip() + " --write-section",
                                 machine=res["machine"], raw_json=a.json)
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
