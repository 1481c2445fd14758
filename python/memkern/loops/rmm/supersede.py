"""RMM's contradiction step: a later turn that contradicts an earlier one invalidates the stale turn.

With ``RMMConfig.supersede=True`` (two-level memory), after each session is written every new turn
is read for first-person slot statements (:func:`memkern.text.contradict.statements`: where the speaker
lives, works, who they date, their car, diet, favourites, a pet or activity withdrawn). A new
statement that makes an earlier one of the same speaker stale (:func:`memkern.text.contradict.contradicts`:
"I moved to Munich" after "I live in Berlin", "I quit my job" after "I work at the bakery")
invalidates the earlier statement's *turn record* (``store.invalidate(id, reason)``: kept, readable
with its reason, out of search), so retrieval shows the current fact while the old turn stays in
its topic's turns and in the store. Earlier turns of the same session count too; a turn never
supersedes one with a later event time. What was superseded is in
``rmm.last_superseded`` (``[(old turn record id, new turn key, attribute)]``).

The earlier statements come from an index of the namespace's active turn records, read once from
the store and kept current by each session (rebuilt after a write that may have replaced turn
records: MERGE / UPDATE / NOOP). Cost: one regex pass per new turn.
"""
from __future__ import annotations

import logging
import math
from typing import Any, Sequence

from ...text.contradict import Statement, find_contradictions, statements
from ...base.turns import turn_key

log = logging.getLogger("memkern")

__all__ = ["SupersedeStage"]


def _speaker(turn: dict) -> str | None:
    sp = turn.get("speaker")
    if isinstance(sp, str) and sp.strip():
        return sp
    role = turn.get("role")
    return role if isinstance(role, str) else None


class SupersedeStage:
    """The contradiction step of :class:`memkern.RMM` (a mixin: it uses ``store``, ``namespace``,
    ``config``)."""

    _slot_index: list | None = None  # [(turn record id, Statement, event time or NaN)]
    last_superseded: list = []

    def _statements_of(self, turn: Any) -> list[Statement]:
        if not isinstance(turn, dict) or not isinstance(turn.get("content"), str):
            return []
        return statements(turn["content"], _speaker(turn))

    def _build_slot_index(self, skip_session: str | None) -> list:
        ids = [int(i) for i in self.store.ids(self.namespace, level="turn")]
        out = []
        for r in self.store.get_batch(ids) if ids else []:
            turn = r.turn
            if turn is None or (skip_session is not None and str(turn.get("session_id")) == skip_session):
                continue
            et = math.nan if r.event_time is None else float(r.event_time)
            out += [(int(r.id), s, et) for s in self._statements_of(turn)]
        return out

    def _supersede(self, turns: Sequence[dict], sid: str, et: float | None, results: Sequence[Any]) -> list:
        """Invalidate the turn records that this session's turns contradict (module doc)."""
        self.last_superseded = []
        if not self.config.supersede or not self.two_level:
            return []
        new = [(i, self._statements_of(t)) for i, t in enumerate(turns)]
        if any(r.action not in ("ADD", "INVALIDATE") for r in results):
            self._slot_index = None  # a rewrite may have replaced turn records
        if self._slot_index is None:
            self._slot_index = self._build_slot_index(sid)
        new = [(i, st) for i, st in new if st]
        if not new:
            return []
        # this session's turn records, by turn key
        rec: dict[str, int] = {}
        for tid in {int(r.id) for r in results}:
            topic = self.store.get(tid)
            for rid, t in zip(topic.turn_ids, topic.turns or []):
                rec.setdefault(turn_key(t), int(rid))
        t_new = math.nan if et is None else float(et)
        done = []
        for i, st in new:
            key = turn_key(turns[i])
            mine = rec.get(key)
            old = [((rid, s), s) for rid, s, t_old in self._slot_index
                   if rid != mine and not (t_old > t_new)]  # NaN compares false: kept
            stale = {}
            for (rid, o), s_new, _ in find_contradictions(st, old):
                stale.setdefault(rid, (s_new, o))
            for rid, (s_new, o) in stale.items():
                try:
                    r = self.store.get(rid)
                except KeyError:
                    continue
                if getattr(r, "status", "active") != "active":
                    continue
                reason = (f"superseded by turn {turns[i].get('turn_id', key)} ({o.attribute}: {o.value!r} -> "
                          f"{'withdrawn' if s_new.negated else repr(s_new.value)}): {s_new.text[:160]}")
                self.store.invalidate(rid, reason)
                done.append((rid, turns[i].get("turn_id", key), o.attribute))
            if stale:
                self._slot_index = [e for e in self._slot_index if e[0] not in stale]
            if mine is not None:
                self._slot_index += [(mine, s, t_new) for s in st]
        if done:
            log.info("rmm.end_session %s: %d stale turn record(s) invalidated: %s", sid, len(done), done)
        self.last_superseded = done
        return done
