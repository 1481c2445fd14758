"""Query embedding: the current MiniLM embedder vs its faster routes, latency and retrieval quality.

Routes (all :class:`memkern.Embedder` options, the default is ``backend="torch"``):

* ``torch``: the default, eager PyTorch float32;
* ``onnx``: ``Embedder(backend="onnx")``, the same float32 model exported once to ONNX and run by
  ONNX Runtime (checked: same vectors within 1e-5);
* ``int8``: ``Embedder(quantize="int8")``, dynamic int8 quantisation of the linear layers (checked
  only for cosine > 0.8: it changes the vectors; its recall is measured below);
* ``cache hit``: ``Embedder(query_cache=...)`` answering a repeated query (exact: checked equal).

Latency is per single query (the RMM ``respond`` path embeds one query), interleaved through
``bench/harness.py``, one thread. Retrieval quality: Recall@5/@10 of evidence turns with exact
cosine search over every turn of each conversation of the generated eval data
(:func:`memkern.eval.granularity.run_granularity`, granularity "turn"), and on the bundled sample
conversation (a question is answered from a session when one of its turns is in the top k).

Run: ``OMP_NUM_THREADS=1 python bench/bench_embedder.py [--quick]`` (prints tables; ``--json``
writes them), or ``python -m pytest bench/bench_embedder.py -q -s``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

from harness import Side, compare, machine_info, pin_threads  # noqa: E402

QUERIES = ["What is my job now?", "Where did I travel last spring?", "What is the name of my dog?",
           "Which diet am I following these days?", "When is my next race?",
           "What did I say about my sister's wedding plans and the venue we picked?",
           "Do I still live in Lisbon?", "What hobby did I start this year?"]


def routes(which=("torch", "onnx", "int8")) -> dict:
    from memkern.models import Embedder

    out = {}
    for r in which:
        if r == "torch":
            out[r] = Embedder()
        elif r == "onnx":
            try:
                out[r] = Embedder(backend="onnx")
            except Exception as e:  # noqa: BLE001 - a missing optional backend is reported, not fatal
                print(f"skipping onnx route: {e}")
        elif r == "int8":
            out[r] = Embedder(quantize="int8")
    return out


def latency(embs: dict, rounds: int = 7) -> dict:
    """Per-query latency of each route (one query per call, all QUERIES each round), interleaved."""
    from memkern.models import Embedder

    cached = Embedder(query_cache=64)
    cached.encode(QUERIES, kind="query")  # the repeated queries are in the cache

    def run(e):
        return np.concatenate([e.encode([q], kind="query") for q in QUERIES])

    sides = [Side(name, (lambda e=e, name=name: (name, run(e))), threads=1) for name, e in embs.items()]
    sides.append(Side("cache hit", lambda: ("cache hit", run(cached)), threads=1))

    def check(a, b):
        (_, va), (nb, vb) = a, b
        if nb == "int8":
            cos = (va * vb).sum(1)
            assert (cos > 0.8).all(), f"int8 cosine to float32 {cos.min():.3f}"
        else:
            np.testing.assert_allclose(va, vb, atol=1e-5)

    with pin_threads(1):
        c = compare(*sides, check=check, rounds=rounds, warmup=2, label="query embedding (one query per call)")
    per_q = {s.name: s.median / len(QUERIES) for s in c.sides}
    base = c.sides[0].times
    ratios = {s.name: float(np.median([b / x for b, x in zip(base, s.times)])) for s in c.sides}
    int8_cos = None
    if "int8" in embs:
        int8_cos = float(((embs["torch"].encode(QUERIES, kind="query") *
                           embs["int8"].encode(QUERIES, kind="query")).sum(1)).min())
    return {"comparison": c.to_dict(), "per_query_ms": {k: 1e3 * v for k, v in per_q.items()},
            "speedup_vs_torch": ratios, "cpu_per_wall": {s.name: s.cpu_per_wall for s in c.sides},
            "int8_min_cosine": int8_cos, "cache_hits": cached.cache_hits}


def recall_generated(embs: dict, users: int, sessions: int) -> dict:
    from memkern.eval.data import load_dataset
    from memkern.eval.granularity import run_granularity
    from memkern.eval.units import CachedEmbedder

    ds = load_dataset("generated", users=users, sessions=sessions, seed=0)
    out = {"dataset": {"users": users, "sessions": sessions, "turns": ds.n_turns, "questions": ds.n_questions}}
    for name, e in embs.items():
        r = run_granularity(ds, ["turn"], emb=CachedEmbedder(e, cache_dir=None))
        m = r["metrics"]["turn"]
        out[name] = {"recall@5": m["recall@5"], "recall@10": m["recall@10"], "ndcg@5": m["ndcg@5"],
                     "questions": m["questions"]}
    return out


def recall_sample(embs: dict, k: int = 5) -> dict:
    from memkern.cli.common import sample_conversation_path

    d = json.loads(sample_conversation_path().read_text())
    turns = [(s["session_id"], t["content"]) for s in d["sessions"] for t in s["turns"]]
    out: dict = {"questions": len(d["questions"]), "turns": len(turns), "k": k}
    tops = {}
    for name, e in embs.items():
        P = e.encode([t for _, t in turns])
        Q = e.encode([q["question"] for q in d["questions"]], kind="query")
        order = np.argsort(-(Q @ P.T), axis=1, kind="stable")[:, :k]
        tops[name] = order
        hits = []
        for qi, q in enumerate(d["questions"]):
            got = {turns[j][0] for j in order[qi]}
            hits.append(len(got & set(q["evidence_sessions"])) / len(q["evidence_sessions"]))
        out[name] = {f"session_recall@{k}": float(np.mean(hits))}
        if name != "torch" and "torch" in tops:
            out[name]["same_top_k_as_torch"] = float(np.mean([set(a) == set(b) for a, b in zip(order, tops["torch"])]))
    return out


def run(quick: bool = True) -> dict:
    import torch

    torch.set_num_threads(1)
    embs = routes()
    res = {"machine": machine_info(), "quick": quick, "latency": latency(embs, rounds=5 if quick else 9)}
    u, s = (4, 10) if quick else (12, 30)
    res["recall_generated"] = recall_generated(embs, u, s)
    res["recall_sample"] = recall_sample(embs)
    return res


def format_tables(res: dict) -> str:
    lat = res["latency"]
    lines = ["| route | ms per query (median) | IQR (ms, whole round / queries) | speedup vs torch | CPU/wall |",
             "|---|---|---|---|---|"]
    n = len(QUERIES)
    for s in lat["comparison"]["sides"]:
        lines.append(f"| {s['name']} | {1e3 * s['median_s'] / n:.2f} | {1e3 * s['q1_s'] / n:.2f}-{1e3 * s['q3_s'] / n:.2f} "
                     f"| {lat['speedup_vs_torch'][s['name']]:.2f}x | {s['cpu_per_wall']:.2f} |")
    g, sm = res["recall_generated"], res["recall_sample"]
    lines += ["", f"Retrieval with each route (generated eval data: {g['dataset']['turns']} turns, "
                  f"{g['dataset']['questions']} questions; sample conversation: {sm['turns']} turns, "
                  f"{sm['questions']} questions):", "",
              "| route | generated Recall@5 | generated Recall@10 | change vs torch (points, R@5 / R@10) "
              "| sample session-Recall@5 | sample: same top-5 as torch |", "|---|---|---|---|---|---|"]
    t = g.get("torch")
    for name in [k for k in g if k != "dataset"]:
        m = g[name]
        d5 = 100 * (m["recall@5"] - t["recall@5"]) if t else float("nan")
        d10 = 100 * (m["recall@10"] - t["recall@10"]) if t else float("nan")
        s_ = sm.get(name, {})
        lines.append(f"| {name} | {m['recall@5']:.4f} | {m['recall@10']:.4f} | {d5:+.2f} / {d10:+.2f} "
                     f"| {s_.get('session_recall@5', float('nan')):.3f} | {s_.get('same_top_k_as_torch', 1.0):.2f} |")
    if lat.get("int8_min_cosine") is not None:
        lines.append(f"\nint8 vs float32: lowest cosine over the benchmark queries {lat['int8_min_cosine']:.3f}.")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ pytest
def test_query_embedding_routes():
    import pytest

    pytest.importorskip("onnxruntime")
    res = {"latency": latency(routes(("torch", "onnx")), rounds=5)}
    assert res["latency"]["speedup_vs_torch"]["cache hit"] > 5
    print("\n" + json.dumps(res["latency"]["per_query_ms"]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small eval data, fewer rounds")
    ap.add_argument("--json", default=None, help="raw numbers (default bench/results/embedder.json)")
    ap.add_argument("--write-section", action="store_true",
                    help="write bench/sections/embedder.md (then `memkern bench --assemble`)")
    a = ap.parse_args(argv)
    res = run(quick=a.quick)
    md = format_tables(res)
    print(md)
    js = Path(a.json) if a.json else Path(__file__).resolve().parent / "results" / "embedder.json"
    js.parent.mkdir(parents=True, exist_ok=True)
    js.write_text(json.dumps(res, indent=1, default=float))
    if a.write_section:
        import report
        from harness import machine_info

        p = report.write_section("embedder", "Query embedding routes (`bench/bench_embedder.py`)", md,
                                 "OMP_NUM_THREADS=1 python bench/bench_embedder.py" + (" --quick" if a.quick else "")
                                 + " --write-section", machine_info(), raw_json="bench/results/embedder.json")
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
