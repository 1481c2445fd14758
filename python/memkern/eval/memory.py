"""Memory retrieval experiments (RMM paper's shape, run offline).

Experiments, each a function returning a JSON-able dict (``config``, ``dataset``, ``metrics``,
``timings``) and usable from Python or ``memkern eval memory``:

- :func:`run_granularity`: retrieval keyed by turn, session, a mix of both, 4-turn chunks, and
  prospective-reflection topics (``"embedding"`` and ``"llm"`` extractors from
  :mod:`memkern.extract`); Recall@5/@10 and NDCG@5 of evidence turns per unit, Recall at equal
  budgets of 5/10/20 turns, mean turns and tokens per retrieved unit.
- :func:`run_turn_in_topic`: each turn scored ``cos(q, turn) + alpha * cos(q, parent)`` where the
  parent is the turn's topic (embedding extractor) or 4-turn chunk, vs plain turns (``alpha=0``),
  at equal budgets.
- :func:`run_reflection`: retrospective reflection offline. Candidates = top-K turns of the
  frozen retriever; the real :class:`memkern.Reranker` selects top-M, citations are simulated from
  the evidence labels (a useful memory cited with ``p_useful``, a useless one with
  ``p_useless``), rewards +1 / -1 train it online over one stream of questions; Recall@5 is
  measured on held-back questions it never trained on (before, during: learning curve, after).
- :func:`run_collapse`: many updates (default 10,000) per optimizer and learning rate; held-back
  Recall@5 and adapter norm along the way.
- :func:`run_rmm`: the full :class:`memkern.RMM` loop with a real chat model on a small slice.

Retrieval here is exact: cosine similarity of L2-normalised MiniLM embeddings over all units of
the question's conversation (numpy), so that the numbers measure granularity and learning, not
approximate search. Embeddings are cached on disk keyed by (model, kind, text) hash.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..data.schema import Conversation, Dataset
from ..errors import MemkernValueError, bad_arg
from .metrics import mean_std, ndcg_at_k, recall_at_budget, recall_at_k

log = logging.getLogger("memkern")

__all__ = ["CachedEmbedder", "build_units", "run_granularity", "run_turn_in_topic", "run_reflection",
           "run_collapse", "run_rmm", "load_dataset", "write_result", "format_table", "aggregate",
           "format_aggregate", "GRANULARITIES"]

GRANULARITIES = ("turn", "session", "mix", "chunk4", "topic-embedding", "topic-llm")
BUDGETS = (5, 10, 20)


# ============================================================================================
# Embeddings with an on-disk cache
# ============================================================================================
def default_cache_dir() -> Path:
    """Embedding cache of the experiments (under :func:`memkern.paths.cache_dir`)."""
    from ..paths import cache_dir

    return cache_dir("eval-embeddings")


class CachedEmbedder:
    """Wrap an embedder (``encode(texts, kind) -> float32 [n, d]``) with a disk cache.

    Vectors are keyed by sha1(model name, kind, text) and kept in one ``.npz`` per model under
    ``cache_dir`` (written by :meth:`flush`, and automatically every ``flush_every`` new vectors).
    ``cache_dir=None`` disables the disk (memory cache only).
    """

    def __init__(self, embedder: Any = None, cache_dir: str | os.PathLike | None = "default",
                 flush_every: int = 4096, progress: bool = False):
        if embedder is None:
            from ..models import Embedder

            embedder = Embedder()
        self.embedder = embedder
        self.model_name = str(getattr(embedder, "model_name", type(embedder).__name__))
        self.progress = progress
        self.dim = int(embedder.dim)
        self._mem: dict[str, np.ndarray] = {}
        self._new = 0
        self.flush_every = int(flush_every)
        self.path: Path | None = None
        self.hits = 0
        self.misses = 0
        if cache_dir is not None:
            d = default_cache_dir() if cache_dir == "default" else Path(cache_dir)
            tag = hashlib.sha1(self.model_name.encode()).hexdigest()[:12]
            self.path = d / f"emb-{tag}-{self.dim}.npz"
            if self.path.exists():
                try:
                    z = np.load(self.path)
                    keys, vecs = z["keys"], z["vecs"]
                    self._mem = {str(k): vecs[i] for i, k in enumerate(keys)}
                except Exception as e:  # a broken cache is rebuilt, never trusted
                    log.warning("embedding cache %s unreadable (%s); starting empty", self.path, e)

    @staticmethod
    def _key(model: str, kind: str, text: str) -> str:
        return hashlib.sha1(f"{model}\x00{kind}\x00{text}".encode("utf-8")).hexdigest()

    def encode(self, texts: Sequence[str], kind: str = "passage", **kw: Any) -> np.ndarray:
        """float32 ``[n, d]``, L2-normalised rows; only texts not in the cache are embedded."""
        texts = list(texts)
        keys = [self._key(self.model_name, kind, t) for t in texts]
        todo: dict[str, str] = {}
        for k, t in zip(keys, texts):
            if k not in self._mem and k not in todo:
                todo[k] = t
        self.hits += len(texts) - len(todo)
        self.misses += len(todo)
        if todo:
            vecs = np.asarray(self.embedder.encode(list(todo.values()), kind=kind,
                                                   progress=self.progress and len(todo) > 256), dtype=np.float32)
            vecs = vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
            for k, v in zip(todo, vecs):
                self._mem[k] = v
            self._new += len(todo)
            if self._new >= self.flush_every:
                self.flush()
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        return np.stack([self._mem[k] for k in keys]).astype(np.float32, copy=False)

    def flush(self) -> None:
        if self.path is None or self._new == 0:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        keys = np.array(list(self._mem), dtype="U40")
        vecs = np.stack(list(self._mem.values())).astype(np.float32)
        tmp = self.path.with_suffix(".tmp.npz")
        np.savez(tmp, keys=keys, vecs=vecs)
        os.replace(tmp, self.path)
        self._new = 0

    def count_tokens(self, text: str) -> int:
        tok = getattr(self.embedder, "tokenizer", None)
        if tok is None:
            return len(text.split())
        return len(tok(text, add_special_tokens=False)["input_ids"])


# ============================================================================================
# Units
# ============================================================================================
@dataclass
class Units:
    """The retrievable units of one conversation at one granularity.

    ``turn_ids[j]``: the turn ids unit ``j`` contains (in dialogue order); ``texts[j]``: the text
    its key embedding is computed from (a turn's content, ``role: content`` lines for sessions and
    chunks, the summary for topics); ``emb``: float32 ``[U, d]``, L2-normalised rows.
    """

    turn_ids: list[list[str]]
    texts: list[str]
    emb: np.ndarray | None = None


def _session_text(turns) -> str:
    return "\n".join(f"{t.role}: {t.content}" for t in turns)


def _topic_segments(conv: Conversation, extractor: Any, seed: int = 0) -> list[tuple[list[str], str]]:
    """(turn ids, summary) per topic, for every session of ``conv`` (one batched extractor call)."""
    sess_dicts = [[{"role": t.role, "content": t.content} for t in s.turns] for s in conv.sessions]
    topics = extractor.extract_batch(sess_dicts, seed=seed)
    out = []
    for s, tops in zip(conv.sessions, topics):
        covered: set[int] = set()
        for tp in tops:
            idx = sorted(i for i in tp.turns if 0 <= i < len(s.turns))
            covered.update(idx)
            if idx:
                out.append(([s.turns[i].turn_id for i in idx], tp.summary))
        # a turn no topic claims stays retrievable only through nothing: report it
        missing = [i for i in range(len(s.turns)) if i not in covered]
        if missing:
            log.debug("topics of %s leave %d turns uncovered", s.session_id, len(missing))
    return out


def build_units(conv: Conversation, granularity: str, emb: CachedEmbedder | None = None,
                extractor: Any = None, seed: int = 0) -> Units:
    """Units of ``conv`` at ``granularity`` (one of :data:`GRANULARITIES`), embedded if ``emb``."""
    if granularity == "turn":
        u = Units([[t.turn_id] for t in conv.turns()], [t.content for t in conv.turns()])
    elif granularity == "session":
        u = Units([[t.turn_id for t in s.turns] for s in conv.sessions if s.turns],
                  [_session_text(s.turns) for s in conv.sessions if s.turns])
    elif granularity == "mix":
        a, b = build_units(conv, "turn"), build_units(conv, "session")
        u = Units(a.turn_ids + b.turn_ids, a.texts + b.texts)
    elif granularity == "chunk4":
        ids, texts = [], []
        for s in conv.sessions:
            for i in range(0, len(s.turns), 4):
                ch = s.turns[i:i + 4]
                ids.append([t.turn_id for t in ch])
                texts.append(_session_text(ch))
        u = Units(ids, texts)
    elif granularity in ("topic-embedding", "topic-llm"):
        if extractor is None:
            raise bad_arg("extractor", f"an extractor for granularity {granularity!r}", None)
        segs = _topic_segments(conv, extractor, seed=seed)
        u = Units([s[0] for s in segs], [s[1] for s in segs])
    else:
        raise bad_arg("granularity", f"one of {GRANULARITIES}", granularity)
    if emb is not None:
        u.emb = emb.encode(u.texts, kind="passage") if u.texts else np.zeros((0, emb.dim), np.float32)
    return u


# ============================================================================================
# Datasets
# ============================================================================================
def load_dataset(source: str = "generated", path: str | None = None, *, users: int = 12, sessions: int = 30,
                 seed: int = 0, limit: int | None = None) -> Dataset:
    """``source``: ``"generated"`` (:func:`~memkern.data.generate_history`; args users/sessions/seed),
    ``"dialogues"`` (:func:`~memkern.data.generate_dialogues`; ``users`` = conversations), ``"longmemeval"``
    or ``"locomo"`` (path)."""
    from .. import data as D

    if source == "generated":
        return D.generate_history(users, sessions, seed=seed)
    if source == "dialogues":
        return D.generate_dialogues(users, sessions, seed=seed)
    if source in ("longmemeval", "locomo"):
        if not path:
            raise bad_arg("path", f"a {source} file", path)
        return D.load_longmemeval(path, limit=limit) if source == "longmemeval" else D.load_locomo(path, limit=limit)
    raise bad_arg("source", "'generated', 'dialogues', 'longmemeval' or 'locomo'", source)


def _dataset_info(ds: Dataset) -> dict[str, Any]:
    return dict(name=ds.name, hash=ds.content_hash(), conversations=len(ds.conversations), sessions=ds.n_sessions,
                turns=ds.n_turns, questions=ds.n_questions, meta=ds.meta)


def _questions(ds: Dataset, max_questions: int | None = None):
    out = [(c, q) for c, q in ds.questions() if q.evidence_turn_ids]
    skipped = ds.n_questions - len(out)
    if max_questions is not None:
        out = out[:max_questions]
    return out, skipped


def _progress(it, progress: bool, **kw):
    if not progress:
        return it
    from tqdm.auto import tqdm

    return tqdm(it, **kw)


def _make_extractor(kind: str, emb: CachedEmbedder, chat_model: Any = None, threshold: float = 0.3,
                    llm_max_new_tokens: int = 160):
    from ..extract import make_extractor

    if kind == "embedding":
        return make_extractor("embedding", embedder=emb, threshold=threshold)
    if chat_model is None:
        from ..models import ChatModel

        chat_model = ChatModel()
    return make_extractor("llm", chat_model=chat_model, max_new_tokens=llm_max_new_tokens)


# ============================================================================================
# Granularity
# ============================================================================================
def run_granularity(ds: Dataset, granularities: Sequence[str] = ("turn", "session", "mix", "chunk4", "topic-embedding"),
                    *, emb: CachedEmbedder | None = None, ks: Sequence[int] = (5, 10), budgets: Sequence[int] = BUDGETS,
                    topic_threshold: float = 0.3, chat_model: Any = None, llm_conversations: int = 1,
                    llm_max_new_tokens: int = 160, max_questions: int | None = None, progress: bool = False,
                    seed: int = 0) -> dict[str, Any]:
    """Recall@k, NDCG@5, Recall at equal turn budgets, turns/tokens per unit, per granularity.

    ``topic-llm`` runs on the first ``llm_conversations`` conversations only (CPU: a chat model
    call per session); its rows say how many questions they cover, and the other granularities are
    also reported on that same slice (``<name>@llm-slice``) so the comparison is like for like.
    """
    for g in granularities:
        if g not in GRANULARITIES:
            raise bad_arg("granularities", f"names from {GRANULARITIES}", g)
    emb = emb or CachedEmbedder()
    t_start = time.perf_counter()
    qs, skipped = _questions(ds, max_questions)
    timings: dict[str, float] = {}
    per_q: dict[str, list[dict[str, float]]] = {g: [] for g in granularities}
    unit_stats: dict[str, dict[str, list[float]]] = {g: {"turns": [], "tokens": [], "units": []} for g in granularities}
    by_conv: dict[str, list] = {}
    for c, q in qs:
        by_conv.setdefault(c.conversation_id, []).append(q)
    convs = [c for c in ds.conversations if c.conversation_id in by_conv]
    extractors: dict[str, Any] = {}
    llm_ids = {c.conversation_id for c in convs[:max(0, llm_conversations)]}
    tok_cache: dict[str, int] = {}
    turn_text = {}
    for c in convs:
        for t in c.turns():
            turn_text[(c.conversation_id, t.turn_id)] = t.content
    for c in _progress(convs, progress, desc="granularity", unit="conv"):
        questions = by_conv[c.conversation_id]
        qe = emb.encode([q.question for q in questions], kind="query")
        for g in granularities:
            if g == "topic-llm" and c.conversation_id not in llm_ids:
                continue
            t0 = time.perf_counter()
            ex = None
            if g.startswith("topic-"):
                kind = g.split("-", 1)[1]
                if kind not in extractors:
                    extractors[kind] = _make_extractor(kind, emb, chat_model, topic_threshold, llm_max_new_tokens)
                ex = extractors[kind]
            units = build_units(c, g, emb, ex, seed=seed)
            timings[f"build_{g}"] = timings.get(f"build_{g}", 0.0) + time.perf_counter() - t0
            unit_stats[g]["units"].append(len(units.turn_ids))
            if not units.turn_ids:
                continue
            t0 = time.perf_counter()
            S = qe @ units.emb.T  # [Q, U]
            order = np.argsort(-S, axis=1, kind="stable")
            for qi, q in enumerate(questions):
                ranked = [units.turn_ids[j] for j in order[qi]]
                row = {"question_type": q.question_type, "conversation": c.conversation_id}
                for k in ks:
                    row[f"recall@{k}"] = recall_at_k(ranked, q.evidence_turn_ids, k)
                row["ndcg@5"] = ndcg_at_k(ranked, q.evidence_turn_ids, 5, units.turn_ids)
                for b in budgets:
                    row[f"recall@{b}turns"] = recall_at_budget(ranked, q.evidence_turn_ids, b)
                per_q[g].append(row)
                for u in ranked[:5]:
                    unit_stats[g]["turns"].append(len(u))
                    key = "\x00".join(u)
                    if key not in tok_cache:
                        tok_cache[key] = emb.count_tokens(" ".join(turn_text[(c.conversation_id, t)] for t in u))
                    unit_stats[g]["tokens"].append(tok_cache[key])
            timings[f"score_{g}"] = timings.get(f"score_{g}", 0.0) + time.perf_counter() - t0
    emb.flush()
    metrics: dict[str, Any] = {}
    metric_names = [f"recall@{k}" for k in ks] + ["ndcg@5"] + [f"recall@{b}turns" for b in budgets]
    llm_slice_ids = llm_ids if "topic-llm" in granularities else set()
    for g in granularities:
        rows = per_q[g]
        m = {n: _mean([r[n] for r in rows]) for n in metric_names}
        m["questions"] = len(rows)
        m["turns_per_unit"] = _mean(unit_stats[g]["turns"])
        m["tokens_per_unit"] = _mean(unit_stats[g]["tokens"])
        m["units_per_conversation"] = _mean(unit_stats[g]["units"])
        m["by_type"] = _by_type(rows, metric_names)
        metrics[g] = m
        if llm_slice_ids and g != "topic-llm":
            sl = [r for r in rows if r["conversation"] in llm_slice_ids]
            metrics[f"{g}@llm-slice"] = {n: _mean([r[n] for r in sl]) for n in metric_names} | {"questions": len(sl)}
    timings["total"] = time.perf_counter() - t_start
    config = dict(experiment="granularity", granularities=list(granularities), ks=list(ks), budgets=list(budgets),
                  topic_threshold=topic_threshold, llm_conversations=llm_conversations,
                  max_questions=max_questions, retrieval="exact cosine (numpy) over the conversation's units",
                  embedder=emb.model_name, seed=seed)
    return dict(config=config, dataset=_dataset_info(ds) | {"skipped_no_evidence": skipped}, metrics=metrics,
                timings=timings, environment=_env())


def _mean(xs) -> float:
    v = [float(x) for x in xs if not (isinstance(x, float) and math.isnan(x))]
    return float(np.mean(v)) if v else math.nan


def _by_type(rows, names) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    types = sorted({r["question_type"] for r in rows})
    for t in types:
        sel = [r for r in rows if r["question_type"] == t]
        out[t] = {n: _mean([r[n] for r in sel]) for n in names} | {"questions": len(sel)}
    return out


# ============================================================================================
# Turn within topic
# ============================================================================================
def run_turn_in_topic(ds: Dataset, alphas: Sequence[float] = (0.0, 1.0, 2.0), parents: Sequence[str] = ("chunk4", "topic-embedding"),
                      *, emb: CachedEmbedder | None = None, budgets: Sequence[int] = BUDGETS, topic_threshold: float = 0.3,
                      max_questions: int | None = None, progress: bool = False, seed: int = 0) -> dict[str, Any]:
    """Turns ranked by ``cos(q, turn) + alpha * cos(q, parent unit)`` at equal budgets.

    ``alpha = 0`` is plain turn retrieval (the reference). Returns per (parent, alpha) the
    recall at each budget and the difference to plain turns.
    """
    for p in parents:
        if p not in ("chunk4", "session", "topic-embedding"):
            raise bad_arg("parents", "names from ('chunk4', 'session', 'topic-embedding')", p)
    emb = emb or CachedEmbedder()
    t_start = time.perf_counter()
    qs, skipped = _questions(ds, max_questions)
    by_conv: dict[str, list] = {}
    for c, q in qs:
        by_conv.setdefault(c.conversation_id, []).append(q)
    ex = _make_extractor("embedding", emb, threshold=topic_threshold) if "topic-embedding" in parents else None
    rows: dict[str, list[dict[str, float]]] = {}
    for c in _progress([c for c in ds.conversations if c.conversation_id in by_conv], progress, desc="turn-in-topic"):
        questions = by_conv[c.conversation_id]
        qe = emb.encode([q.question for q in questions], kind="query")
        turns = build_units(c, "turn", emb)
        tid = [u[0] for u in turns.turn_ids]
        pos = {t: i for i, t in enumerate(tid)}
        st = qe @ turns.emb.T  # [Q, T]
        for p in parents:
            pu = build_units(c, p, emb, ex, seed=seed)
            parent_of = np.full(len(tid), -1, dtype=np.int64)
            for j, ids in enumerate(pu.turn_ids):
                for t in ids:
                    if parent_of[pos[t]] < 0:
                        parent_of[pos[t]] = j
            sp = qe @ pu.emb.T  # [Q, P]
            # a turn no parent covers gets the parent score 0 (cosine of an unrelated text)
            ps = np.where(parent_of[None, :] >= 0, sp[:, np.maximum(parent_of, 0)], 0.0)
            for a in alphas:
                if a == 0 and p != parents[0]:
                    continue
                name = "turn" if a == 0 else f"turn+{a:g}*{p}"
                s = st + float(a) * ps
                order = np.argsort(-s, axis=1, kind="stable")
                for qi, q in enumerate(questions):
                    ranked = [[tid[j]] for j in order[qi][:max(budgets)]]
                    r = {f"recall@{b}turns": recall_at_budget(ranked, q.evidence_turn_ids, b) for b in budgets}
                    r["question_type"] = q.question_type
                    rows.setdefault(name, []).append(r)
    emb.flush()
    names = [f"recall@{b}turns" for b in budgets]
    metrics = {}
    base = {n: _mean([r[n] for r in rows.get("turn", [])]) for n in names}
    for name, rs in rows.items():
        m = {n: _mean([r[n] for r in rs]) for n in names}
        m |= {f"delta_{n}": m[n] - base[n] for n in names}
        m["questions"] = len(rs)
        m["by_type"] = _by_type(rs, names)
        metrics[name] = m
    config = dict(experiment="turn-in-topic", alphas=list(alphas), parents=list(parents), budgets=list(budgets),
                  topic_threshold=topic_threshold, embedder=emb.model_name, seed=seed,
                  retrieval="exact cosine (numpy); score = cos(q,turn) + alpha*cos(q,parent)")
    return dict(config=config, dataset=_dataset_info(ds) | {"skipped_no_evidence": skipped}, metrics=metrics,
                timings={"total": time.perf_counter() - t_start}, environment=_env())


# ============================================================================================
# Retrospective reflection (offline) and collapse
# ============================================================================================
@dataclass
class Candidates:
    """Top-K turn candidates of each question from the frozen retriever.

    q: float32 ``[N, d]``; cand: float32 ``[N, K, d]``; mask: bool ``[N, K]``; useful: bool
    ``[N, K]`` (candidate is an evidence turn); ev_count: int ``[N]`` (evidence turns of the
    question, also those outside the top-K); qtype: list of str; conv: list of str.
    """

    q: np.ndarray
    cand: np.ndarray
    mask: np.ndarray
    useful: np.ndarray
    ev_count: np.ndarray
    qtype: list[str]
    conv: list[str]


def build_candidates(ds: Dataset, emb: CachedEmbedder, k: int = 20, granularity: str = "turn",
                     max_questions: int | None = None, progress: bool = False) -> Candidates:
    """Candidates for the reranker experiments: the frozen retriever's top-``k`` turns."""
    if granularity != "turn":
        raise bad_arg("granularity", "'turn' (recall counts evidence turns per candidate)", granularity)
    qs, _ = _questions(ds, max_questions)
    by_conv: dict[str, list] = {}
    for c, q in qs:
        by_conv.setdefault(c.conversation_id, []).append(q)
    Q, C, M, U, E, T, V = [], [], [], [], [], [], []
    for c in _progress([c for c in ds.conversations if c.conversation_id in by_conv], progress, desc="candidates"):
        questions = by_conv[c.conversation_id]
        qe = emb.encode([q.question for q in questions], kind="query")
        units = build_units(c, granularity, emb)
        S = qe @ units.emb.T
        order = np.argsort(-S, axis=1, kind="stable")[:, :k]
        for qi, q in enumerate(questions):
            ev = set(q.evidence_turn_ids)
            idx = order[qi]
            cand = np.zeros((k, emb.dim), np.float32)
            mask = np.zeros(k, bool)
            useful = np.zeros(k, bool)
            cand[:len(idx)] = units.emb[idx]
            mask[:len(idx)] = True
            for j, u in enumerate(idx):
                useful[j] = any(t in ev for t in units.turn_ids[u])
            Q.append(qe[qi]); C.append(cand); M.append(mask); U.append(useful); E.append(len(ev))
            T.append(q.question_type); V.append(c.conversation_id)
    emb.flush()
    return Candidates(np.stack(Q), np.stack(C), np.stack(M), np.stack(U), np.array(E), T, V)


