"""RMM's time term: the time a question points at, read without a model, as a prior on its turns.

``RMMConfig.time_prior`` (default ``"soft"``; see ``bench/RESULTS.md``, time-aware retrieval):

- ``"soft"``: the question is parsed (:func:`memkern.text.time.parse_time`) relative to ``now``; the
  first stage's candidate turns are rescored ``score + term * spread`` (:func:`memkern.text.time.rescore`,
  ``spread`` = the candidates' score range) with ``term`` from
  :func:`memkern.text.time.time_prior_scores`: for a question naming a time ("in May 2023", "last
  week", "the week before August 3") a prior on the turn's event time (the session date) or on
  the time the turn itself mentions (``mentioned_time``, read at :meth:`memkern.RMM.end_session`);
  for a question asking for a time ("When did ...?") a bonus for turns that mention one. An event
  anchor ("two days after the charity race") is placed by one lexical search for the anchor
  phrase (no embedding): its best turn's event time. Nothing is dropped; two-level memory only.
- ``"hard"``: the question's range becomes the search's ``time_range`` (``[start, end + lag)``):
  turns outside it are never returned.
- ``"off"``: no time term.

``now`` (the reference of "last week"): the ``now`` given to :meth:`retrieve` / :meth:`respond`,
else the latest date among ``respond``'s ``session_turns``, else the latest event time in the
namespace (the last session written; pass ``now=time.time()`` for a live agent whose last
session is old), else the wall clock. A caller's own ``time_range`` or ``recency`` turns the time
term off for that call.
"""
from __future__ import annotations

import math
import time
from typing import Any, Sequence

import numpy as np

from ...protocols import accepts_keyword
from ...text.template import event_seconds, parse_date, turn_date
from ...text.time import DEFAULT_LAG, DEFAULT_WIDTH, TimeQuery, parse_time, rescore, time_prior_scores

__all__ = ["TimeStage", "TIME_PRIORS"]

#: The values of :attr:`memkern.loops.rmm.RMMConfig.time_prior`.
TIME_PRIORS = ("soft", "hard", "off")

_NAN2 = (math.nan, math.nan)


def _mention(turn: Any) -> tuple[float, float]:
    """A turn dict's ``mentioned_time`` as ``(start, end)`` (NaNs when absent or malformed)."""
    v = turn.get("mentioned_time") if isinstance(turn, dict) else None
    if isinstance(v, (list, tuple)) and len(v) == 2 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v):
        return float(v[0]), float(v[1])
    return _NAN2


class TimeStage:
    """The time term of :class:`memkern.RMM` (a mixin: it uses the RMM's ``store``, ``namespace``
    and ``config``)."""

    _latest_event: float | None = None
    _latest_event_read: bool = False

    def _note_event_time(self, t: float | None) -> None:
        """Keep the namespace's latest event time current (called for each session written)."""
        if t is not None and self._latest_event_read:
            self._latest_event = float(t) if self._latest_event is None else max(self._latest_event, float(t))

    def _latest_event_time(self) -> float | None:
        """The latest event time of the namespace's active topics: read from the store once (also
        when there is none), then kept current by :meth:`_note_event_time`."""
        if not self._latest_event_read:
            from ...store.bank import namespace_ids

            ids = namespace_ids(self.store, self.namespace, include_invalidated=False)
            ts = [r.event_time for r in (self.store.get_batch(ids) if ids else [])
                  if getattr(r, "event_time", None) is not None]
            self._latest_event = float(max(ts)) if ts else None
            self._latest_event_read = True
        return self._latest_event

    def _time_now(self, now: Any, session_turns: Sequence[dict] | None = None) -> float:
        if now is not None:
            return float(now)
        dates = [turn_date(t) for t in session_turns or ()]
        secs = [event_seconds(d) for d in dates if d is not None and parse_date(d) is not None]
        if secs:
            return float(max(secs))
        latest = self._latest_event_time()
        return time.time() if latest is None else latest

    def _time_query(self, query: str, now: Any, search_kw: dict,
                    session_turns: Sequence[dict] | None = None) -> TimeQuery | None:
        """The parsed question for the soft term (``None``: no term). ``"hard"`` adds the range to
        ``search_kw`` (in place) and returns ``None``."""
        mode = self.config.time_prior
        if mode == "off" or "time_range" in search_kw or "recency" in search_kw:
            return None
        tq = parse_time(query, self._time_now(now, session_turns))
        if tq.anchor_offset is not None and not tq.has_range:
            tq = self._place_anchor(tq)
        if mode == "hard":
            if tq.has_range and accepts_keyword(getattr(self.store, "search", None), "time_range"):
                search_kw.update(tq.search_kwargs(DEFAULT_LAG))
            return None
        if not self.two_level or not (tq.has_range or tq.intent):
            return None
        return tq

    def _place_anchor(self, tq: TimeQuery) -> TimeQuery:
        """``tq`` resolved at the event time of the best lexical match of its anchor phrase."""
        if not accepts_keyword(getattr(self.store, "search", None), "mode") or not self.two_level:
            return tq
        try:
            ids, _ = self.store.search(self.namespace, None, k=1, level="turn", mode="lexical", texts=[tq.anchor])
        except (TypeError, ValueError):  # a store without lexical search over turns
            return tq
        i = int(np.asarray(ids).reshape(-1)[0])
        if i < 0:
            return tq
        t = getattr(self.store.get(i), "event_time", None)
        return tq if t is None else tq.resolve(float(t))

    def _time_rescore(self, tids: np.ndarray, scores: np.ndarray, parents: np.ndarray, tq: TimeQuery | None
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Turn record ids (int64 ``[n]``), their scores and topic ids, rescored with the time term
        and re-sorted best first (unchanged, and no record read, when ``tq`` is ``None`` or no
        term applies)."""
        if tq is None or len(tids) == 0:
            return tids, scores, parents
        n = len(tids)
        recs = self.store.get_batch([int(i) for i in tids])
        et = np.fromiter((math.nan if r.event_time is None else r.event_time for r in recs), np.float64, n)
        mt = np.array([_mention(r.turn) for r in recs], dtype=np.float64).reshape(n, 2)
        term = time_prior_scores(tq, et, mt, weight=self.config.time_weight,
                                 intent_weight=self.config.time_intent_weight, width=DEFAULT_WIDTH, lag=DEFAULT_LAG)
        if term is None:
            return tids, scores, parents
        s2 = rescore(np.asarray(scores, np.float32), term)
        order = np.argsort(-s2, kind="stable")
        return tids[order], s2[order], parents[order]
