"""RMM's default memory: ``retrieve`` latency on a large two-level bank, and ``end_session``'s cost.

``python bench/bench_rmm_retrieve.py [--turns 6000] [--embedder hash|minilm] [--locomo PATH
--conversations IDS]``

1. **retrieve**: one namespace of at least ``--turns`` turn records (generated dialogues, or the
   given LoCoMo conversations repeated with their years shifted so no session repeats), built
   through ``RMM.end_session``; then ``RMM.retrieve(question, turns=N)`` for N = 5, 10, 20 and
   ``None`` (respond's ``top_m`` memories), timed without the query embedding (``timings["total"]
   - timings["embed"]``), beside the same ``turns=10`` read without the learned residual (same
   turns asserted: a fresh reranker's residual is 0), the store's one-call turn search alone and a bare dense
   ``search(level="turn", k=80)`` of the same queries (ratios inside the run). ``--repeats``
   passes, interleaved by budget; p50 / p90 are per pass, the table shows the best pass's p50 and
   the median of the p90s.
2. **end_session** (``--embedder minilm``): seconds per turn of ``end_session`` with the real
   embedder, over the cost of embedding the same templated turns once in one batch (the least any
   two-level bank pays): each turn is embedded once, plus one vector per topic summary.

Run on 2 shared cores the timings move with the machine's load (printed); compare the ratios.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402


class HashEmbedder:
    """Bag-of-words unit vectors (hashed words): instant, deterministic, 384-d."""

    def __init__(self, dim: int = 384):
        self.dim = dim
        self._words: dict[str, np.ndarray] = {}

    def _w(self, w: str) -> np.ndarray:
        v = self._words.get(w)
        if v is None:
            import hashlib

            seed = int.from_bytes(hashlib.sha256(w.encode()).digest()[:8], "little")
            v = np.random.default_rng(seed).standard_normal(self.dim).astype(np.float32)
            self._words[w] = v
        return v

    def encode(self, texts, kind="passage", **kw):
        import re

        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            for w in re.findall(r"[a-z0-9']+", t.lower()):
                out[i] += self._w(w)
            out[i] /= max(float(np.linalg.norm(out[i])), 1e-9)
        return out


def sessions_of(args):
    """``[(turn dicts, session id, date)]`` with at least ``args.turns`` turns, and the questions."""
    from memkern.eval.retrieval import turn_dicts

    if args.locomo:
        from memkern.data import load_locomo

        ds = load_locomo(args.locomo, conversations=args.conversations.split(",") if args.conversations else None)
    else:
        from memkern.data import generate_dialogues

        ds = generate_dialogues(8, 20, seed=0)
    out, n, rep = [], 0, 0
    while n < args.turns:
        for c in ds.conversations:
            for s, sess in zip(turn_dicts(c), c.sessions):
                turns = [{k: v for k, v in t.items() if k != "date"} for t in s]
                date = sess.date[:-4] + str(2030 + rep) if rep else sess.date  # a new year per repetition
                out.append((turns, f"{rep}-{c.conversation_id}-{sess.session_id}", date))
                n += len(turns)
        rep += 1
    qs = [q.question for c in ds.conversations for q in c.questions if q.question_type not in ("category_5", "adversarial")]
    return out, qs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--turns", type=int, default=6000)
    ap.add_argument("--embedder", choices=("hash", "minilm"), default="hash")
    ap.add_argument("--locomo", default=None, help="LoCoMo file or folder (real text); default generated dialogues")
    ap.add_argument("--conversations", default=None)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cache-dir", default="default", help="embedding cache (minilm; 'none' disables)")
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    import memkern
    from memkern.eval.units import CachedEmbedder

    if a.embedder == "hash":
        emb = HashEmbedder()
    else:
        emb = CachedEmbedder(cache_dir=None if a.cache_dir == "none" else a.cache_dir)
    sess, qs = sessions_of(a)
    qs = qs[: a.queries]
    print(f"machine load average at start: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as d:
        store = memkern.MemoryStore(d, dim=emb.dim, fsync="never")
        rmm = memkern.RMM(store, embedder=emb, persist=False, explore=False)
        t0 = time.perf_counter()
        n_turns = 0
        for turns, sid, date in sess:
            rmm.end_session(turns, session_id=sid, date=date)
            n_turns += len(turns)
        build = time.perf_counter() - t0
        if isinstance(emb, CachedEmbedder):
            emb.flush()
        nt = store.count("default", level="turn")
        print(f"bank: {nt} turn records, {store.count('default')} topics, built in {build:.1f} s "
              f"({build / n_turns * 1e3:.2f} ms per turn, embeddings {'cached' if a.embedder == 'minilm' else 'hashed'})")
        Q = np.asarray(emb.encode(qs, kind="query"), np.float32)
        for q in qs[:10]:
            rmm.retrieve(q, turns=10)
        rows: dict[str, list] = {}
        for _ in range(a.repeats):
            for b in (5, 10, 20, None):
                ts = []
                for q in qs:
                    got = rmm.retrieve(q, turns=b)
                    ts.append((got.timings["total"] - got.timings["embed"]) * 1e3)
                rows.setdefault(f"retrieve(turns={b})", []).append(np.percentile(ts, [50, 90]))
            # the learned residual's cost: the same read without it (a fresh reranker: the same turns)
            import memkern.loops.rmm.retrieve as R

            keep, ts = R._learned_residual, []
            R._learned_residual = lambda ids, sel: None
            try:
                for q in qs:
                    got = rmm.retrieve(q, turns=10)
                    ts.append((got.timings["total"] - got.timings["embed"]) * 1e3)
                    want = got.all_turn_ids
                    R._learned_residual = keep
                    assert rmm.retrieve(q, turns=10).all_turn_ids == want, q
                    R._learned_residual = lambda ids, sel: None
            finally:
                R._learned_residual = keep
            rows.setdefault("retrieve(turns=10) without the residual", []).append(np.percentile(ts, [50, 90]))
            for name, kw in (("store turn search (default stage)", None), ("bare dense search k=80", {})):
                ts = []
                for i, q in enumerate(qs):
                    args = rmm._first_stage(q, 10, {}) if kw is None else {}
                    t1 = time.perf_counter()
                    store.search("default", Q[i:i + 1], k=80, level="turn+topic" if kw is None else "turn", **args)
                    ts.append((time.perf_counter() - t1) * 1e3)
                rows.setdefault(name, []).append(np.percentile(ts, [50, 90]))
        bare = min(v[0] for v in rows["bare dense search k=80"])
        print(f"\n{nt} turn records, {len(qs)} questions, {a.repeats} passes (best p50, median p90), "
              f"ms beyond the query embedding:")
        print(f"{'':36s}{'p50':>8}{'p90':>8}{'p50 / bare dense':>18}")
        for k, v in rows.items():
            v = np.asarray(v)
            print(f"{k:36s}{v[:, 0].min():8.3f}{np.median(v[:, 1]):8.3f}{v[:, 0].min() / bare:18.1f}")
        print(f"machine load average at end: {os.getloadavg()}")
        store.close()
    if a.embedder == "minilm":
        from memkern.models import Embedder

        real = Embedder()
        real.encode(["warm up"], kind="passage")
        part = sess[:4]
        n = sum(len(t) for t, _, _ in part)
        with tempfile.TemporaryDirectory() as d:
            store = memkern.MemoryStore(d, dim=real.dim)
            rmm = memkern.RMM(store, embedder=real, persist=False)
            t0 = time.perf_counter()
            for turns, sid, date in part:
                rmm.end_session(turns, session_id=sid, date=date)
            t_end = time.perf_counter() - t0
            texts = [rmm.turn_template.render_turn({**t, "date": date}) for turns, _, date in part for t in turns]
            t0 = time.perf_counter()
            real.encode(texts, kind="passage")
            t_once = time.perf_counter() - t0
            store.close()
        print(f"\nend_session, real MiniLM, {len(part)} sessions, {n} turns: {t_end / n * 1e3:.1f} ms per turn; "
              f"embedding the templated turns once: {t_once / n * 1e3:.1f} ms per turn; ratio {t_end / t_once:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