def _recall_of(sel_idx: np.ndarray, cands: Candidates, rows: np.ndarray) -> float:
    """Mean over ``rows`` of (evidence turns among the selected candidates) / (evidence turns)."""
    u = cands.useful[rows]  # [n, K]
    got = np.take_along_axis(u, np.maximum(sel_idx, 0), axis=1) & (sel_idx >= 0)
    return float(np.mean(got.sum(1) / np.maximum(cands.ev_count[rows], 1)))


def _split(cands: Candidates, test_frac: float, seed: int, by: str = "question") -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = len(cands.qtype)
    if by == "question":
        perm = rng.permutation(n)
        n_test = max(1, int(round(n * test_frac)))
        return np.sort(perm[n_test:]), np.sort(perm[:n_test])
    if by == "conversation":
        convs = sorted(set(cands.conv))
        perm = [convs[i] for i in rng.permutation(len(convs))]
        n_test = max(1, int(round(len(convs) * test_frac)))
        test_c = set(perm[:n_test])
        idx = np.arange(n)
        is_test = np.array([c in test_c for c in cands.conv])
        return idx[~is_test], idx[is_test]
    raise bad_arg("split", "'question' or 'conversation'", by)


def _make_reranker(dim: int, preset: str, top_m: int, seed: int, overrides: dict[str, Any] | None = None):
    from ..reranker import Reranker

    kw = dict(overrides or {})
    kw.setdefault("seed", seed)
    kw.setdefault("top_m", top_m)
    if preset == "default":
        return Reranker(dim, **kw)
    return Reranker.from_preset(preset, dim, **kw)


