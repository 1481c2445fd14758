"""Time-aware retrieval without a model (:mod:`memkern.timeexpr`) on LoCoMo: what the time term buys.

Every question of the given LoCoMo conversations is parsed (:func:`memkern.timeexpr.parse_time`,
``now`` = the conversation's latest session date); the turns of its conversation are ranked by a
first stage and the time term is added:

* first stages: ``hybrid`` (the store's default hybrid search, coverage fusion, over templated turn
  texts and templated turn vectors, every turn scored: :class:`memkern.InMemoryStore`) and
  ``dense`` (cosine of the templated turns);
* ``hard``: only turns whose session date lies in the question's window ``[start, end + lag)``;
* ``soft``: ``+ weight * 2 ** (-d / width)``, ``d`` the distance of the turn's session date to the
  window (the store's recency prior measured from a window, ``now=(start, end + lag)``);
* ``soft+mention``: the same, ``d`` the smaller of the session date's distance and the distance of
  the time the turn itself mentions ("last night", "in March", parsed with the session date as
  ``now``) to the question's range;
* ``anchor``: questions with an event anchor ("after the charity race") first search the anchor
  phrase; the best turn's session date places the anchor (:meth:`TimeQuery.resolve`), then ``soft``;
* ``order``: "recently" / "latest": a recency prior from ``now``; "first time": from the first session;
* ``intent``: questions asking *for* a time ("When did ...?") add ``+ weight`` to turns that mention
  a time.

Recall at 5 / 10 / 20 turns (share of a question's evidence turns among the first N) per
question group, with the gain of each variant over its first stage, and a per-question paired
bootstrap interval (95%, 2000 resamples) on the gain.

Run: ``OMP_NUM_THREADS=1 python bench/bench_time.py --locomo /path/conv-26.json /path/conv-30.json
/path/conv-41.json [--write-section]`` (one LoCoMo conversation per file, or a locomo10-style list).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

BUDGETS = (5, 10, 20)
DAY = 86400.0
CANDIDATES = 80  # RMM's first stage returns 4 * top_k turns


def load_conversations(paths: list[str]):
    """LoCoMo files (one conversation at the top level, or a list of samples) as one Dataset."""
    from memkern.data.locomo import parse_locomo

    samples = []
    for p in paths:
        data = json.loads(Path(p).read_text(encoding="utf-8"))
        items = data if isinstance(data, list) else [data]
        for it in items:
            if "conversation" not in it:  # one conversation at the top level
                conv = {k: v for k, v in it.items() if k != "qa"}
                it = {"sample_id": Path(p).stem, "conversation": conv, "qa": it.get("qa", [])}
            samples.append(it)
    return parse_locomo(samples, name="locomo")


@dataclass
class Conv:
    """Per conversation: turns, their times, first-stage scores and the parsed questions."""

    tid: list[str]
    session_t: np.ndarray          # float64 [T] session date (unix s)
    mention: np.ndarray            # float64 [T, 2] range the turn mentions (NaN: none)
    scores: dict[str, np.ndarray]  # first stage -> float64 [Q, T]
    anchor_scores: dict[str, np.ndarray]  # first stage -> [Q, T] scores of the anchor phrase (NaN rows: no anchor)
    questions: list[Any]
    parsed: list[Any]
    now: float
    first: float


def prepare(ds, emb) -> list[Conv]:
    from memkern.inmemory import InMemoryStore
    from memkern.template import TurnTemplate, event_seconds
    from memkern.timeexpr import parse_time

    tpl = TurnTemplate()
    out = []
    for c in ds.conversations:
        qs = [q for q in c.questions if q.evidence_turn_ids]
        flat = [(t, s) for s in c.sessions for t in s.turns]
        tid = [t.turn_id for t, _ in flat]
        st = np.array([event_seconds(s.date) for _, s in flat], dtype=np.float64)
        mention = np.full((len(flat), 2), np.nan)
        for i, (t, s) in enumerate(flat):
            tq = parse_time(t.content, st[i])
            if tq.has_range:
                mention[i] = [tq.start if tq.start is not None else -1e12, tq.end if tq.end is not None else 1e12]
        texts = [tpl.render(t.content, t.speaker, s.date) for t, s in flat]
        e_t = emb.encode(texts)
        now = float(st.max())
        parsed = [parse_time(q.question, now) for q in qs]
        qtexts = [q.question for q in qs]
        qe = emb.encode(qtexts, kind="query")
        store = InMemoryStore(int(e_t.shape[1]), "cos")
        ids = np.asarray(store.add_batch("t", texts, e_t), dtype=np.int64)
        pos = np.full(int(ids.max()) + 1, -1, np.int64)
        pos[ids] = np.arange(len(ids))

        def hybrid(qv, qt):
            s = np.full((len(qt), len(ids)), -np.inf)
            got, sc = store.search("t", qv, k=len(ids), mode="hybrid", texts=list(qt))
            ok = got >= 0
            qi = np.broadcast_to(np.arange(len(qt))[:, None], got.shape)
            s[qi[ok], pos[got[ok]]] = sc[ok]
            return s

        scores = {"hybrid": hybrid(qe, qtexts), "dense": (qe @ e_t.T).astype(np.float64)}
        anc = [i for i, p in enumerate(parsed) if p.anchor is not None]
        a_scores = {k: np.full_like(scores["dense"], np.nan) for k in ("hybrid", "dense", "lexical")}
        if anc:
            atexts = [parsed[i].anchor for i in anc]
            ae = emb.encode(atexts, kind="query")
            a_scores["hybrid"][anc] = hybrid(ae, atexts)
            a_scores["dense"][anc] = ae @ e_t.T
            lx = np.zeros((len(anc), len(ids)))
            got, sc = store.search("t", None, k=len(ids), mode="lexical", texts=atexts)
            for r in range(len(anc)):
                ok = got[r] >= 0
                lx[r, pos[got[r][ok]]] = sc[r][ok]
            a_scores["lexical"][anc] = lx
        out.append(Conv(tid, st, mention, scores, a_scores, qs, parsed, now, float(st.min())))
    return out


def _interval_dist(lo: np.ndarray, hi: np.ndarray, a: float, b: float) -> np.ndarray:
    """Distance between intervals [lo, hi] (arrays) and [a, b] (0 when they overlap)."""
    return np.maximum(np.maximum(a - hi, lo - b), 0.0)


def time_term(cv: Conv, qi: int, variant: dict) -> np.ndarray | None:
    """float64 [T] to add to the first-stage scores (-inf drops a turn), or None (no change)."""
    p = cv.parsed[qi]
    kind = variant["kind"]
    if kind == "combo":  # every term that applies, each with its own weight
        terms = [time_term(cv, qi, dict(variant, kind=k, weight=w)) for k, w in variant["parts"].items()]
        terms = [x for x in terms if x is not None]
        return sum(terms) if terms else None
    w, width, lag = variant.get("weight", 0.2), variant.get("width", 14 * DAY), variant.get("lag", 14 * DAY)
    t = cv.session_t
    if kind == "intent":
        if not p.intent or p.has_range:
            return None
        return w * (~np.isnan(cv.mention[:, 0])).astype(np.float64)
    if kind == "order":
        if p.has_range or p.order is None:
            return None
        ref = cv.now if p.order == "latest" else cv.first
        return w * np.exp2(-np.abs(ref - t) / width)
    if kind == "anchor":
        if p.has_range or p.anchor is None:
            return None
        a = cv.anchor_scores[variant.get("via", variant["stage"])][qi]
        if not np.isfinite(a).any() or np.nanmax(a) <= 0 and variant.get("via") == "lexical":
            return None
        ta = float(t[int(np.nanargmax(a))])
        p = p.resolve(ta)
        return w * p.prior(t, width=width, lag=lag).astype(np.float64)
    if not p.has_range:
        return None
    if kind == "hard":
        lo, hi = p.window(lag)
        lo = -np.inf if lo is None else lo
        hi = np.inf if hi is None else hi
        keep = (t >= lo) & (t < hi)
        if variant.get("fallback") and keep.sum() < variant["fallback"]:
            return None
        return np.where(keep, 0.0, -np.inf)
    prior = p.prior(t, width=width, lag=lag).astype(np.float64)
    if kind == "soft+mention":
        a = -1e12 if p.start is None else p.start
        b = 1e12 if p.end is None else p.end
        d = _interval_dist(cv.mention[:, 0], cv.mention[:, 1], a, b)
        pm = np.where(np.isnan(d), 0.0, np.exp2(-np.nan_to_num(d, nan=0.0) / width))
        prior = np.maximum(prior, pm)
    return w * prior


def recall(order: np.ndarray, tid: list[str], ev: list[str], n: int, valid: np.ndarray) -> float:
    top = [tid[j] for j in order[:n] if valid[j]]
    return sum(1 for e in ev if e in top) / len(ev)


def evaluate(convs: list[Conv], stage: str, variant: dict | None) -> list[dict]:
    """Per question: recall at each budget, category, and whether the term applied."""
    rows = []
    for cv in convs:
        S = cv.scores[stage]
        for qi, q in enumerate(cv.questions):
            s = S[qi].copy()
            applied = False
            # the term reorders the first stage's best `candidates` turns, scaled by their spread
            cand = np.argsort(-s, kind="stable")[:CANDIDATES]
            p = cv.parsed[qi]
            if variant is not None and variant.get("window_k") and p.has_range:
                # plus the best turns inside the window (a second, filtered search)
                lo, hi = p.window(variant.get("lag", 0.0))
                inw = (cv.session_t >= (-np.inf if lo is None else lo)) & (cv.session_t < (np.inf if hi is None else hi))
                sw = np.where(inw, s, -np.inf)
                extra = np.argsort(-sw, kind="stable")[: variant["window_k"]]
                cand = np.union1d(cand, extra[np.isfinite(sw[extra])])
            keep = np.full(len(s), -np.inf)
            keep[cand] = 0.0
            s = s + keep
            if variant is not None:
                v = dict(variant, stage=stage)
                term = time_term(cv, qi, v)
                if term is not None:
                    spread = float(s[cand].max() - s[cand].min())
                    s = s + (term * spread if variant.get("scaled", True) else term)
                    applied = True
            order = np.argsort(-s, kind="stable")
            valid = np.isfinite(s[order])
            valid_full = np.zeros(len(s), bool)
            valid_full[order] = valid
            r = {f"R@{b}": recall(order, cv.tid, q.evidence_turn_ids, b, valid_full) for b in BUDGETS}
            r |= {"cat": q.question_type, "applied": applied, "expr": cv.parsed[qi].found,
                  "range": cv.parsed[qi].has_range, "qid": q.question_id}
            rows.append(r)
    return rows


def bootstrap(diff: np.ndarray, n: int = 2000, seed: int = 0) -> tuple[float, float]:
    if len(diff) == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(diff), size=(n, len(diff)))
    m = diff[idx].mean(axis=1)
    return float(np.quantile(m, 0.025)), float(np.quantile(m, 0.975))


GROUPS = {
    "category 2, with a time range": lambda r: r["cat"] == "category_2" and r["range"],
    "category 2, all": lambda r: r["cat"] == "category_2",
    "all, with a time range": lambda r: r["range"],
    "all, with any time cue": lambda r: r["expr"],
    "all questions": lambda r: True,
}


def summarize(base: list[dict], var: list[dict], group) -> dict:
    idx = [i for i, r in enumerate(base) if group(r)]
    out = {"n": len(idx), "applied": sum(var[i]["applied"] for i in idx)}
    for b in BUDGETS:
        k = f"R@{b}"
        bb = np.array([base[i][k] for i in idx])
        vv = np.array([var[i][k] for i in idx])
        out[k] = float(vv.mean()) if len(idx) else float("nan")
        out[f"base {k}"] = float(bb.mean()) if len(idx) else float("nan")
        out[f"d{k}"] = float((vv - bb).mean()) if len(idx) else float("nan")
        out[f"ci{k}"] = bootstrap(vv - bb)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--locomo", nargs="+", required=True, metavar="PATH")
    ap.add_argument("--grid", action="store_true", help="print the weight / width / lag grid")
    ap.add_argument("--write-section", action="store_true")
    ap.add_argument("--out", default=None, help="folder for the raw JSON (default bench/results)")
    args = ap.parse_args(argv)
    from memkern.eval.units import CachedEmbedder

    t0 = time.perf_counter()
    ds = load_conversations(args.locomo)
    emb = CachedEmbedder()
    convs = prepare(ds, emb)
    emb.flush()
    print(f"prepared {len(convs)} conversations in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    for stage in ("hybrid", "dense"):
        base = evaluate(convs, stage, None)
        print(f"\n== first stage: {stage}")
        variants = [("hard lag0", dict(kind="hard", lag=0)), ("hard lag14", dict(kind="hard", lag=14 * DAY)),
                    ("hard lag31", dict(kind="hard", lag=31 * DAY)),
                    ("soft", dict(kind="soft")), ("soft+mention", dict(kind="soft+mention")),
                    ("anchor", dict(kind="anchor")), ("anchor lexical", dict(kind="anchor", via="lexical")), ("order", dict(kind="order")), ("intent", dict(kind="intent")),
                    ("combo", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.3}, width=7 * DAY,
                                   lag=7 * DAY)),
                    ("combo+anchor", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.3, "anchor": 0.3},
                                          width=7 * DAY, lag=7 * DAY, via="lexical")),
                    ("combo+anchor wk20", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.3, "anchor": 0.3},
                                               width=7 * DAY, lag=7 * DAY, via="lexical", window_k=20)),
                    ("cgrid r0.3 i0.2 wd3 lag0", dict(kind="combo", parts={"soft+mention": 0.3, "intent": 0.2, "anchor": 0.3},
                                          width=3 * DAY, lag=0 * DAY, via="lexical")),
                    ("cgrid r0.3 i0.2 wd3 lag7", dict(kind="combo", parts={"soft+mention": 0.3, "intent": 0.2, "anchor": 0.3},
                                          width=3 * DAY, lag=7 * DAY, via="lexical")),
                    ("cgrid r0.3 i0.2 wd3 lag14", dict(kind="combo", parts={"soft+mention": 0.3, "intent": 0.2, "anchor": 0.3},
                                          width=3 * DAY, lag=14 * DAY, via="lexical")),
                    ("cgrid r0.3 i0.2 wd7 lag0", dict(kind="combo", parts={"soft+mention": 0.3, "intent": 0.2, "anchor": 0.3},
                                          width=7 * DAY, lag=0 * DAY, via="lexical")),
                    ("cgrid r0.3 i0.2 wd7 lag7", dict(kind="combo", parts={"soft+mention": 0.3, "intent": 0.2, "anchor": 0.3},
                                          width=7 * DAY, lag=7 * DAY, via="lexical")),
                    ("cgrid r0.3 i0.2 wd7 lag14", dict(kind="combo", parts={"soft+mention": 0.3, "intent": 0.2, "anchor": 0.3},
                                          width=7 * DAY, lag=14 * DAY, via="lexical")),
                    ("cgrid r0.3 i0.2 wd14 lag0", dict(kind="combo", parts={"soft+mention": 0.3, "intent": 0.2, "anchor": 0.3},
                                          width=14 * DAY, lag=0 * DAY, via="lexical")),
                    ("cgrid r0.3 i0.2 wd14 lag7", dict(kind="combo", parts={"soft+mention": 0.3, "intent": 0.2, "anchor": 0.3},
                                          width=14 * DAY, lag=7 * DAY, via="lexical")),
                    ("cgrid r0.3 i0.2 wd14 lag14", dict(kind="combo", parts={"soft+mention": 0.3, "intent": 0.2, "anchor": 0.3},
                                          width=14 * DAY, lag=14 * DAY, via="lexical")),
                    ("cgrid r0.3 i0.3 wd3 lag0", dict(kind="combo", parts={"soft+mention": 0.3, "intent": 0.3, "anchor": 0.3},
                                          width=3 * DAY, lag=0 * DAY, via="lexical")),
                    ("cgrid r0.3 i0.3 wd3 lag7", dict(kind="combo", parts={"soft+mention": 0.3, "intent": 0.3, "anchor": 0.3},
                                          width=3 * DAY, lag=7 * DAY, via="lexical")),
                    ("cgrid r0.3 i0.3 wd3 lag14", dict(kind="combo", parts={"soft+mention": 0.3, "intent": 0.3, "anchor": 0.3},
                                          width=3 * DAY, lag=14 * DAY, via="lexical")),
                    ("cgrid r0.3 i0.3 wd7 lag0", dict(kind="combo", parts={"soft+mention": 0.3, "intent": 0.3, "anchor": 0.3},
                                          width=7 * DAY, lag=0 * DAY, via="lexical")),
                    ("cgrid r0.3 i0.3 wd7 lag7", dict(kind="combo", parts={"soft+mention": 0.3, "intent": 0.3, "anchor": 0.3},
                                          width=7 * DAY, lag=7 * DAY, via="lexical")),
                    ("cgrid r0.3 i0.3 wd7 lag14", dict(kind="combo", parts={"soft+mention": 0.3, "intent": 0.3, "anchor": 0.3},
                                          width=7 * DAY, lag=14 * DAY, via="lexical")),
                    ("cgrid r0.3 i0.3 wd14 lag0", dict(kind="combo", parts={"soft+mention": 0.3, "intent": 0.3, "anchor": 0.3},
                                          width=14 * DAY, lag=0 * DAY, via="lexical")),
                    ("cgrid r0.3 i0.3 wd14 lag7", dict(kind="combo", parts={"soft+mention": 0.3, "intent": 0.3, "anchor": 0.3},
                                          width=14 * DAY, lag=7 * DAY, via="lexical")),
                    ("cgrid r0.3 i0.3 wd14 lag14", dict(kind="combo", parts={"soft+mention": 0.3, "intent": 0.3, "anchor": 0.3},
                                          width=14 * DAY, lag=14 * DAY, via="lexical")),
                    ("cgrid r0.3 i0.5 wd3 lag0", dict(kind="combo", parts={"soft+mention": 0.3, "intent": 0.5, "anchor": 0.3},
                                          width=3 * DAY, lag=0 * DAY, via="lexical")),
                    ("cgrid r0.3 i0.5 wd3 lag7", dict(kind="combo", parts={"soft+mention": 0.3, "intent": 0.5, "anchor": 0.3},
                                          width=3 * DAY, lag=7 * DAY, via="lexical")),
                    ("cgrid r0.3 i0.5 wd3 lag14", dict(kind="combo", parts={"soft+mention": 0.3, "intent": 0.5, "anchor": 0.3},
                                          width=3 * DAY, lag=14 * DAY, via="lexical")),
                    ("cgrid r0.3 i0.5 wd7 lag0", dict(kind="combo", parts={"soft+mention": 0.3, "intent": 0.5, "anchor": 0.3},
                                          width=7 * DAY, lag=0 * DAY, via="lexical")),
                    ("cgrid r0.3 i0.5 wd7 lag7", dict(kind="combo", parts={"soft+mention": 0.3, "intent": 0.5, "anchor": 0.3},
                                          width=7 * DAY, lag=7 * DAY, via="lexical")),
                    ("cgrid r0.3 i0.5 wd7 lag14", dict(kind="combo", parts={"soft+mention": 0.3, "intent": 0.5, "anchor": 0.3},
                                          width=7 * DAY, lag=14 * DAY, via="lexical")),
                    ("cgrid r0.3 i0.5 wd14 lag0", dict(kind="combo", parts={"soft+mention": 0.3, "intent": 0.5, "anchor": 0.3},
                                          width=14 * DAY, lag=0 * DAY, via="lexical")),
                    ("cgrid r0.3 i0.5 wd14 lag7", dict(kind="combo", parts={"soft+mention": 0.3, "intent": 0.5, "anchor": 0.3},
                                          width=14 * DAY, lag=7 * DAY, via="lexical")),
                    ("cgrid r0.3 i0.5 wd14 lag14", dict(kind="combo", parts={"soft+mention": 0.3, "intent": 0.5, "anchor": 0.3},
                                          width=14 * DAY, lag=14 * DAY, via="lexical")),
                    ("cgrid r0.5 i0.2 wd3 lag0", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.2, "anchor": 0.5},
                                          width=3 * DAY, lag=0 * DAY, via="lexical")),
                    ("cgrid r0.5 i0.2 wd3 lag7", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.2, "anchor": 0.5},
                                          width=3 * DAY, lag=7 * DAY, via="lexical")),
                    ("cgrid r0.5 i0.2 wd3 lag14", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.2, "anchor": 0.5},
                                          width=3 * DAY, lag=14 * DAY, via="lexical")),
                    ("cgrid r0.5 i0.2 wd7 lag0", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.2, "anchor": 0.5},
                                          width=7 * DAY, lag=0 * DAY, via="lexical")),
                    ("cgrid r0.5 i0.2 wd7 lag7", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.2, "anchor": 0.5},
                                          width=7 * DAY, lag=7 * DAY, via="lexical")),
                    ("cgrid r0.5 i0.2 wd7 lag14", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.2, "anchor": 0.5},
                                          width=7 * DAY, lag=14 * DAY, via="lexical")),
                    ("cgrid r0.5 i0.2 wd14 lag0", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.2, "anchor": 0.5},
                                          width=14 * DAY, lag=0 * DAY, via="lexical")),
                    ("cgrid r0.5 i0.2 wd14 lag7", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.2, "anchor": 0.5},
                                          width=14 * DAY, lag=7 * DAY, via="lexical")),
                    ("cgrid r0.5 i0.2 wd14 lag14", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.2, "anchor": 0.5},
                                          width=14 * DAY, lag=14 * DAY, via="lexical")),
                    ("cgrid r0.5 i0.3 wd3 lag0", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.3, "anchor": 0.5},
                                          width=3 * DAY, lag=0 * DAY, via="lexical")),
                    ("cgrid r0.5 i0.3 wd3 lag7", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.3, "anchor": 0.5},
                                          width=3 * DAY, lag=7 * DAY, via="lexical")),
                    ("cgrid r0.5 i0.3 wd3 lag14", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.3, "anchor": 0.5},
                                          width=3 * DAY, lag=14 * DAY, via="lexical")),
                    ("cgrid r0.5 i0.3 wd7 lag0", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.3, "anchor": 0.5},
                                          width=7 * DAY, lag=0 * DAY, via="lexical")),
                    ("cgrid r0.5 i0.3 wd7 lag7", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.3, "anchor": 0.5},
                                          width=7 * DAY, lag=7 * DAY, via="lexical")),
                    ("cgrid r0.5 i0.3 wd7 lag14", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.3, "anchor": 0.5},
                                          width=7 * DAY, lag=14 * DAY, via="lexical")),
                    ("cgrid r0.5 i0.3 wd14 lag0", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.3, "anchor": 0.5},
                                          width=14 * DAY, lag=0 * DAY, via="lexical")),
                    ("cgrid r0.5 i0.3 wd14 lag7", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.3, "anchor": 0.5},
                                          width=14 * DAY, lag=7 * DAY, via="lexical")),
                    ("cgrid r0.5 i0.3 wd14 lag14", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.3, "anchor": 0.5},
                                          width=14 * DAY, lag=14 * DAY, via="lexical")),
                    ("cgrid r0.5 i0.5 wd3 lag0", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.5, "anchor": 0.5},
                                          width=3 * DAY, lag=0 * DAY, via="lexical")),
                    ("cgrid r0.5 i0.5 wd3 lag7", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.5, "anchor": 0.5},
                                          width=3 * DAY, lag=7 * DAY, via="lexical")),
                    ("cgrid r0.5 i0.5 wd3 lag14", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.5, "anchor": 0.5},
                                          width=3 * DAY, lag=14 * DAY, via="lexical")),
                    ("cgrid r0.5 i0.5 wd7 lag0", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.5, "anchor": 0.5},
                                          width=7 * DAY, lag=0 * DAY, via="lexical")),
                    ("cgrid r0.5 i0.5 wd7 lag7", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.5, "anchor": 0.5},
                                          width=7 * DAY, lag=7 * DAY, via="lexical")),
                    ("cgrid r0.5 i0.5 wd7 lag14", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.5, "anchor": 0.5},
                                          width=7 * DAY, lag=14 * DAY, via="lexical")),
                    ("cgrid r0.5 i0.5 wd14 lag0", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.5, "anchor": 0.5},
                                          width=14 * DAY, lag=0 * DAY, via="lexical")),
                    ("cgrid r0.5 i0.5 wd14 lag7", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.5, "anchor": 0.5},
                                          width=14 * DAY, lag=7 * DAY, via="lexical")),
                    ("cgrid r0.5 i0.5 wd14 lag14", dict(kind="combo", parts={"soft+mention": 0.5, "intent": 0.5, "anchor": 0.5},
                                          width=14 * DAY, lag=14 * DAY, via="lexical")),
                    ("cgrid r1.0 i0.2 wd3 lag0", dict(kind="combo", parts={"soft+mention": 1.0, "intent": 0.2, "anchor": 1.0},
                                          width=3 * DAY, lag=0 * DAY, via="lexical")),
                    ("cgrid r1.0 i0.2 wd3 lag7", dict(kind="combo", parts={"soft+mention": 1.0, "intent": 0.2, "anchor": 1.0},
                                          width=3 * DAY, lag=7 * DAY, via="lexical")),
                    ("cgrid r1.0 i0.2 wd3 lag14", dict(kind="combo", parts={"soft+mention": 1.0, "intent": 0.2, "anchor": 1.0},
                                          width=3 * DAY, lag=14 * DAY, via="lexical")),
                    ("cgrid r1.0 i0.2 wd7 lag0", dict(kind="combo", parts={"soft+mention": 1.0, "intent": 0.2, "anchor": 1.0},
                                          width=7 * DAY, lag=0 * DAY, via="lexical")),
                    ("cgrid r1.0 i0.2 wd7 lag7", dict(kind="combo", parts={"soft+mention": 1.0, "intent": 0.2, "anchor": 1.0},
                                          width=7 * DAY, lag=7 * DAY, via="lexical")),
                    ("cgrid r1.0 i0.2 wd7 lag14", dict(kind="combo", parts={"soft+mention": 1.0, "intent": 0.2, "anchor": 1.0},
                                          width=7 * DAY, lag=14 * DAY, via="lexical")),
                    ("cgrid r1.0 i0.2 wd14 lag0", dict(kind="combo", parts={"soft+mention": 1.0, "intent": 0.2, "anchor": 1.0},
                                          width=14 * DAY, lag=0 * DAY, via="lexical")),
                    ("cgrid r1.0 i0.2 wd14 lag7", dict(kind="combo", parts={"soft+mention": 1.0, "intent": 0.2, "anchor": 1.0},
                                          width=14 * DAY, lag=7 * DAY, via="lexical")),
                    ("cgrid r1.0 i0.2 wd14 lag14", dict(kind="combo", parts={"soft+mention": 1.0, "intent": 0.2, "anchor": 1.0},
                                          width=14 * DAY, lag=14 * DAY, via="lexical")),
                    ("cgrid r1.0 i0.3 wd3 lag0", dict(kind="combo", parts={"soft+mention": 1.0, "intent": 0.3, "anchor": 1.0},
                                          width=3 * DAY, lag=0 * DAY, via="lexical")),
                    ("cgrid r1.0 i0.3 wd3 lag7", dict(kind="combo", parts={"soft+mention": 1.0, "intent": 0.3, "anchor": 1.0},
                                          width=3 * DAY, lag=7 * DAY, via="lexical")),
                    ("cgrid r1.0 i0.3 wd3 lag14", dict(kind="combo", parts={"soft+mention": 1.0, "intent": 0.3, "anchor": 1.0},
                                          width=3 * DAY, lag=14 * DAY, via="lexical")),
                    ("cgrid r1.0 i0.3 wd7 lag0", dict(kind="combo", parts={"soft+mention": 1.0, "intent": 0.3, "anchor": 1.0},
                                          width=7 * DAY, lag=0 * DAY, via="lexical")),
                    ("cgrid r1.0 i0.3 wd7 lag7", dict(kind="combo", parts={"soft+mention": 1.0, "intent": 0.3, "anchor": 1.0},
                                          width=7 * DAY, lag=7 * DAY, via="lexical")),
                    ("cgrid r1.0 i0.3 wd7 lag14", dict(kind="combo", parts={"soft+mention": 1.0, "intent": 0.3, "anchor": 1.0},
                                          width=7 * DAY, lag=14 * DAY, via="lexical")),
                    ("cgrid r1.0 i0.3 wd14 lag0", dict(kind="combo", parts={"soft+mention": 1.0, "intent": 0.3, "anchor": 1.0},
                                          width=14 * DAY, lag=0 * DAY, via="lexical")),
                    ("cgrid r1.0 i0.3 wd14 lag7", dict(kind="combo", parts={"soft+mention": 1.0, "intent": 0.3, "anchor": 1.0},
                                          width=14 * DAY, lag=7 * DAY, via="lexical")),
                    ("cgrid r1.0 i0.3 wd14 lag14", dict(kind="combo", parts={"soft+mention": 1.0, "intent": 0.3, "anchor": 1.0},
                                          width=14 * DAY, lag=14 * DAY, via="lexical")),
                    ("cgrid r1.0 i0.5 wd3 lag0", dict(kind="combo", parts={"soft+mention": 1.0, "intent": 0.5, "anchor": 1.0},
                                          width=3 * DAY, lag=0 * DAY, via="lexical")),
                    ("cgrid r1.0 i0.5 wd3 lag7", dict(kind="combo", parts={"soft+mention": 1.0, "intent": 0.5, "anchor": 1.0},
                                          width=3 * DAY, lag=7 * DAY, via="lexical")),
                    ("cgrid r1.0 i0.5 wd3 lag14", dict(kind="combo", parts={"soft+mention": 1.0, "intent": 0.5, "anchor": 1.0},
                                          width=3 * DAY, lag=14 * DAY, via="lexical")),
                    ("cgrid r1.0 i0.5 wd7 lag0", dict(kind="combo", parts={"soft+mention": 1.0, "intent": 0.5, "anchor": 1.0},
                                          width=7 * DAY, lag=0 * DAY, via="lexical")),
                    ("cgrid r1.0 i0.5 wd7 lag7", dict(kind="combo", parts={"soft+mention": 1.0, "intent": 0.5, "anchor": 1.0},
                                          width=7 * DAY, lag=7 * DAY, via="lexical")),
                    ("cgrid r1.0 i0.5 wd7 lag14", dict(kind="combo", parts={"soft+mention": 1.0, "intent": 0.5, "anchor": 1.0},
                                          width=7 * DAY, lag=14 * DAY, via="lexical")),
                    ("cgrid r1.0 i0.5 wd14 lag0", dict(kind="combo", parts={"soft+mention": 1.0, "intent": 0.5, "anchor": 1.0},
                                          width=14 * DAY, lag=0 * DAY, via="lexical")),
                    ("cgrid r1.0 i0.5 wd14 lag7", dict(kind="combo", parts={"soft+mention": 1.0, "intent": 0.5, "anchor": 1.0},
                                          width=14 * DAY, lag=7 * DAY, via="lexical")),
                    ("cgrid r1.0 i0.5 wd14 lag14", dict(kind="combo", parts={"soft+mention": 1.0, "intent": 0.5, "anchor": 1.0},
                                          width=14 * DAY, lag=14 * DAY, via="lexical")),
                    ]
        if args.grid:
            for kind in ("soft", "soft+mention"):
                for w in (0.05, 0.1, 0.2, 0.3, 0.5):
                    for width in (3, 7, 14, 30):
                        for lag in (0, 7, 14, 31):
                            variants.append((f"{kind} w{w} width{width} lag{lag}",
                                             dict(kind=kind, weight=w, width=width * DAY, lag=lag * DAY)))
            for kind in ("intent", "order", "anchor", "anchor lexical"):
                for w in (0.02, 0.05, 0.1, 0.2, 0.3, 0.5):
                    variants.append((f"{kind} w{w}", dict(kind=kind.split()[0], weight=w,
                                                         **({"via": "lexical"} if "lexical" in kind else {}))))
        for name, v in variants:
            var = evaluate(convs, stage, v)
            parts = []
            for g, f in GROUPS.items():
                s = summarize(base, var, f)
                parts.append(f"{g[:14]}(n{s['n']},a{s['applied']}) " + " ".join(
                    f"{s['base R@' + str(b)]:.3f}{s['dR@' + str(b)]:+.3f}" for b in BUDGETS))
            print(f"{name:<34}" + " | ".join(parts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
