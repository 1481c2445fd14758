"""RMM's retrieval stage: top-K search (topic or turn+topic), the reranker's choice, the budget.

Topic mode searches topic records. Two-level mode (``retrieval="turn+topic"``) searches
``4 * top_k`` turn records in one store call and groups them by topic
(:meth:`RetrieveStage._retrieve_turn_topic`). On a store with the hybrid two-level search
(:func:`memkern.protocols.supports_hybrid_turns`: :class:`memkern.MemoryStore`,
:class:`memkern.InMemoryStore`) a turn's score is (:meth:`memkern.MemoryStore.search`, *Two-level
search*; settings in :class:`memkern.loops.rmm.RMMConfig`)::

    base(t)  = (1 - w) * minmax(dense) + w * minmax(BM25)      (turn_stage="hybrid", w = lexical_weight)
    score(t) = base(t) + neighbour_weight * best base of the previous / next turn of its session
             + session_weight * best base in its session + alpha * sim(q, its topic)

over the templated turn texts and vectors (speaker and date included), with ``alpha`` used only
when ``topic_min_turns`` or more turns are shown. On other two-level stores: ``sim(q, turn) +
alpha * sim(q, its topic)``. :meth:`RetrieveStage._first_stage` builds these keywords for a query
(the place for query-time filters and priors). The reranker then chooses ``top_m`` of the
``<= top_k`` candidates (:meth:`RetrieveStage._retrieve_and_rerank`), or orders all of them when a
turn budget is given; the first-stage score is its prior (:meth:`memkern.Reranker.select`), so a
fresh reranker keeps the first stage's order. :meth:`RetrieveStage.retrieve` returns what :meth:`memkern.RMM.respond`
shows the model (:class:`Retrieval`) without calling it: the chosen memories, each with its
shown turns (two-level: its best retrieved turns, at most ``turns_per_memory``; topic mode: its
raw turns), or, with a budget of ``turns``, the best-scored turns up to the budget, each turn
scored by its first-stage score plus its memory's learned residual (the reranker's score minus its
prior), so what the reranker learned from citations moves the turns shown.

Filters and time (``retrieve`` / ``respond`` / ``aretrieve`` / ``arespond``): ``filter``,
``time_range``, ``time_field``, ``recency``, ``recency_weight`` and ``now`` go to the first-stage
``store.search`` (meaning as in :meth:`memkern.MemoryStore.search`; checked up front by
:func:`memkern.store.check_search_filters`), so the reranker only ever sees records that pass.
RMM writes each session's date to ``event_time`` (:meth:`memkern.RMM.end_session`), so
``time_range`` with the default ``time_field="event"`` selects by conversation date. In two-level
mode the filters act inside the turn search (a turn sees its topic's meta keys and carries the
event time of the write that stored it), in the same store call. A store whose ``search`` lacks
one of these keywords (:func:`memkern.protocols.search_keywords`) raises
:class:`memkern.MemkernTypeError` naming it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import MemkernTypeError, MemkernValueError, bad_arg
from ...base.validate import MAX_QUERY_CHARS, check_text
from ...protocols import SEARCH_FILTER_KEYWORDS, missing_search_keywords, supports_hybrid_turns
from ...store import DEFAULT_RECENCY_WEIGHT, check_search_filters

__all__ = ["RetrieveStage", "Retrieval", "TopicHits", "turn_key", "EXPLORE_COIN_KEY"]

#: Philox key (xor the reranker's seed) of the per-call coin that decides whether a
#: :meth:`memkern.RMM.respond` call explores (``RMMConfig.explore`` strictly between 0 and 1).
EXPLORE_COIN_KEY = 0x2545F4914F6CDD1D


def turn_key(turn: dict) -> Any:
    """The id a caller knows a turn by: its ``turn_id`` when it carried one, else
    ``"{session_id}#{turn_index}"`` (the keys :meth:`memkern.RMM.end_session` adds)."""
    if isinstance(turn, dict):
        if turn.get("turn_id") is not None:
            return turn["turn_id"]
        return f"{turn.get('session_id')}#{turn.get('turn_index')}"
    return None


@dataclass
class Retrieval:
    """What :meth:`memkern.RMM.respond` would show the model for a query (:meth:`RMM.retrieve`).

    Attributes
    ----------
    query : str
    memory_ids : list[int]
        Store ids of the chosen memories, in prompt order.
    memories : list[dict]
        Aligned with ``memory_ids``: ``{"id", "summary", "turns"}`` with the turn dicts shown
        (conversation order).
    turn_ids : list[list]
        Aligned with ``memory_ids``: :func:`turn_key` of each shown turn (the caller's
        ``turn_id`` where the turn carried one).
    record_ids : list[list[int]]
        Aligned with ``memory_ids``: the turn-record ids shown (two-level memory; empty lists in
        topic mode).
    budget : int or None
        The turn budget asked for (``None``: ``top_m`` memories, as :meth:`RMM.respond`).
    timings : dict[str, float]
        Seconds: ``time`` (parsing the question's time), ``embed`` (the query), ``retrieve`` (first
        stage + grouping), ``rerank``, ``show`` (reading the shown records), ``total``.
    """

    query: str
    memory_ids: list[int]
    memories: list[dict]
    turn_ids: list[list[Any]]
    record_ids: list[list[int]]
    budget: int | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def all_turn_ids(self) -> list[Any]:
        """Every shown turn's id, memory by memory (prompt order)."""
        return [t for ids in self.turn_ids for t in ids]

    @property
    def n_turns(self) -> int:
        """Turns shown in all (``<= budget`` when a budget was given)."""
        return sum(len(ids) for ids in self.turn_ids)