def _eval_reranker(rr, cands: Candidates, rows: np.ndarray, batch: int = 256) -> float:
    import torch

    got = []
    with torch.no_grad():
        for s in range(0, len(rows), batch):
            r = rows[s:s + batch]
            sel = rr.select(torch.from_numpy(cands.q[r]), torch.from_numpy(cands.cand[r]),
                            mask=torch.from_numpy(cands.mask[r]), greedy=True)
            got.append(sel.indices.cpu().numpy())
    return _recall_of(np.concatenate(got), cands, rows)


def _simulate_citations(sel_idx: np.ndarray, useful: np.ndarray, rng: np.random.Generator,
                        p_useful: float, p_useless: float) -> np.ndarray:
    """+1 (cited) / -1 (not cited) per selected slot; 0 on ``-1`` slots. ``useful``: ``[B, K]``."""
    u = np.take_along_axis(useful, np.maximum(sel_idx, 0), axis=1)
    p = np.where(u, p_useful, p_useless)
    cited = rng.random(sel_idx.shape) < p
    r = np.where(cited, 1.0, -1.0)
    return np.where(sel_idx >= 0, r, 0.0).astype(np.float32)


def train_online(rr, cands: Candidates, train: np.ndarray, test: np.ndarray, *, batch_size: int = 8, passes: float = 1.0,
                 steps: int | None = None, p_useful: float = 0.9, p_useless: float = 0.1, seed: int = 0,
                 eval_every: int | None = None, progress: bool = False) -> dict[str, Any]:
    """Train ``rr`` online on the ``train`` rows; returns the curve and final held-back Recall@5.

    The stream is the train rows in a seeded random order, repeated ``passes`` times (or cut /
    cycled to exactly ``steps`` updates). Each step: ``select`` (sampled, seeded), simulated
    citations, ``update``. ``eval_every`` > 0 records held-back Recall@5 every that many steps (None: ~20 points).
    """
    import torch

    rng = np.random.default_rng(seed + 7919)
    n_steps = steps if steps is not None else max(1, int(math.ceil(len(train) * passes / batch_size)))
    if eval_every is None:
        eval_every = max(1, n_steps // 20)
    stream: list[int] = []
    while len(stream) < n_steps * batch_size:
        stream.extend(rng.permutation(train).tolist())
    curve = [(0, _eval_reranker(rr, cands, test), rr.adapter_norm())]
    rewards_seen = []
    info: dict[str, Any] = {}
    t0 = time.perf_counter()
    for step in _progress(range(n_steps), progress, desc="updates", leave=False):
        r = np.asarray(stream[step * batch_size:(step + 1) * batch_size])
        sel = rr.select(torch.from_numpy(cands.q[r]), torch.from_numpy(cands.cand[r]),
                        mask=torch.from_numpy(cands.mask[r]), seed=seed * 1_000_003 + step)
        idx = sel.indices.cpu().numpy()
        rew = _simulate_citations(idx, cands.useful[r], rng, p_useful, p_useless)
        info = rr.update(sel, torch.from_numpy(rew))
        rewards_seen.append(float((rew > 0).sum() / max((idx >= 0).sum(), 1)))
        if eval_every and (step + 1) % eval_every == 0 and step + 1 < n_steps:
            curve.append((step + 1, _eval_reranker(rr, cands, test), rr.adapter_norm()))
    train_s = time.perf_counter() - t0
    curve.append((n_steps, _eval_reranker(rr, cands, test), rr.adapter_norm()))
    return dict(steps=n_steps, curve=curve, final=curve[-1][1], train_seconds=train_s,
                reward_rate=float(np.mean(rewards_seen)) if rewards_seen else math.nan,
                rollbacks=int(getattr(rr, "rollbacks", 0) or 0), last_info={k: _num(v) for k, v in info.items()})


def _num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


def run_reflection(ds: Dataset, *, emb: CachedEmbedder | None = None, k: int = 20, top_m: int = 5,
                   presets: Sequence[str] = ("default", "paper"), batch_size: int = 8, passes: float = 1.0,
                   p_useful: float = 0.9, p_useless: float = 0.1, test_frac: float = 0.5, split: str = "question",
                   seeds: Sequence[int] = (0, 1, 2), eval_every: int | None = None, reranker_overrides: dict | None = None,
                   plot: str | os.PathLike | None = None, max_questions: int | None = None,
                   progress: bool = False) -> dict[str, Any]:
    """Online reranker vs frozen retriever on held-back questions (mean and spread over seeds).

    Each seed draws its own train/test split, sampling noise and citations. Reports, per preset,
    held-back Recall@5 of the frozen retriever (its top ``top_m``), of the reranker before
    training (greedy; equal to the frozen retriever for zero-initialised adapters), after one
    online pass, and the learning curves.
    """
    if not (0.0 <= p_useless <= 1.0 and 0.0 <= p_useful <= 1.0):
        raise bad_arg("p_useful/p_useless", "probabilities in [0, 1]", (p_useful, p_useless))
    emb = emb or CachedEmbedder()
    t_start = time.perf_counter()
    cands = build_candidates(ds, emb, k=k, max_questions=max_questions, progress=progress)
    t_cands = time.perf_counter() - t_start
    frozen_idx = np.tile(np.arange(top_m), (len(cands.qtype), 1))
    upper = float(np.mean(np.minimum(cands.useful.sum(1), top_m) / np.maximum(cands.ev_count, 1)))
    res: dict[str, Any] = {}
    for preset in presets:
        per_seed = []
        for sd in seeds:
            train, test = _split(cands, test_frac, sd, split)
            rr = _make_reranker(cands.q.shape[1], preset, top_m, sd, reranker_overrides)
            frozen = _recall_of(frozen_idx[test], cands, test)
            out = train_online(rr, cands, train, test, batch_size=batch_size, passes=passes, p_useful=p_useful,
                               p_useless=p_useless, seed=sd, eval_every=eval_every, progress=progress)
            out |= dict(seed=sd, frozen=frozen, before=out["curve"][0][1], delta=out["final"] - frozen,
                        n_train=int(len(train)), n_test=int(len(test)), reranker=_instance_config(rr))
            per_seed.append(out)
        m_f, s_f = mean_std([p["frozen"] for p in per_seed])
        m_a, s_a = mean_std([p["final"] for p in per_seed])
        m_d, s_d = mean_std([p["delta"] for p in per_seed])
        res[preset] = dict(frozen_mean=m_f, frozen_std=s_f, after_mean=m_a, after_std=s_a, delta_mean=m_d,
                           delta_std=s_d, per_seed=per_seed, config=_rr_config(preset, top_m, reranker_overrides))
    if plot:
        _plot_curves(res, plot, title=f"held-back Recall@{top_m}, {ds.name}")
    config = dict(experiment="reflection", k=k, top_m=top_m, presets=list(presets), batch_size=batch_size,
                  passes=passes, p_useful=p_useful, p_useless=p_useless, test_frac=test_frac, split=split,
                  seeds=list(seeds), eval_every=eval_every, reranker_overrides=reranker_overrides or {},
                  embedder=emb.model_name, candidates=f"top-{k} turns, exact cosine",
                  oracle_recall_at_m_within_top_k=upper, plot=str(plot) if plot else None)
    return dict(config=config, dataset=_dataset_info(ds), metrics=res,
                timings={"candidates": t_cands, "total": time.perf_counter() - t_start}, environment=_env())


def _instance_config(rr) -> dict[str, Any]:
    """The settings the reranker actually ran with (its own ``_config()`` where it has one)."""
    cfg = getattr(rr, "_config", None)
    d = cfg() if callable(cfg) else {}
    return {k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v)) for k, v in d.items()}


