"""RMM's prospective reflection: a finished session -> topics -> folded into the bank.

The extractor splits each session into topics (:mod:`memkern.ingest.extract`); topics of one session
that repeat each other (cosine >= 0.95) are folded together; each remaining topic is compared with
its ``candidates_k`` most similar memories and the decider chooses ADD / MERGE / UPDATE /
INVALIDATE / NOOP, applied by :func:`memkern.ingest.apply.apply_decision`. In two-level memory every turn
of the session is embedded once, through the turn template, and stored as its own turn record
(its text the turn rendered with ``text_template``, what lexical search matches); the TextTiling
extractor (``"embedding"``) segments the session from those same vectors.
"""
from __future__ import annotations

import datetime as _dt
import logging
import time
from typing import Any, Sequence

import numpy as np

from ...errors import MemkernTypeError, bad_arg
from ...ingest.extract import TextTilingExtractor, Topic, validate_turns
from ...protocols import TurnStore, supports_event_time
from ...text.template import event_seconds, parse_date
from ...base.validate import check_id
from ...text.time import mentioned_time
from ...ingest.apply import Candidate, UpdateResult, apply_decision, full_turn_matrix, has_all_turn_records
from .aio import locked
from .retrieve import _normalize

log = logging.getLogger("memkern")

__all__ = ["ReflectStage"]