@dataclass
class TopicHits:
    """One candidate memory of two-level retrieval: a topic and its retrieved turns.

    Attributes
    ----------
    topic_id : int
    turn_ids : list[int]
        The topic's retrieved turn-record ids, best first.
    scores : list[float]
        Their first-stage scores, aligned with ``turn_ids`` (descending).
    """

    topic_id: int
    turn_ids: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)

    @property
    def best(self) -> float:
        """The score of the topic's best retrieved turn (its rank among the candidates)."""
        return self.scores[0]


def _normalize(x: np.ndarray) -> np.ndarray:
    """Rows of ``x`` (float32 ``[..., d]``) scaled to unit length (zero rows stay ~0)."""
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _learned_residual(ids: np.ndarray, sel: Any) -> dict[int, float] | None:
    """Memory id -> what the reranker adds to its first-stage prior (``sel.scores - sel.prior``
    at each candidate position, float), for the candidates ``ids`` (int64 ``[n]``) of the
    selection ``sel`` (:class:`memkern.Selection`, ``[1, K]`` fields). ``None`` when there is no
    selection or it carries no prior (then nothing learned is added)."""
    prior = getattr(sel, "prior", None)
    if sel is None or prior is None or len(ids) == 0:
        return None
    sc = sel.scores.reshape(-1)[: len(ids)]
    res = (sc.float() - prior.reshape(-1)[: len(ids)].float()).detach().cpu().numpy()
    return dict(zip(ids.tolist(), res.tolist()))


def _turn_order(turn_record: Any) -> int:
    """A turn record's position in its topic's turn list (old sessions first: conversation order)."""
    pos = (turn_record.meta or {}).get("turn_position", 0)
    return int(pos) if isinstance(pos, int) else 0