def _rr_config(preset: str, top_m: int, overrides) -> dict[str, Any]:
    try:
        from ..reranker import PRESETS

        base = dict(PRESETS.get("stable" if preset == "default" else preset, {}))
    except Exception:  # pragma: no cover
        base = {}
    base.update(overrides or {})
    base["top_m"] = top_m
    base["preset"] = preset
    return {k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v)) for k, v in base.items()}


def run_collapse(ds: Dataset, *, emb: CachedEmbedder | None = None, optimizers: Sequence[str] = ("adam", "sgd"),
                 lrs: Sequence[float] = (1e-4, 1e-3, 1e-2), presets: Sequence[str] = ("default",), steps: int = 10_000,
                 k: int = 20, top_m: int = 5, batch_size: int = 8, p_useful: float = 0.9, p_useless: float = 0.1,
                 test_frac: float = 0.5, seeds: Sequence[int] = (0,), eval_every: int | None = None,
                 collapse_points: float = 5.0, plot: str | os.PathLike | None = None,
                 max_questions: int | None = None, progress: bool = False) -> dict[str, Any]:
    """``steps`` online updates per (preset, optimizer, lr, seed), cycling the train stream.

    A run *collapses* when its held-back Recall@5 at any checkpoint falls more than
    ``collapse_points`` points below the frozen retriever, or its adapters become non-finite.
    """
    emb = emb or CachedEmbedder()
    t_start = time.perf_counter()
    cands = build_candidates(ds, emb, k=k, max_questions=max_questions, progress=progress)
    frozen_idx = np.tile(np.arange(top_m), (len(cands.qtype), 1))
    runs = []
    for preset in presets:
        for opt in optimizers:
            for lr in lrs:
                for sd in seeds:
                    train, test = _split(cands, test_frac, sd)
                    rr = _make_reranker(cands.q.shape[1], preset, top_m, sd, {"optimizer": opt, "lr": float(lr)})
                    frozen = _recall_of(frozen_idx[test], cands, test)
                    out = train_online(rr, cands, train, test, batch_size=batch_size, steps=steps, p_useful=p_useful,
                                       p_useless=p_useless, seed=sd, eval_every=eval_every, progress=progress)
                    worst = min(c[1] for c in out["curve"])
                    finite = all(math.isfinite(c[2]) for c in out["curve"])
                    collapsed = (not finite) or (worst < frozen - collapse_points / 100.0)
                    runs.append(dict(preset=preset, optimizer=opt, lr=float(lr), seed=sd, frozen=frozen,
                                     final=out["final"], worst=worst, delta_final=out["final"] - frozen,
                                     max_norm=max(c[2] for c in out["curve"]), collapsed=bool(collapsed),
                                     rollbacks=out["rollbacks"], curve=out["curve"], seconds=out["train_seconds"],
                                     reranker=_instance_config(rr)))
                    log.info("collapse run %s %s lr=%g seed=%d: final %.3f (frozen %.3f) worst %.3f norm %.2f",
                             preset, opt, lr, sd, out["final"], frozen, worst, runs[-1]["max_norm"])
    if plot:
        _plot_collapse(runs, plot)
    config = dict(experiment="collapse", optimizers=list(optimizers), lrs=list(lrs), presets=list(presets), steps=steps,
                  k=k, top_m=top_m, batch_size=batch_size, p_useful=p_useful, p_useless=p_useless,
                  test_frac=test_frac, seeds=list(seeds), eval_every=eval_every, collapse_points=collapse_points,
                  embedder=emb.model_name, plot=str(plot) if plot else None)
    return dict(config=config, dataset=_dataset_info(ds), metrics={"runs": runs,
                "collapsed": sum(r["collapsed"] for r in runs), "total_runs": len(runs)},
                timings={"total": time.perf_counter() - t_start}, environment=_env())