class ReflectStage:
    """Prospective reflection of :class:`memkern.RMM` (a mixin: it uses the RMM's ``store``,
    ``namespace``, ``config`` fields, ``extractor``, ``decider`` and ``_embed``)."""

    def end_session(self, turns: Sequence[dict], session_id: str | int | None = None, date: Any = None, *,
                    timestamp: Any = None) -> list[UpdateResult]:
        """Prospective reflection: extract the session's topics and fold them into the bank.

        Parameters
        ----------
        turns : list of dict
            The session's turns: ``role``, ``content``; optional ``speaker`` (the speaker's name,
            embedded through the turn template), ``turn_id`` (your id for the turn, returned by
            :meth:`retrieve`), ``date`` / ``timestamp``; extra keys kept. Each stored turn gets
            ``session_id`` and ``turn_index`` unless it has them, and, when the session has a
            date and the turn mentions a time ("last night", "in March"), ``mentioned_time``:
            ``[start, end]`` unix seconds read relative to the date
            (:func:`memkern.text.time.mentioned_time`; the time term of :mod:`memkern.loops.rmm.timeprior`).
        session_id : str or int, optional
            Defaults to a counter-based id.
        date : str, float or datetime, optional
            The session's date, in a form :func:`memkern.text.template.event_seconds` reads (unix
            seconds, a datetime / date, ISO ``"2023-05-08"``, LoCoMo ``"1:56 pm on 8 May, 2023"``,
            LongMemEval ``"2023/05/20 (Sat) 02:21"``, ``"8 May 2023"``, ``"May 8, 2023"``; a time
            without an offset is UTC). Each turn without its own ``date`` gets it, it is
            embedded through the turn template (``"[2023-05-08] Caroline: ..."``), stored in each
            new record's ``meta["date"]`` as given, and written as unix seconds to the store's
            ``event_time`` (topic and turn records; MERGE / UPDATE keep the latest event, see
            :func:`memkern.ingest.apply.apply_decision`) when the store takes it
            (:func:`memkern.protocols.supports_event_time`; otherwise only turns and meta keep
            it). An unreadable date raises :class:`memkern.MemkernValueError` naming ``date``
            before anything is extracted or written.
        timestamp : str, optional
            The older name of the session's date, free text: stored in each turn
            (``timestamp``) and in ``meta["timestamp"]``; also used as the date when ``date`` is
            not given (then written to ``event_time`` only when ``event_seconds`` reads it).

        Returns
        -------
        list[UpdateResult]
            One per topic; ``results[0].timings`` (shared by all) holds ``extract``, ``embed``,
            ``decide`` and ``update`` seconds.
        """
        return self.end_sessions([turns], [session_id], [timestamp], dates=[date])[0]

    @locked
    def end_sessions(
        self,
        sessions: Sequence[Sequence[dict]],
        session_ids: Sequence[Any] | None = None,
        timestamps: Sequence[Any] | None = None,
        extract_batch: int = 4,
        progress: Any = None,
        dates: Sequence[Any] | None = None,
    ) -> list[list[UpdateResult]]:
        """Prospective reflection over several sessions, in order (extraction batched).

        Extraction of up to ``extract_batch`` sessions runs as one batched model call; updates
        are applied session by session so later sessions see earlier ones. ``progress`` is an
        optional callable ``progress(n_sessions_done)``. ``dates`` / ``timestamps``: one per
        session (see :meth:`end_session`); every date is checked before anything is written (an
        unreadable ``dates[i]`` raises :class:`memkern.MemkernValueError` naming it).
        """
        if isinstance(sessions, (str, bytes)) or not isinstance(sessions, Sequence):
            raise bad_arg("sessions", "a list of sessions (lists of turn dicts)", type(sessions).__name__, MemkernTypeError)
        n = len(sessions)
        session_ids = list(session_ids) if session_ids is not None else [None] * n
        timestamps = list(timestamps) if timestamps is not None else [None] * n
        dates = list(dates) if dates is not None else [None] * n
        if len(session_ids) != n or len(timestamps) != n or len(dates) != n:
            raise bad_arg("session_ids/timestamps/dates", f"{n} entries",
                          (len(session_ids), len(timestamps), len(dates)))
        prepared = []
        for i, turns in enumerate(sessions):
            turns = validate_turns(turns, f"sessions[{i}]")
            sid = session_ids[i]
            if sid is None:
                sid = f"s{int(time.time() * 1000)}-{i}"
            sid = check_id("session_id" if n == 1 else f"session_ids[{i}]", sid)
            if dates[i] is not None:
                et = event_seconds(dates[i], "date" if n == 1 else f"dates[{i}]")
                if isinstance(dates[i], _dt.date):  # stored in turns and meta as JSON: ISO 8601 text
                    dates[i] = dates[i].isoformat()
            else:  # the legacy free-text timestamp dates the records only when it reads as a date
                et = event_seconds(timestamps[i], "timestamp") if parse_date(timestamps[i]) is not None else None
            date = dates[i] if dates[i] is not None else timestamps[i]
            annotated = []
            for j, t in enumerate(turns):
                t = dict(t)
                t.setdefault("session_id", sid)
                t.setdefault("turn_index", j)
                if timestamps[i] is not None:
                    t.setdefault("timestamp", timestamps[i])
                if dates[i] is not None:
                    t.setdefault("date", dates[i])
                if et is not None and "mentioned_time" not in t:
                    mt = mentioned_time(t["content"], et)  # "last night" said on May 4: May 3
                    if mt is not None:
                        t["mentioned_time"] = mt
                annotated.append(t)
            prepared.append((sid, annotated, (timestamps[i], date, et)))
        out: list[list[UpdateResult]] = []
        for start in range(0, n, max(1, int(extract_batch))):
            chunk = prepared[start : start + extract_batch]
            t0 = time.perf_counter()
            turn_embs = self._turn_embeddings([c[1] for c in chunk])
            t_turns = (time.perf_counter() - t0) / max(1, len(chunk))
            t0 = time.perf_counter()
            ex = self.extractor
            if turn_embs is not None and isinstance(ex, TextTilingExtractor) and ex.template == self.turn_template:
                # the extractor would embed the very texts the turn records are embedded from
                topics_per = ex.extract_batch([c[1] for c in chunk], seed=self.seed, turn_embeddings=turn_embs)
            else:
                topics_per = ex.extract_batch([c[1] for c in chunk], seed=self.seed)
            t_extract = (time.perf_counter() - t0) / max(1, len(chunk))
            for i, ((sid, turns, ts), topics) in enumerate(zip(chunk, topics_per)):
                res = self._fold(topics, turns, sid, ts, t_extract, None if turn_embs is None else turn_embs[i],
                                 t_turns)
                out.append(res)
                if progress is not None:
                    progress(len(out))
        return out

    def _turn_embeddings(self, sessions: list[list[dict]]) -> list[np.ndarray] | None:
        """Two-level memory: each session's turns embedded through the turn template, in one
        batch, float32 ``[len(session), d]`` per session; ``None`` in topic mode."""
        if not self.two_level:
            return None
        texts = [self.turn_template.render_turn(t) for s in sessions for t in s]
        emb = self._embed(texts) if texts else np.zeros((0, self.store.dim), np.float32)
        out, pos = [], 0
        for s in sessions:
            out.append(emb[pos:pos + len(s)])
            pos += len(s)
        return out

    def _candidates(self, embs: np.ndarray) -> list[list[Candidate]]:
        if self.store.count(self.namespace) == 0:
            return [[] for _ in range(len(embs))]
        k = min(self.candidates_k, max(1, self.store.count(self.namespace)))
        ids, _ = self.store.search(self.namespace, embs, k=k)
        ids = np.asarray(ids)
        out = []
        for row, e in zip(ids, _normalize(embs)):
            valid = [int(i) for i in row if i >= 0]
            if not valid:
                out.append([])
                continue
            sims = _normalize(self.store.embeddings(valid)) @ e
            cands = [Candidate(i, self.store.get(i).summary, float(s)) for i, s in zip(valid, sims)]
            cands.sort(key=lambda c: -c.similarity)
            out.append(cands)
        return out

    def _fold(self, topics: list[Topic], turns: list[dict], sid: str, ts: Any, t_extract: float,
              turn_embs: np.ndarray | None = None, t_turns: float = 0.0) -> list[UpdateResult]:
        """Fold one session's topics into the bank; ``turn_embs`` (two-level): its turns'
        embeddings ``[len(turns), d]`` (:meth:`_turn_embeddings`, embedded once per turn)."""
        timings = {"extract": t_extract}
        if not topics:
            timings.update(embed=t_turns, decide=0.0, update=0.0, total=t_extract + t_turns)
            return []
        t0 = time.perf_counter()
        embs = self._embed([tp.summary for tp in topics])
        if not turns:
            turn_embs = None
        timings["embed"] = time.perf_counter() - t0 + t_turns
        # Topics of one session that repeat each other are folded together first.
        keep: list[int] = []
        ne = _normalize(embs)
        for i in range(len(topics)):
            dup = next((j for j in keep if float(ne[i] @ ne[j]) >= 0.95), None)
            if dup is None:
                keep.append(i)
            else:
                topics[dup].turns = sorted(set(topics[dup].turns) | set(topics[i].turns))
        topics = [topics[i] for i in keep]
        embs = embs[keep]
        t0 = time.perf_counter()
        cands = self._candidates(embs)
        t_search = time.perf_counter() - t0
        t0 = time.perf_counter()
        items = [(tp.summary, c) for tp, c in zip(topics, cands)]
        decisions = self.decider.decide_batch(items, seed=self.seed)
        timings["decide"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        results = []
        timestamp, date, et = ts
        self._note_event_time(et)
        if et is not None and not supports_event_time(self.store):
            log.debug("rmm.end_session %s: store %s takes no event_time; the date stays in turns and meta", sid,
                      type(self.store).__name__)
            et = None
        for tp, e, c, d in zip(topics, embs, cands, decisions):
            meta = {"session_id": sid, "source": tp.source}
            if timestamp is not None:
                meta["timestamp"] = timestamp
            if date is not None:
                meta["date"] = date
            te = None
            if self.two_level:
                te = turn_embs[list(tp.turns)] if tp.turns and turn_embs is not None \
                    else np.zeros((0, self.store.dim), np.float32)
            r = apply_decision(
                self.store, self.namespace, tp.summary, e, [turns[i] for i in tp.turns], d, c,
                embed=lambda texts: self._embed(texts), meta=meta, topic_source=tp.source, turn_embeddings=te,
                event_time=et, render_turn=self.turn_template.render_turn, turn_text=self._turn_text,
            )
            results.append(r)
        self._supersede(turns, sid, et, results)
        timings["update"] = time.perf_counter() - t0 + t_search
        timings["total"] = sum(timings[k] for k in ("extract", "embed", "decide", "update"))
        for r in results:
            r.timings = timings
        log.debug(
            "rmm.end_session %s: %d topics -> %s; timings %s", sid, len(results),
            [r.action for r in results], {k: round(v * 1000, 2) for k, v in timings.items()},
        )
        return results

    def index_turns(self) -> int:
        """Give every active topic of the namespace that lacks turn records one per turn.

        For a bank written in topic mode and then used with ``retrieval="turn+topic"``: the
        missing turns are embedded (``kind="passage"``) and the topic gets a new version with the
        same summary, embedding and turns (``store.update``). Needs a two-level store.

        Returns
        -------
        int
            Number of topics given turn records.
        """
        if not isinstance(self.store, TurnStore):
            raise bad_arg("store", "a store with two-level memory (memkern.protocols.TurnStore)", type(self.store).__name__,
                          MemkernTypeError)
        from ...store.bank import namespace_ids

        done = 0
        for i in namespace_ids(self.store, self.namespace, include_invalidated=False):
            r = self.store.get(i)
            if not r.turns or has_all_turn_records(r):
                continue
            te = full_turn_matrix(self.store, r, r.turns, [], np.zeros((0, self.store.dim), np.float32), self._embed,
                                  self.turn_template.render_turn)
            tx = self._turn_text
            self.store.update(i, turns=r.turns, turn_embeddings=te,
                              **({"turn_texts": [tx(t) for t in r.turns]} if tx is not None else {}))
            done += 1
        log.info("rmm.index_turns: %d topic(s) of namespace %r given turn records", done, self.namespace)
        return done
