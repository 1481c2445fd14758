"""Retrieval experiment (issue 13): what to embed and which unit to rank, at equal turn budgets.

Every row ranks the turns (or units) of the question's conversation and is scored by evidence
recall within a budget of 5 / 10 / 20 turns (:func:`memkern.eval.metrics.recall_at_budget`), with
a per-question bootstrap 95% interval of each row's mean and of its paired difference from the
baseline ``turn (speaker)``:

- ``turn (speaker)``: turns embedded as ``"{speaker}: {content}"`` (the obvious baseline; the
  deltas are against it);
- ``turn (content)``: turns embedded as their content only (what the eval did before);
- ``turn (template)``: turns embedded through the turn template (:mod:`memkern.text.template`,
  ``"[{date}] {speaker}: {content}"`` by default);
- ``window{W}``: fixed ``W``-turn windows (:class:`memkern.ingest.extract.WindowExtractor`) as units;
- ``texttiling``: the ``embedding`` extractor's topics (:class:`memkern.ingest.extract.TextTilingExtractor`)
  as units;
- ``turn+{a}*window{W}`` / ``turn+{a}*texttiling``: templated turns scored
  ``cos(q, turn) + a * cos(q, parent)`` with the window / TextTiling topic as parent;
- ``hybrid (content)`` / ``hybrid (template)``: the store's hybrid search
  (``mode="hybrid"`` with its default fusion and lexical weight, :meth:`memkern.MemoryStore.search`)
  over turn records whose text is the templated turn (names and dates, matched lexically) and whose
  vectors embed the content only / the templated turn; run on :class:`memkern.InMemoryStore`, the
  store engine with persistence off (exact scans at any size: no graph index);
- ``hybrid (content, all turns)``: the ``hybrid (content)`` search asked for every turn of the
  conversation (``k`` = its turn count), ranked by the fused score the store returns;
- ``hybrid (content)+{a}*window{W}`` / ``hybrid (content)+{a}*texttiling``: that fused turn score
  plus ``a * cos(q, parent)``, the parent being the window / TextTiling topic, as in the
  ``turn+{a}*...`` rows (measurement only: no default uses it);
- ``lexical (template)``: the store's BM25 search over the templated turn texts;
- ``rmm-default``: what :meth:`memkern.RMM.retrieve` returns for a fresh default
  :class:`memkern.RMM` (embedding extractor and decider, a real :class:`memkern.MemoryStore`)
  fed every session through :meth:`memkern.RMM.end_session` with its date, speakers and turn ids;
- ``rmm: ...`` (``ablations``): the same with one component of the default changed
  (:data:`RMM_ABLATIONS`: the turn stage dense or lexical only, content-only vectors, no date in
  the turns, no neighbour / session / topic term, the topic term at every budget, the hybrid stage
  without context, the time term off: :mod:`memkern.loops.rmm.timeprior`).

All rows but ``rmm-default`` and the hybrid rows use exact cosine (numpy) over the conversation's units; windows,
topics and the RMM store embed through the same template. Unit rows also report the mean tokens
per retrieved unit (the top 5), so windows and topics are compared at equal size.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

import numpy as np

from ..data.schema import Conversation, Dataset
from ..errors import bad_arg
from .data import by_type, dataset_info, mean, questions_by_conversation
from .metrics import bootstrap_ci, recall_at_budget
from .report import ExperimentResult, cell, environment
from .tasks import DEFAULT_CONVERSATIONS_PER_TASK, Experiment, Task, TaskOutput, concat_rows, run_local, sum_timings
from .units import BUDGETS, CachedEmbedder

__all__ = ["run_retrieval", "retrieval_experiment", "RetrievalExperiment", "RetrievalResult", "turn_dicts",
           "RMM_ABLATIONS", "BASELINE"]

BASELINE = "turn (speaker)"
HYBRID_ALL = "hybrid (content, all turns)"
#: The ablation rows: RMM settings (:class:`memkern.loops.rmm.RMMConfig` fields) that change one
#: component of the default, by row name.
RMM_ABLATIONS: dict[str, dict[str, Any]] = {
    "rmm: dense stage": dict(turn_stage="dense"),
    "rmm: lexical stage": dict(turn_stage="lexical"),
    "rmm: content vectors": dict(template="{content}", text_template="[{date}] {speaker}: {content}"),
    "rmm: no date in turns": dict(template="{speaker}: {content}"),
    "rmm: no neighbours": dict(neighbour_weight=0.0),
    "rmm: no session": dict(session_weight=0.0),
    "rmm: no topic": dict(alpha=0.0),
    "rmm: topic at every budget": dict(topic_min_turns=1),
    "rmm: hybrid stage only": dict(neighbour_weight=0.0, session_weight=0.0, alpha=0.0),
    "rmm: no time term": dict(time_prior="off"),
}
#: The ablation row of the time term.
RMM_TIME_ABLATION = "rmm: no time term"


@dataclass
class RetrievalResult(ExperimentResult):
    """Result of :func:`run_retrieval`.

    ``metrics[row]``: ``recall@Bturns`` per budget, ``delta_recall@Bturns`` (points vs
    :data:`BASELINE`, as a fraction), ``ci95_recall@Bturns`` / ``ci95_delta_recall@Bturns``
    (per-question bootstrap intervals, ``[lo, hi]``), ``questions``, ``by_type``; unit rows add
    ``tokens_per_unit``, ``turns_per_unit`` and ``units_per_conversation``.
    """

    experiment: ClassVar[str] = "retrieval"

    @classmethod
    def format_metrics(cls, metrics: dict[str, Any], config: dict[str, Any]) -> str:
        budgets = config.get("budgets", list(BUDGETS))
        cols = [f"recall@{b}turns" for b in budgets] + [f"delta_recall@{b}turns" for b in budgets] + \
               ["tokens_per_unit", "questions"]
        heads = [f"R@{b}" for b in budgets] + [f"Δ@{b}" for b in budgets] + ["tok/unit", "questions"]
        w = max([24] + [len(n) + 1 for n in metrics])
        ci = any(f"ci95_recall@{budgets[0]}turns" in v for v in metrics.values())
        if ci:
            heads += [f"95% CI R@{b}" for b in budgets]
        lines = [f"{'row':<{w}}" + "".join(f"{h:>10}" for h in heads[:len(cols)])
                 + "".join(f"{h:>16}" for h in heads[len(cols):])]
        for name, v in metrics.items():
            row = f"{name:<{w}}" + "".join(cell(v.get(c), 10) for c in cols)
            if ci:
                for b in budgets:
                    lo_hi = v.get(f"ci95_recall@{b}turns")
                    row += f"{'[%.3f, %.3f]' % tuple(lo_hi):>16}" if lo_hi else f"{'-':>16}"
            lines.append(row)
        return "\n".join(lines)


def turn_dicts(conv: Conversation) -> list[list[dict[str, Any]]]:
    """The conversation's sessions as RMM-style turn dicts (``role``, ``content``, ``speaker``,
    ``turn_id``, ``date``), one list per session."""
    return [[{"role": t.role, "content": t.content, "speaker": t.speaker, "turn_id": t.turn_id,
              "date": t.date if t.date is not None else s.date} for t in s.turns] for s in conv.sessions]


def _segments(sessions: list[list[dict]], extractor: Any) -> tuple[list[list[str]], list[str]]:
    """(turn ids, text) of every topic the extractor makes of the sessions."""
    ids, texts = [], []
    for s, tops in zip(sessions, extractor.extract_batch(sessions)):
        for tp in tops:
            if tp.turns:
                ids.append([s[i]["turn_id"] for i in tp.turns])
                texts.append(tp.summary)
    return ids, texts


def _rank_rows(S: np.ndarray, unit_ids: list[list[str]], questions, budgets, name: str, rows: dict) -> None:
    order = np.argsort(-S, axis=1, kind="stable")
    for qi, q in enumerate(questions):
        ranked = [unit_ids[j] for j in order[qi]]
        r = {f"recall@{b}turns": recall_at_budget(ranked, q.evidence_turn_ids, b) for b in budgets}
        r["question_type"] = q.question_type
        rows.setdefault(name, []).append(r)


@dataclass
class RetrievalExperiment(Experiment):
    """The retrieval experiment's work plan (:mod:`memkern.eval.tasks`).

    Configurations: ``exact`` (every exact-cosine row: they share the question and turn
    embeddings, so they stay one task per conversation batch) and ``rmm-default`` (a store per
    conversation); both are cut by conversation: no row carries state from one conversation to
    the next (the RMM row builds a fresh RMM and store per conversation).
    """

    name: ClassVar[str] = "retrieval"

    alphas: tuple[float, ...] = (0.5, 1.0, 2.0)
    budgets: tuple[int, ...] = BUDGETS
    template: Any = None
    window: int = 4
    texttiling: dict[str, Any] | None = None
    rmm: bool = True
    rmm_kwargs: dict[str, Any] | None = None
    max_questions: int | None = None
    seed: int = 0
    ablations: tuple[str, ...] = ()
    bootstrap: int = 2000
    question_types: tuple[str, ...] | None = None

    def configurations(self, ds: Dataset) -> list[str]:
        return (["exact", "rmm-default"] + list(self.ablations)) if self.rmm else ["exact"]

    def conversations(self, ds: Dataset, config: str) -> int:
        return len(self._questions(ds)[0])

    def _questions(self, ds: Dataset):
        """``([(conversation, its questions with evidence of question_types)], skipped)``."""
        convs, skipped = questions_by_conversation(ds, self.max_questions)
        if self.question_types is None:
            return convs, skipped
        keep = set(self.question_types)
        out = []
        for c, qs in convs:
            sel = [q for q in qs if q.question_type in keep]
            skipped += len(qs) - len(sel)
            if sel:
                out.append((c, sel))
        return out, skipped

    def _extractors(self, emb):
        from ..ingest.extract import TextTilingExtractor, WindowExtractor
        from ..text.template import default_template

        tpl = default_template(self.template)
        return tpl, WindowExtractor(size=self.window, template=tpl), \
            TextTilingExtractor(emb, template=tpl, **(self.texttiling or {}))

    def run_task(self, ds: Dataset, task: Task, emb: Any) -> dict[str, Any]:
        from ..text.template import PLAIN, TurnTemplate

        SPEAKER = TurnTemplate("{speaker}: {content}")

        convs, _ = self._questions(ds)
        tpl, win, tiler = self._extractors(emb)
        budgets, alphas = list(self.budgets), list(self.alphas)
        wname = f"window{self.window}"
        rows: dict[str, list[dict[str, Any]]] = {}
        ustats: dict[str, dict[str, list[float]]] = {}
        timings: dict[str, float] = {}
        for ci in task.conversations:
            c, questions = convs[ci]
            sessions = turn_dicts(c)
            if task.config != "exact":
                t0 = time.perf_counter()
                kw = dict(self.rmm_kwargs or {}) | RMM_ABLATIONS.get(task.config, {})
                _rmm_rows(sessions, [s.session_id for s in c.sessions], [s.date for s in c.sessions], questions,
                          emb, budgets, kw, self.seed, rows, name=task.config)
                timings["rmm"] = timings.get("rmm", 0.0) + time.perf_counter() - t0
                continue
            flat = [t for s in sessions for t in s]
            tid = [t["turn_id"] for t in flat]
            pos = {t: i for i, t in enumerate(tid)}
            qe = emb.encode([q.question for q in questions], kind="query")
            e_speaker = emb.encode([SPEAKER.render_turn(t) for t in flat])
            e_plain = emb.encode([PLAIN.render_turn(t) for t in flat])
            e_tpl = emb.encode([tpl.render_turn(t) for t in flat])
            s_plain, s_tpl = qe @ e_plain.T, qe @ e_tpl.T  # [Q, T]
            _rank_rows(qe @ e_speaker.T, [[t] for t in tid], questions, budgets, BASELINE, rows)
            _rank_rows(s_plain, [[t] for t in tid], questions, budgets, "turn (content)", rows)
            _rank_rows(s_tpl, [[t] for t in tid], questions, budgets, "turn (template)", rows)
            hst = _hybrid_store([tpl.render_turn(t) for t in flat], {"content": e_plain, "template": e_tpl})
            qtexts = [q.question for q in questions]
            _lexical_rows(hst, tid, questions, qtexts, budgets, rows)
            _hybrid_rows(hst, tid, questions, qe, qtexts, budgets, rows)
            h_all = _hybrid_turn_scores(hst, "content", qe, qtexts)  # [Q, T]
            _rank_rows(h_all, [[t] for t in tid], questions, budgets, HYBRID_ALL, rows)
            for name, ex in ((wname, win), ("texttiling", tiler)):
                ids, texts = _segments(sessions, ex)
                pe = emb.encode(texts)
                sp = qe @ pe.T  # [Q, P]
                _rank_rows(sp, ids, questions, budgets, name, rows)
                st = ustats.setdefault(name, {"tokens": [], "turns": [], "units": []})
                st["units"].append(len(ids))
                top = np.argsort(-sp, axis=1, kind="stable")[:, :5]
                for j in top.reshape(-1):
                    st["turns"].append(len(ids[j]))
                    st["tokens"].append(emb.count_tokens(texts[j]))
                parent_of = np.full(len(tid), -1, np.int64)
                for j, u in enumerate(ids):
                    for t in u:
                        if parent_of[pos[t]] < 0:
                            parent_of[pos[t]] = j
                ps = np.where(parent_of[None, :] >= 0, sp[:, np.maximum(parent_of, 0)], 0.0)
                for a in alphas:
                    _rank_rows(s_tpl + float(a) * ps, [[t] for t in tid], questions, budgets, f"turn+{a:g}*{name}",
                               rows)
                for a in alphas:
                    _rank_rows(h_all + float(a) * ps, [[t] for t in tid], questions, budgets,
                               f"hybrid (content)+{a:g}*{name}", rows)
        return {"rows": rows, "ustats": ustats, "timings": timings}

    def merge(self, ds: Dataset, outputs: Sequence[TaskOutput], emb: Any) -> "RetrievalResult":
        _, skipped = self._questions(ds)
        tpl, _, tiler = self._extractors(emb)
        rows = concat_rows(outputs)
        ustats: dict[str, dict[str, list[float]]] = {}
        for o in outputs:
            for name, st in o.partial["ustats"].items():
                acc = ustats.setdefault(name, {k: [] for k in st})
                for k, v in st.items():
                    acc[k].extend(v)
        names = [f"recall@{b}turns" for b in self.budgets]
        metrics: dict[str, Any] = {}
        base_rows = rows.get(BASELINE, [])
        base = {n: mean([r[n] for r in base_rows]) for n in names}
        for name, rs in rows.items():
            m = {n: mean([r[n] for r in rs]) for n in names}
            m |= {f"delta_{n}": m[n] - base[n] for n in names}
            for n in names:
                m[f"ci95_{n}"] = list(bootstrap_ci([r[n] for r in rs], self.bootstrap, self.seed))
                if len(rs) == len(base_rows):  # the same questions in the same order: paired
                    m[f"ci95_delta_{n}"] = list(bootstrap_ci([r[n] - b[n] for r, b in zip(rs, base_rows)],
                                                             self.bootstrap, self.seed))
            m["questions"] = len(rs)
            if name in ustats:
                m["tokens_per_unit"] = mean(ustats[name]["tokens"])
                m["turns_per_unit"] = mean(ustats[name]["turns"])
                m["units_per_conversation"] = mean(ustats[name]["units"])
            m["by_type"] = by_type(rs, names)
            metrics[name] = m
        timings = sum_timings(outputs)
        timings.setdefault("rmm", 0.0)
        timings["total"] = timings["tasks"]
        config = dict(experiment="retrieval", alphas=list(self.alphas), budgets=list(self.budgets),
                      template=tpl.to_dict(), window=self.window,
                      texttiling=dict(target_turns=tiler.target_turns, min_turns=tiler.min_turns,
                                      max_turns=tiler.max_turns, window=tiler.window),
                      rmm=bool(self.rmm), rmm_kwargs=dict(self.rmm_kwargs or {}), embedder=emb.model_name,
                      ablations={a: RMM_ABLATIONS[a] for a in self.ablations}, baseline=BASELINE,
                      bootstrap=dict(reps=self.bootstrap, seed=self.seed, level=0.95, unit="question"),
                      question_types=None if self.question_types is None else list(self.question_types),
                      seed=self.seed, retrieval="exact cosine (numpy); rmm-default: RMM.retrieve on a MemoryStore")
        return RetrievalResult(config, dataset_info(ds) | {"skipped_no_evidence": skipped}, metrics, timings,
                               environment())


def run_retrieval(ds: Dataset, *, emb: CachedEmbedder | None = None, alphas: Sequence[float] = (0.5, 1.0, 2.0),
                  budgets: Sequence[int] = BUDGETS, template: Any = None, window: int = 4,
                  texttiling: dict[str, Any] | None = None, rmm: bool = True, rmm_kwargs: dict[str, Any] | None = None,
                  max_questions: int | None = None, progress: bool = False, seed: int = 0,
                  conversations_per_task: int = DEFAULT_CONVERSATIONS_PER_TASK, ablations: Sequence[str] = (),
                  bootstrap: int = 2000, question_types: Sequence[str] | None = None) -> RetrievalResult:
    """Every retrieval configuration of issue 13 at equal turn budgets (see the module doc).

    Runs the tasks of :class:`RetrievalExperiment` here, one after the other
    (:func:`memkern.eval.tasks.run_local`); ``memkern eval memory retrieval --ray`` runs the same
    tasks on Ray and gets the same result.

    Parameters
    ----------
    ds : Dataset
    emb : CachedEmbedder, optional
        Default: the offline MiniLM with the on-disk cache.
    alphas : sequence of float
        Parent weights for the two-level rows (each > 0).
    budgets : sequence of int
        Turn budgets.
    template : memkern.text.template.TurnTemplate or str, optional
        The turn template (default :data:`memkern.text.template.DEFAULT_TEMPLATE`).
    window : int
        Size of the fixed windows.
    texttiling : dict, optional
        Keyword arguments of :class:`memkern.ingest.extract.TextTilingExtractor`.
    rmm : bool
        Also measure ``rmm-default`` (:meth:`memkern.RMM.retrieve`; a store per conversation).
    rmm_kwargs : dict, optional
        Extra :class:`memkern.RMM` arguments for that row (default: none, the defaults).
    conversations_per_task : int
        Conversations per task (``0``: one task per configuration); the result does not depend on it.
    ablations : sequence of str
        Ablation rows (keys of :data:`RMM_ABLATIONS`, or ``["all"]``); each is an RMM run like
        ``rmm-default`` (needs ``rmm``).
    bootstrap : int
        Resamples of the per-question bootstrap intervals.
    question_types : sequence of str, optional
        Only questions of these types (e.g. LoCoMo's ``category_1`` .. ``category_4``).
    """
    exp = retrieval_experiment(alphas=alphas, budgets=budgets, template=template, window=window,
                               texttiling=texttiling, rmm=rmm, rmm_kwargs=rmm_kwargs, max_questions=max_questions,
                               seed=seed, ablations=ablations, bootstrap=bootstrap, question_types=question_types)
    return run_local(exp, ds, emb or CachedEmbedder(), conversations_per_task, progress=progress)


def retrieval_experiment(*, alphas: Sequence[float] = (0.5, 1.0, 2.0), budgets: Sequence[int] = BUDGETS,
                         template: Any = None, window: int = 4, texttiling: dict[str, Any] | None = None,
                         rmm: bool = True, rmm_kwargs: dict[str, Any] | None = None,
                         max_questions: int | None = None, seed: int = 0, ablations: Sequence[str] = (),
                         bootstrap: int = 2000, question_types: Sequence[str] | None = None) -> RetrievalExperiment:
    """A checked :class:`RetrievalExperiment` (the arguments of :func:`run_retrieval`)."""
    from ..text.template import default_template
    from ..base.validate import check_int

    for a in alphas:
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not a > 0:
            raise bad_arg("alphas", "numbers > 0", a)
    if isinstance(ablations, str):
        raise bad_arg("ablations", "a list of ablation names", ablations)
    abl = list(RMM_ABLATIONS) if list(ablations) == ["all"] else list(dict.fromkeys(ablations))
    for a in abl:
        if a not in RMM_ABLATIONS:
            raise bad_arg("ablations", f"names from {list(RMM_ABLATIONS)} or ['all']", a)
    if abl and not rmm:
        raise bad_arg("ablations", "none without the RMM rows (rmm=False)", abl)
    bootstrap = check_int("bootstrap", bootstrap, 1, expected="an int >= 1")
    return RetrievalExperiment(alphas=tuple(alphas), budgets=tuple(budgets), template=default_template(template),
                               window=window, texttiling=dict(texttiling) if texttiling else None, rmm=bool(rmm),
                               rmm_kwargs=dict(rmm_kwargs) if rmm_kwargs else None, max_questions=max_questions,
                               seed=seed, ablations=tuple(abl), bootstrap=bootstrap,
                               question_types=None if question_types is None else tuple(question_types))


def _hybrid_store(texts: list[str], vectors: dict[str, np.ndarray]) -> tuple[Any, dict[str, np.ndarray]]:
    """One :class:`memkern.InMemoryStore` for the hybrid rows of a conversation: a namespace per
    vector kind (float32 ``[T, d]``), every record's text the templated turn (``texts``, length T).

    Returns the store and, per kind, the store ids of turns ``0..T-1`` (int64 ``[T]``)."""
    from ..store.memory import InMemoryStore

    dim = int(next(iter(vectors.values())).shape[1])
    st = InMemoryStore(dim, "cos")
    return st, {kind: np.asarray(st.add_batch(kind, texts, vecs), dtype=np.int64) for kind, vecs in vectors.items()}


def _lexical_rows(hst: tuple[Any, dict[str, np.ndarray]], tid: list[str], questions, qtexts: list[str],
                  budgets: Sequence[int], rows: dict) -> None:
    """``lexical (template)``: the store's BM25 search over the templated turn texts of ``hst``
    (:func:`_hybrid_store`), top ``max(budgets)``."""
    st, kind_ids = hst
    kind, ids = next(iter(kind_ids.items()))
    pos = {int(i): j for j, i in enumerate(ids)}
    got, _ = st.search(kind, None, k=max(budgets), mode="lexical", texts=qtexts)
    for qi, q in enumerate(questions):
        ranked = [[tid[pos[int(i)]]] for i in got[qi] if i >= 0]
        r = {f"recall@{b}turns": recall_at_budget(ranked, q.evidence_turn_ids, b) for b in budgets}
        r["question_type"] = q.question_type
        rows.setdefault("lexical (template)", []).append(r)


def _hybrid_rows(hst: tuple[Any, dict[str, np.ndarray]], tid: list[str], questions, qe: np.ndarray,
                 qtexts: list[str], budgets: Sequence[int], rows: dict) -> None:
    """``hybrid ({kind})`` for every vector kind of ``hst`` (:func:`_hybrid_store`): the store's
    default hybrid search, top ``max(budgets)``."""
    st, kind_ids = hst
    k = max(budgets)
    for kind, ids in kind_ids.items():
        pos = {int(i): j for j, i in enumerate(ids)}
        got, _ = st.search(kind, qe, k=k, mode="hybrid", texts=qtexts)
        for qi, q in enumerate(questions):
            ranked = [[tid[pos[int(i)]]] for i in got[qi] if i >= 0]
            r = {f"recall@{b}turns": recall_at_budget(ranked, q.evidence_turn_ids, b) for b in budgets}
            r["question_type"] = q.question_type
            rows.setdefault(f"hybrid ({kind})", []).append(r)


def _hybrid_turn_scores(hst: tuple[Any, dict[str, np.ndarray]], kind: str, qe: np.ndarray,
                        qtexts: list[str]) -> np.ndarray:
    """The store's default hybrid score of every turn for every question.

    Parameters
    ----------
    hst : (store, ids per kind)
        :func:`_hybrid_store` of the conversation (texts: the templated turns, what the lexical
        index matches).
    kind : str
        Which vectors' namespace to search (``"content"``: the content-only embeddings).
    qe : float32 [Q, d]
        Question embeddings.
    qtexts : list of str, length Q
        Question texts (the lexical query).

    Returns
    -------
    float64 [Q, T]: the fused score :meth:`memkern.InMemoryStore.search` (``mode="hybrid"``,
    default fusion and lexical weight) returns for turn ``j`` with ``k = T``, i.e. with every turn
    of the conversation in the dense list, so the dense min-max normalisation runs over all the
    conversation's turns (not over the top ``max(4k, 50)`` as in the ``k = 20`` search of the
    ``hybrid (content)`` row: the ``hybrid (content, all turns)`` row ranks these scores alone).
    """
    st, kind_ids = hst
    ids = kind_ids[kind]
    T = len(ids)
    out = np.full((len(qtexts), T), -np.inf, dtype=np.float64)
    if T == 0 or not qtexts:
        return out
    pos = np.full(int(ids.max()) + 1, -1, dtype=np.int64)
    pos[ids] = np.arange(T)
    got, sc = st.search(kind, qe, k=T, mode="hybrid", texts=list(qtexts))
    ok = got >= 0
    qi = np.broadcast_to(np.arange(len(qtexts))[:, None], got.shape)
    out[qi[ok], pos[got[ok]]] = sc[ok]
    return out


def _rmm_rows(sessions: list[list[dict]], session_ids: list[str], dates: list[Any], questions, emb: Any,
              budgets: Sequence[int], rmm_kwargs: dict | None, seed: int, rows: dict, name: str = "rmm-default") -> None:
    """Row ``name``: a fresh RMM (the defaults, ``rmm_kwargs`` over them) over a real store, fed
    every session, asked through :meth:`memkern.RMM.retrieve` (greedy: the reranker's best, no
    sampling) at each budget."""
    from ..loops.rmm import RMM
    from ..store.engine import MemoryStore

    with tempfile.TemporaryDirectory() as d:
        store = MemoryStore(d, dim=int(emb.dim))
        kw = dict(extractor="embedding", persist=False, seed=seed) | dict(rmm_kwargs or {})
        comp = {k: kw.pop(k) for k in ("extractor", "decider") if k in kw}
        r = RMM(store, embedder=emb, **comp, **kw)
        try:
            for s, sid, date in zip(sessions, session_ids, dates):
                r.end_session([{k: v for k, v in t.items() if k != "date"} for t in s], session_id=sid, date=date)
            for q in questions:
                row = {"question_type": q.question_type}
                for b in budgets:
                    got = r.retrieve(q.question, turns=b, explore=False)
                    ranked = [[str(t)] for t in got.all_turn_ids]
                    row[f"recall@{b}turns"] = recall_at_budget(ranked, q.evidence_turn_ids, b)
                rows.setdefault(name, []).append(row)
        finally:
            r.close()
            store.close()


#: LoCoMo's answerable question types (category 5 is adversarial: its evidence does not answer it).
LOCOMO_TYPES = ("category_1", "category_2", "category_3", "category_4")
#: LoCoMo category names (:data:`memkern.data.locomo.LOCOMO_CATEGORIES`) by question type.
_CATEGORY_NAMES = {"category_1": "multi-hop", "category_2": "temporal", "category_3": "open-domain",
                   "category_4": "single-hop"}


def _model_label(name: Any) -> str:
    """A model's name without the machine's folders (the package folder of a local model path)."""
    import os

    text = str(name)
    if os.sep not in text and "/" not in text:
        return text
    parts = [p for p in text.replace(os.sep, "/").split("/") if p]
    if len(parts) >= 2 and parts[-1] in ("model", "models"):
        return parts[-2]
    return parts[-1] if parts else text


def locomo_section(result: dict[str, Any]) -> str:
    """The markdown body of the real-data retrieval section (``bench/sections/retrieval-locomo.md``)
    from a retrieval result (:class:`RetrievalResult` ``.to_dict()``): every row's R@5/10/20 with
    its per-question bootstrap 95% interval, the paired difference from the baseline, and the
    default's and the baseline's recall by question category."""
    m, cfg, data = result["metrics"], result["config"], result["dataset"]
    budgets = cfg.get("budgets", list(BUDGETS))
    base = cfg.get("baseline", BASELINE)
    bs = cfg.get("bootstrap", {})
    ids = [c for c in (data.get("meta", {}).get("conversations") or [])]

    def ci(v, key, pts=False):
        lo, hi = v.get(f"ci95_{key}", (None, None))
        x = v.get(key)
        if x is None:
            return ""
        if pts:
            return f"{100 * x:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}]" if lo is not None else f"{100 * x:+.1f}"
        return f"{x:.3f} [{lo:.3f}, {hi:.3f}]" if lo is not None else f"{x:.3f}"

    n_q = m.get(base, {}).get("questions", 0)
    L = [f"Data: {data.get('conversations')} conversations{' (' + ', '.join(ids) + ')' if ids else ''}, "
         f"{data.get('turns')} turns, {n_q} questions of {', '.join(cfg.get('question_types') or ['every type'])} "
         f"with evidence labels. Each row ranks the turns of the question's conversation; recall is the share of "
         f"the question's evidence turns among the N turns returned. Intervals: per-question bootstrap "
         f"({bs.get('reps', '?')} resamples, seed {bs.get('seed', '?')}), 95%; differences are paired (the same "
         f"resampled questions). Embedder: {_model_label(cfg.get('embedder'))}. RMM rows: a fresh `memkern.RMM(store)` per "
         f"conversation (real `MemoryStore`, offline embedder, no chat model), every session through "
         f"`end_session(turns, session_id, date)` with speakers and turn ids, each question read through "
         f"`RMM.retrieve(question, turns=N, explore=False)` (the reranker's greedy order; a fresh reranker keeps "
         f"the first stage's).", ""]
    head = "| row | " + " | ".join(f"R@{b} [95% CI]" for b in budgets) + " | " + \
        " | ".join(f"R@{b} − baseline, pts [95% CI]" for b in budgets) + " |"
    L += [head, "|" + "---|" * (1 + 2 * len(budgets))]
    for name, v in m.items():
        label = f"**{name}**" if name in ("rmm-default", base) else name
        L.append(f"| {label} | " + " | ".join(ci(v, f"recall@{b}turns") for b in budgets) + " | " +
                 " | ".join("" if name == base else ci(v, f"delta_recall@{b}turns", pts=True) for b in budgets) + " |")
    abl = cfg.get("ablations") or {}
    if abl:
        L += ["", "Ablation rows (one setting of the default changed, `memkern.loops.rmm.RMMConfig`): " +
              "; ".join(f"`{k}`: {', '.join(f'{a}={b!r}' for a, b in v.items())}" for k, v in abl.items()) + "."]
    rows = [r for r in ("rmm-default", "rmm: no topic", "rmm: topic at every budget", base) if r in m]
    types = sorted({t for r in rows for t in m[r].get("by_type", {})})
    if rows and types:
        L += ["", "By question category (R@" + "/".join(map(str, budgets)) + "):", "",
              "| row | " + " | ".join(f"{t} ({_CATEGORY_NAMES.get(t, t)}, n={m[rows[0]]['by_type'][t]['questions']})"
                                    for t in types) + " |",
              "|" + "---|" * (1 + len(types))]
        for r in rows:
            bt = m[r]["by_type"]
            L.append(f"| {r} | " + " | ".join(" / ".join(f"{bt[t][f'recall@{b}turns']:.3f}" for b in budgets)
                                             for t in types) + " |")
    return "\n".join(L)