def _plot_curves(res: dict[str, Any], path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"]
    for i, (preset, r) in enumerate(res.items()):
        for j, ps in enumerate(r["per_seed"]):
            xs = [c[0] for c in ps["curve"]]
            ys = [100 * c[1] for c in ps["curve"]]
            ax.plot(xs, ys, color=colors[i % len(colors)], alpha=0.8, label=preset if j == 0 else None)
        ax.axhline(100 * r["frozen_mean"], color="gray", ls="--", lw=1)
    ax.set_xlabel("online updates")
    ax.set_ylabel("held-back Recall@5 (%)")
    ax.set_title(title + " (dashed: frozen retriever)")
    ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_collapse(runs, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    for r in runs:
        xs = [c[0] for c in r["curve"]]
        ys = [100 * (c[1] - r["frozen"]) for c in r["curve"]]
        ax.plot(xs, ys, alpha=0.8, label=f"{r['preset']} {r['optimizer']} {r['lr']:g} s{r['seed']}")
    ax.axhline(0, color="gray", ls="--", lw=1)
    ax.set_xlabel("online updates")
    ax.set_ylabel("held-back Recall@5 minus frozen (points)")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ============================================================================================
# Full RMM with a real chat model
# ============================================================================================
def run_rmm(ds: Dataset, *, conversations: int = 1, sessions: int | None = 4, questions: int | None = 3,
            chat_model: Any = None, embedder: Any = None, extractor: str = "llm", store_dir: str | None = None,
            rmm_kwargs: dict | None = None, progress: bool = False) -> dict[str, Any]:
    """Drive :class:`memkern.RMM` end to end on a small slice (CPU: every session is a model call).

    For each of the first ``conversations`` conversations: a fresh store (temporary folder), its
    first ``sessions`` sessions fed through ``end_session`` (each turn carries its ``turn_id``),
    then its first ``questions`` questions whose evidence lies in those sessions asked through
    ``respond`` (which also trains the reranker online). Reports evidence-turn recall of the
    memories shown to the model, of the memories it cited, answer containment (the gold answer
    string appears in the reply), JSON parse rate, and timings. ``rmm_kwargs`` go to
    :class:`memkern.RMM` (top_k, top_m, batch_size, budgets, thresholds...). Raises
    :class:`MemkernValueError` with a clear message when RMM is not available.
    """
    try:
        from ..rmm import RMM
        from ..store import MemoryStore
    except ImportError as e:
        raise MemkernValueError(f"rmm experiment: expected memkern.RMM and memkern.MemoryStore to be importable, "
                                f"got ImportError: {e}") from None
    import tempfile

    t_start = time.perf_counter()
    if chat_model is None:
        from ..models import ChatModel

        chat_model = ChatModel()
    if embedder is None:
        from ..models import Embedder

        embedder = Embedder()
    rows = []
    tm = {"end_session": 0.0, "respond": 0.0}
    for c in _progress(ds.conversations[:conversations], progress, desc="rmm"):
        sess = c.sessions[:sessions] if sessions else c.sessions
        have = {t.turn_id for s in sess for t in s.turns}
        qs = [q for q in c.questions if q.evidence_turn_ids and set(q.evidence_turn_ids) <= have]
        qs = qs[:questions] if questions else qs
        with tempfile.TemporaryDirectory(dir=store_dir) as d:
            store = MemoryStore(d, dim=int(embedder.dim))
            rmm = RMM(store, chat_model=chat_model, embedder=embedder, extractor=extractor, persist=False,
                      **(rmm_kwargs or {}))
            for s in sess:
                t0 = time.perf_counter()
                rmm.end_session([{"role": t.role, "content": t.content, "turn_id": t.turn_id} for t in s.turns],
                                session_id=s.session_id, timestamp=s.date)
                tm["end_session"] += time.perf_counter() - t0
            for q in qs:
                t0 = time.perf_counter()
                out = rmm.respond(q.question)
                tm["respond"] += time.perf_counter() - t0
                retrieved = _turn_ids_of(store, out.memory_ids)
                ev = set(q.evidence_turn_ids)
                cited = _turn_ids_of(store, [out.memory_ids[i] for i in out.citations])
                rows.append(dict(question_id=q.question_id, question_type=q.question_type,
                                 recall=len(ev & retrieved) / len(ev), cited_useful=len(ev & cited) / len(ev),
                                 answer_contained=q.answer.lower() in out.answer.lower(),
                                 reply=out.answer[:300], answer=q.answer, parsed=bool(out.parsed)))
            rmm.close()
            store.close()
    metrics = dict(questions=len(rows), evidence_recall=_mean([r["recall"] for r in rows]),
                   cited_evidence=_mean([r["cited_useful"] for r in rows]),
                   answer_contained=_mean([float(r["answer_contained"]) for r in rows]),
                   parsed=_mean([float(r["parsed"]) for r in rows]), rows=rows)
    config = dict(experiment="rmm", conversations=conversations, sessions=sessions, questions=questions,
                  extractor=extractor, chat_model=str(getattr(chat_model, "model_name", type(chat_model).__name__)),
                  rmm_kwargs=rmm_kwargs or {})
    return dict(config=config, dataset=_dataset_info(ds), metrics=metrics,
                timings=tm | {"total": time.perf_counter() - t_start}, environment=_env())


def _turn_ids_of(store: Any, ids: Sequence[int]) -> set[str]:
    """Turn ids (the ``turn_id`` key the experiment stored in each turn) of the given records."""
    out: set[str] = set()
    for i in ids:
        try:
            rec = store.get(int(i))
        except KeyError:
            continue
        for t in rec.turns or []:
            if isinstance(t, dict) and "turn_id" in t:
                out.add(str(t["turn_id"]))
    return out


# ============================================================================================
# Output
# ============================================================================================
def _env() -> dict[str, Any]:
    import torch

    return dict(python=platform.python_version(), machine=platform.machine(), cpus=os.cpu_count(),
                torch=torch.__version__, threads=torch.get_num_threads(),
                time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def write_result(result: dict[str, Any], path: str | os.PathLike) -> Path:
    """Write ``result`` as indented JSON (NaN -> null); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)

    def clean(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {str(k): clean(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v) for v in x]
        if isinstance(x, (np.floating, np.integer, np.bool_)):
            return clean(x.item())
        return x

    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(clean(result), indent=1, sort_keys=False))
    os.replace(tmp, p)
    return p


def format_table(result: dict[str, Any]) -> str:
    """A plain-text table of a result's headline metrics."""
    exp = result["config"]["experiment"]
    m = result["metrics"]
    lines = []
    if exp == "granularity":
        cols = [c for c in ("recall@5", "recall@10", "ndcg@5", "recall@5turns", "recall@10turns", "recall@20turns",
                            "turns_per_unit", "tokens_per_unit", "questions") if any(c in v for v in m.values())]
        lines.append(f"{'unit':<26}" + "".join(f"{c:>16}" for c in cols))
        for g, v in m.items():
            lines.append(f"{g:<26}" + "".join(_cell(v.get(c), 16) for c in cols))
    elif exp == "turn-in-topic":
        cols = [c for c in next(iter(m.values())) if c.startswith("recall@") or c.startswith("delta_")] + ["questions"]
        lines.append(f"{'scoring':<28}" + "".join(f"{c:>22}" for c in cols))
        for g, v in m.items():
            lines.append(f"{g:<28}" + "".join(_cell(v.get(c), 22) for c in cols))
    elif exp == "reflection":
        lines.append(f"{'preset':<10}{'frozen R@5':>14}{'after R@5':>14}{'delta (pts)':>16}{'seeds':>7}")
        for p, v in m.items():
            lines.append(f"{p:<10}{_pm(v['frozen_mean'], v['frozen_std'])}{_pm(v['after_mean'], v['after_std'])}"
                         f"{_pm(100 * v['delta_mean'], 100 * v['delta_std'], pts=True)}{len(v['per_seed']):>7}")
    elif exp == "collapse":
        lines.append(f"{'preset':<9}{'opt':<6}{'lr':>8}{'seed':>5}{'frozen':>9}{'final':>9}{'worst':>9}{'max|W|':>9}"
                     f"{'rollb':>6}  collapsed")
        for r in m["runs"]:
            lines.append(f"{r['preset']:<9}{r['optimizer']:<6}{r['lr']:>8g}{r['seed']:>5}{r['frozen']:>9.3f}"
                         f"{r['final']:>9.3f}{r['worst']:>9.3f}{r['max_norm']:>9.2f}{r['rollbacks']:>6}  {r['collapsed']}")
    elif exp == "rmm":
        lines.append(f"questions {m['questions']}  evidence recall of shown memories {m['evidence_recall']:.3f}  "
                     f"of cited {m['cited_evidence']:.3f}  answer contained {m['answer_contained']:.3f}  "
                     f"JSON parsed {m['parsed']:.3f}")
    return "\n".join(lines)


def _cell(v, w: int = 15) -> str:
    if v is None:
        return f"{'-':>{w}}"
    if isinstance(v, float):
        return f"{v:>{w}.3f}" if abs(v) < 100 else f"{v:>{w}.1f}"
    return f"{v:>{w}}"


def _pm(m: float, s: float, pts: bool = False) -> str:
    return f"{m:>+9.1f} ± {s:<4.1f}" if pts else f"{m:>8.3f} ± {s:.3f}"


# ============================================================================================
# Several seeds
# ============================================================================================
def aggregate(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Combine results of one experiment over seeds: ``metrics_mean`` / ``metrics_std`` hold the mean
    and sample standard deviation of every numeric leaf of ``metrics`` present in all results
    (lists such as learning curves are left out); ``per_seed`` keeps the full results."""
    if not results:
        raise bad_arg("results", "a non-empty list", results)

    def walk(objs):
        o0 = objs[0]
        if isinstance(o0, dict):
            out_m, out_s = {}, {}
            for k in o0:
                if all(isinstance(o, dict) and k in o for o in objs):
                    m, s = walk([o[k] for o in objs])
                    if m is not None:
                        out_m[k], out_s[k] = m, s
            return (out_m, out_s) if out_m else (None, None)
        if isinstance(o0, (int, float, np.floating, np.integer)) and not isinstance(o0, bool):
            if all(isinstance(o, (int, float, np.floating, np.integer)) and not isinstance(o, bool) for o in objs):
                return mean_std([float(o) for o in objs])
        return None, None

    m, s = walk([r["metrics"] for r in results])
    first = results[0]
    return dict(config=first["config"] | {"aggregated_over": len(results)},
                dataset=[r["dataset"] for r in results], metrics_mean=m or {}, metrics_std=s or {},
                per_seed=results, timings={"total": sum(r["timings"].get("total", 0.0) for r in results)},
                environment=first.get("environment"))


def format_aggregate(agg: dict[str, Any]) -> str:
    """Mean table, then the spread (sample std over seeds) table."""
    cfg = agg["config"]
    mean = dict(config=cfg, metrics=agg["metrics_mean"])
    std = dict(config=cfg, metrics=agg["metrics_std"])
    n = cfg.get("aggregated_over", 1)
    if cfg["experiment"] == "reflection":
        lines = [f"{'preset':<10}{'frozen R@5':>18}{'after R@5':>18}{'delta (pts)':>18}   (mean ± std over {n} runs)"]
        for p, v in agg["metrics_mean"].items():
            sd = agg["metrics_std"][p]
            lines.append(f"{p:<10}{v['frozen_mean']:>10.3f} ± {sd['frozen_mean']:.3f}{v['after_mean']:>10.3f} ± "
                         f"{sd['after_mean']:.3f}{100 * v['delta_mean']:>+10.1f} ± {100 * sd['delta_mean']:.1f}")
        return "\n".join(lines)
    if cfg["experiment"] == "collapse":
        return "\n\n".join(format_table(r) for r in agg["per_seed"])
    return (f"mean over {n} runs:\n" + format_table(mean) + f"\n\nstd over {n} runs:\n" + format_table(std))