class RetrieveStage:
    """Retrieval + rerank of :class:`memkern.RMM` (a mixin: it uses the RMM's ``store``,
    ``namespace``, ``config`` fields and ``reranker``)."""

    @property
    def two_level(self) -> bool:
        """Whether this RMM runs two-level memory (``retrieval="turn+topic"``)."""
        return self.retrieval == "turn+topic"

    def _search_filters(self, filter: Any = None, time_range: Any = None, time_field: str = "event",
                        recency: Any = None, recency_weight: Any = DEFAULT_RECENCY_WEIGHT,
                        now: Any = None) -> dict:
        """The checked first-stage search keywords (``{}`` when none is set); raises
        :class:`memkern.MemkernTypeError` naming a keyword the store's ``search`` lacks."""
        kw = check_search_filters(filter, time_range, time_field, recency, recency_weight, now)
        if kw:
            missing = missing_search_keywords(self.store, kw)
            if missing:
                raise bad_arg(missing[0], f"a store whose search takes {missing[0]}= (memkern.protocols.search_keywords)",
                              type(self.store).__name__, MemkernTypeError)
        return kw

    @property
    def hybrid_turns(self) -> bool:
        """Whether two-level retrieval runs the hybrid turn stage (the store has it,
        :func:`memkern.protocols.supports_hybrid_turns`)."""
        if self._hybrid is None:
            self._hybrid = self.two_level and supports_hybrid_turns(self.store)
        return self._hybrid

    @property
    def _turn_text(self):
        """``turn -> str``, the text of a turn record (``text_template``), or ``None`` when the
        store keeps no turn texts (then it stores the turn's content)."""
        return self.text_template.render_turn if self.hybrid_turns else None

    def _first_stage(self, query: str, budget: int | None, filters: dict) -> dict:
        """The keyword arguments of the first-stage ``store.search`` for one query.

        ``filters``: the checked ``filter`` / ``time_range`` / recency keywords
        (:meth:`_search_filters`), passed as they are. Two-level memory on a store with the hybrid
        turn stage adds it (``mode``, ``texts``, fusion, context weights, ``group_key="session_id"``)
        and ``alpha``: ``config.alpha`` when at least ``topic_min_turns`` turns are shown
        (``budget``, or ``top_m * turns_per_memory`` for :meth:`respond`), else 0. Query-time
        filters and priors (e.g. a time range read from the question) belong here.
        """
        kw = dict(filters)
        if not self.two_level:
            return kw
        shown = budget if budget is not None else self.top_m * self.turns_per_memory
        kw["alpha"] = self.alpha if shown >= self.config.topic_min_turns else 0.0
        if self.hybrid_turns:
            cfg = self.config
            kw.update(mode=cfg.turn_stage, texts=[query], fusion="weighted", lexical_weight=cfg.lexical_weight,
                      neighbour_weight=cfg.neighbour_weight, group_weight=cfg.session_weight, group_key="session_id",
                      candidates=cfg.candidates)
        return kw

    def _retrieve_turn_topic(self, q: np.ndarray, search_kw: dict | None = None, time_q: Any = None
                             ) -> tuple[np.ndarray, dict[int, TopicHits]]:
        """Turn+topic search, grouped by topic.

        Searches ``4 * top_k`` turns in one store call (``search_kw``: :meth:`_first_stage`) and
        walks them best first: the first ``top_k`` distinct topics become the candidates (in order
        of their best turn), each keeping its retrieved turns best first (the shown ones are cut
        to ``turns_per_memory`` in :meth:`_shown_memories`). Only ids and scores are read here
        (the store's ``topic_ids`` where it has one); records are read for what is shown. ``time_q``:
        the parsed question whose time term rescores the turns first
        (:meth:`memkern.loops.rmm.timeprior.TimeStage._time_rescore`).

        Returns
        -------
        ids : int64 [n]
            Candidate topic ids, ``n <= top_k``.
        groups : dict
            ``topic id -> TopicHits`` (its retrieved turn ids and scores, best first).
        """
        groups: dict[int, TopicHits] = {}
        if self.store.count(self.namespace, level="turn") == 0:
            return np.zeros(0, np.int64), groups
        kw = dict(search_kw or {})
        alpha = kw.pop("alpha", self.alpha)
        filters = {k: kw.pop(k) for k in SEARCH_FILTER_KEYWORDS if k in kw}
        if filters and not self.hybrid_turns:
            # A two-level store without the hybrid search takes no filter at level="turn+topic":
            # the passing turns are searched and rescored with their topics here.
            tids, scores = self.store.search(self.namespace, q, k=4 * self.top_k, level="turn", **filters)
            tids, scores = np.asarray(tids).reshape(-1), np.asarray(scores).reshape(-1)
            keep = tids >= 0
            tids, scores = tids[keep], scores[keep]
            parents = self._topic_ids(tids)
            if len(tids):
                topic_emb = np.asarray(self.store.embeddings([int(p) for p in parents]), np.float32)
                s2 = scores.astype(np.float32) + np.float32(alpha) * (_normalize(topic_emb) @ _normalize(q).reshape(-1))
                order = np.argsort(-s2, kind="stable")
                tids, scores, parents = tids[order], s2[order], parents[order]
        else:
            tids, scores = self.store.search(self.namespace, q, k=4 * self.top_k, level="turn+topic", alpha=alpha,
                                             **filters, **kw)
            tids, scores = np.asarray(tids).reshape(-1), np.asarray(scores).reshape(-1)
            keep = tids >= 0
            tids, scores = tids[keep], scores[keep]
            parents = self._topic_ids(tids)
        tids, scores, parents = self._time_rescore(tids, scores, parents, time_q)
        for t, p, sc in zip(tids.tolist(), parents.tolist(), scores.tolist()):
            g = groups.get(p)
            if g is None:
                if len(groups) >= self.top_k:
                    continue
                groups[p] = g = TopicHits(p)
            g.turn_ids.append(t)
            g.scores.append(sc)
        return np.fromiter(groups, dtype=np.int64, count=len(groups)), groups

    def _topic_ids(self, tids: np.ndarray) -> np.ndarray:
        """The topic id of each turn record id (int64 ``[n]``): the store's ``topic_ids`` when it
        has one, else read through ``turns_with_topics``."""
        if len(tids) == 0:
            return np.zeros(0, np.int64)
        fn = getattr(self.store, "topic_ids", None)
        if fn is not None:
            return np.asarray(fn(tids), np.int64)
        return np.asarray([int(tp.id) for _, tp in self.store.turns_with_topics(tids)], np.int64)

    def _retrieve_and_rerank(self, q: np.ndarray, timings: dict[str, float], order_all: bool = False,
                             explore: float | None = None, search_kw: dict | None = None, time_q: Any = None):
        """Top-K search then top-M selection (``order_all``: every candidate, in the reranker's order).

        Returns (candidate ids, candidates, selected ids, selection, groups); ``groups`` is the
        turn+topic grouping of :meth:`_retrieve_turn_topic` (empty in topic mode). ``explore``
        (default ``config.explore``): the share of calls that show a sampled draw
        (:meth:`_choose`; ``0``: always the best scores). ``search_kw``: the checked first-stage
        filters (:meth:`_search_filters`); ``time_q``: the question's time term
        (:meth:`memkern.loops.rmm.timeprior.TimeStage._time_query`).
        """
        import torch

        t0 = time.perf_counter()
        groups: dict[int, TopicHits] = {}
        if self.store.count(self.namespace) == 0:
            timings["retrieve"] = time.perf_counter() - t0
            timings["rerank"] = 0.0
            return np.zeros(0, np.int64), None, np.zeros(0, np.int64), None, groups
        search_kw = search_kw or {}
        if self.two_level and self.store.count(self.namespace, level="turn") > 0:
            ids, groups = self._retrieve_turn_topic(q, search_kw, time_q)
            first = np.asarray([groups[int(i)].best for i in ids], np.float32)
        else:  # topic mode, or a bank written in topic mode that has no turn records yet (index_turns)
            ids, sc = self.store.search(self.namespace, q, k=self.top_k,
                                        **{k: v for k, v in search_kw.items() if k in SEARCH_FILTER_KEYWORDS})
            ids, sc = np.asarray(ids).reshape(-1), np.asarray(sc, np.float32).reshape(-1)
            first = sc[ids >= 0]
            ids = ids[ids >= 0].astype(np.int64)
        emb = np.asarray(self.store.embeddings(ids), dtype=np.float32) if len(ids) else np.zeros((0, self.store.dim), np.float32)
        if groups and len(ids):
            # Reranker candidate = best turn + alpha * topic (the topic vector alone would re-rank by
            # topic); the order comes from the first-stage score, the reranker's prior.
            best = np.asarray(self.store.embeddings([groups[int(i)].turn_ids[0] for i in ids]), dtype=np.float32)
            emb = best + np.float32(self.alpha) * emb
        timings["retrieve"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        n = len(ids)
        m = n if order_all else self.top_m
        explore = self.explore if explore is None else float(explore)
        if n <= 1 or (n <= m and not order_all):
            # Nothing to choose: every candidate is shown, the reranker neither samples nor learns.
            timings["rerank"] = time.perf_counter() - t0
            return ids, emb, ids, None, groups
        cand = torch.zeros(1, self.top_k, self.store.dim, dtype=torch.float32)
        cand[0, :n] = torch.from_numpy(emb)
        mask = torch.zeros(1, self.top_k, dtype=torch.bool)
        mask[0, :n] = True
        # The first-stage score is the reranker's prior: it learns a residual over it, and a fresh
        # reranker keeps the first stage's order.
        prior = torch.zeros(1, self.top_k, dtype=torch.float32)
        prior[0, :n] = torch.from_numpy(first)
        sel = self._choose(torch.from_numpy(q), cand, mask, m, 0.0 if order_all else explore, prior=prior)
        picks = [int(i) for i in sel.indices[0].tolist() if int(i) >= 0 or not order_all]
        bad = [i for i in picks if not 0 <= i < n]
        if bad:
            raise MemkernValueError(f"reranker.select: expected indices of unmasked candidates in [0, {n}), got {picks}")
        timings["rerank"] = time.perf_counter() - t0
        return ids, emb, ids[picks], sel, groups

    def _choose(self, q: Any, cand: Any, mask: Any, m: int, explore: float, **select_kw: Any) -> Any:
        """The reranker's choice of ``m`` candidates: its best (``greedy=True``), or, on a share
        ``explore`` of the calls, a Gumbel-top-M draw from its own Philox stream.

        With ``explore > 0`` every call draws (``reranker.select`` without a seed: the reranker's
        ``seed`` and advancing counter, persisted with its state), and the call explores when
        ``explore >= 1`` or when the uniform at the draw's counter under the coin key
        (:data:`EXPLORE_COIN_KEY` xor the reranker's seed) is below ``explore``. A sampled draw
        has ``greedy=False`` (:attr:`memkern.loops.rmm.Response.explored`).

        Parameters
        ----------
        q : float32 [1, d]
        cand : float32 [1, K, d]
        mask : bool [1, K]
        m : int
        explore : float in [0, 1]
        select_kw : passed to ``reranker.select``

        Returns
        -------
        memkern.Selection
        """
        rr = self.reranker
        if explore > 0.0:
            draw = rr.select(q, cand, mask=mask, m=m, **select_kw)
            if explore >= 1.0:
                return draw
            import torch

            from ...score.ops.philox import philox_uniform

            u = philox_uniform(int(draw.seed) ^ EXPLORE_COIN_KEY, torch.tensor([int(draw.offset)], dtype=torch.int64))
            if float(u[0]) < explore:
                return draw
        return rr.select(q, cand, mask=mask, greedy=True, m=m, **select_kw)

    def _shown_memories(self, m_sel: np.ndarray, groups: dict[int, TopicHits], budget: int | None = None,
                        residual: dict[int, float] | None = None):
        """The chosen memories as the answer prompt shows them: ``(memories, shown turn-record ids,
        shown turn keys)``, cut to ``budget`` turns in all.

        Two-level: each chosen topic's summary with only its best retrieved turns (at most
        ``turns_per_memory``), in conversation order; with a budget, the best ``budget`` turns
        among the first ``budget`` memories (no per-memory cap), each turn scored by its
        first-stage score plus its memory's learned residual (``residual``: memory id -> the
        reranker's score minus its prior, :func:`_learned_residual`; missing ids: 0). A memory's
        best turn then scores exactly the reranker's score of the memory, so what the reranker
        learned moves the turns shown, and a fresh reranker (residual 0) shows the first stage's
        best turns. Topic mode: each record's summary with its raw turns (with a budget, memories
        in order until it is spent, the last one cut). Memories are ``{"id", "summary",
        "turns"}``. The shown records are read in two batches.
        """
        memories, shown, keys = [], [], []
        if groups:
            if budget is not None:
                # A budget of N turns: the best N retrieved turns (first-stage score + the memory's
                # learned residual) among the first N memories in the reranker's order. Memories are
                # ordered by their best turn's adjusted score, so no turn of a later memory could
                # enter. (turns_per_memory bounds respond's prompt; here the budget is the bound.)
                res = residual or {}
                cand = sorted(((sc + res.get(int(i), 0.0), k, int(i)) for i in m_sel[:budget] if int(i) in groups
                               for k, sc in enumerate(groups[int(i)].scores)), key=lambda x: -x[0])
                take: dict[int, list[int]] = {}
                for sc, k, i in cand[:budget]:
                    take.setdefault(i, []).append(groups[i].turn_ids[k])
                order = [int(i) for i in m_sel if int(i) in take]
            else:
                order = [int(i) for i in m_sel if int(i) in groups]
                take = {i: groups[i].turn_ids[: self.turns_per_memory] for i in order}
            recs = {r.id: r for r in self.store.get_batch(order + [t for i in order for t in take[i]])}
            for i in order:
                trs = sorted((recs[t] for t in take[i]), key=_turn_order)
                turns = [t.turn for t in trs]
                memories.append({"id": i, "summary": recs[i].summary, "turns": turns})
                shown.append([int(t.id) for t in trs])
                keys.append([turn_key(t) for t in turns])
            return memories, shown, keys
        left = budget
        for i in m_sel:
            if left is not None and left <= 0:
                break
            r = self.store.get(int(i))
            turns = list(r.turns or [])
            if left is not None:
                turns = turns[:left]
            memories.append({"id": int(i), "summary": r.summary, "turns": turns})
            shown.append([])
            keys.append([turn_key(t) for t in turns])
            if left is not None:
                left -= len(turns)
        return memories, shown, keys

    def retrieve(self, query: str, turns: int | None = None, *, explore: bool | None = None, filter: Any = None,
                 time_range: Any = None, time_field: str = "event", recency: Any = None,
                 recency_weight: Any = DEFAULT_RECENCY_WEIGHT, now: Any = None) -> Retrieval:
        """What :meth:`respond` would show the model for ``query``, without calling the model.

        The query is embedded (``kind="query"``), the store searched and the reranker consulted
        exactly as in :meth:`respond` (the reranker does not learn here, and its random stream
        does not move): the result is the reranker's best memories, the same for the same
        query and state. ``turns=None`` gives the ``top_m`` memories :meth:`respond` shows
        (unless that call explores, ``RMMConfig.explore``); ``turns=N`` takes memories in the
        reranker's order until ``N`` turns are shown (the last memory cut to its best turns).

        The filters apply to the first-stage search (module doc); the reranker chooses among
        the records that pass. ``config.time_prior`` adds the question's time term
        (:mod:`memkern.loops.rmm.timeprior`) unless ``time_range`` or ``recency`` is given.

        Parameters
        ----------
        query : str
        turns : int, optional
            Turn budget (>= 1).
        explore : None or False
            Kept for compatibility: ``retrieve`` always returns the reranker's best memories
            (exploration happens only in :meth:`respond`, ``RMMConfig.explore``); ``True``
            raises :class:`memkern.MemkernValueError`.
        filter : dict, optional
            Metadata filter on the records' ``meta`` (``{"key": value}``, ``{"key": {"$in":
            [...]}}``; RMM's records carry ``session_id``, ``source``, ``date``).
        time_range : (start, end), optional
            Unix seconds, either ``None``; keeps records with ``start <= t < end``.
        time_field : {"event", "created", "updated"}
            Which time ``time_range`` and ``recency`` use; ``"event"`` is the session date
            :meth:`end_session` wrote (``created_at`` for records without one).
        recency, recency_weight, now : optional
            Recency prior: half-life in seconds, its weight, the time ages are measured from.
            ``now`` is also the reference of the question's relative time expressions ("last
            week"; :mod:`memkern.loops.rmm.timeprior`; default: the namespace's latest event time).

        Returns
        -------
        Retrieval
        """
        check_text("query", query, max_chars=MAX_QUERY_CHARS, nonempty=True, type_error=False)
        if turns is not None and (isinstance(turns, bool) or not isinstance(turns, (int, np.integer)) or turns < 1):
            raise bad_arg("turns", "None or an int >= 1", turns)
        if explore is not None and explore is not False:
            raise bad_arg("explore", "None or False (retrieve returns the reranker's best memories; exploration is "
                                     "respond's, RMMConfig.explore)", explore)
        search_kw = self._first_stage(query, None if turns is None else int(turns),
                                      self._search_filters(filter, time_range, time_field, recency, recency_weight, now))
        timings: dict[str, float] = {}
        t0 = time.perf_counter()
        time_q = self._time_query(query, now, search_kw)
        timings["time"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        q = self._embed([query], kind="query")
        timings["embed"] = time.perf_counter() - t0
        ids, _, m_sel, sel, groups = self._retrieve_and_rerank(q, timings, order_all=turns is not None, explore=0.0,
                                                               search_kw=search_kw, time_q=time_q)
        t0 = time.perf_counter()
        residual = _learned_residual(ids, sel) if turns is not None else None
        memories, shown, keys = self._shown_memories(m_sel, groups, None if turns is None else int(turns), residual)
        timings["show"] = time.perf_counter() - t0
        timings["total"] = sum(timings.values())
        return Retrieval(query, [m["id"] for m in memories], memories, keys, shown,
                         None if turns is None else int(turns), timings)
