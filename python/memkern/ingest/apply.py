"""Memory update (prospective reflection, step 2): how a new topic memory enters the bank.

Each new topic retrieves its most similar memories in the namespace and one decision is taken:

========== =====================================================================================
ADD        new information: a new record.
MERGE      same topic, compatible details: the target's summary becomes the merged summary
           (re-embedded), the new turns are unioned into the target (``store.merge``).
UPDATE     newer state supersedes the old one: the target gets the new summary (re-embedded) and
           the union of turns as a new version; the previous version stays in ``history``.
INVALIDATE a stated fact is withdrawn: the target is marked invalidated (kept, excluded from
           search) with the new summary as the reason, and the withdrawal itself is ADDed as a
           new record (``meta["invalidates"] = target``) so its turns are never lost.
NOOP       duplicate: summary and embedding unchanged; new raw turns (if any) are unioned into the
           target so that no turn is lost.
========== =====================================================================================

Two-level memory (``apply_decision(..., turn_embeddings=...)``): every action above also keeps the
topic's turn records complete, one per turn of its turn list (see :func:`apply_decision`).

Deciders: :class:`LLMDecider` asks the chat model (validated JSON; an invalid answer falls back to
ADD, logged) and :class:`EmbeddingDecider` uses cosine-similarity thresholds plus English cue
words (documented on the class).
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from ..text.contradict import find_contradictions, statements
from ..errors import bad_arg
from ..text.jsonrepair import JSONRepairError, parse_json
from . import prompts
from ..base.turns import turn_key, union_turns
from ..protocols import ACTIONS, Candidate, Decision

if TYPE_CHECKING:  # pragma: no cover
    from ..protocols import ChatModel, Store

log = logging.getLogger("memkern")

__all__ = [
    "ACTIONS",
    "Candidate",
    "Decision",
    "UpdateResult",
    "EmbeddingDecider",
    "AppendDecider",
    "LLMDecider",
    "apply_decision",
    "union_turns",
    "merge_summaries",
    "supersede_summary",
    "full_turn_matrix",
    "has_all_turn_records",
]


@dataclass
class UpdateResult:
    """Effect of one new topic memory on the store.

    Attributes
    ----------
    action : str
        One of :data:`ACTIONS` (what was applied; may differ from the decision when the target
        disappeared meanwhile, then ``note`` says so).
    id : int
        The record that now holds the topic (new id for ADD / INVALIDATE, the target otherwise).
    target_id : int or None
        The existing record the decision concerned (``None`` for ADD).
    summary : str
        The summary stored (for NOOP: the target's unchanged summary).
    similarity : float
        Cosine similarity to the most similar existing memory (0.0 when the namespace was empty).
    topic_source : str
        Extractor that produced the topic (``llm``, ``embedding``, ``fallback``).
    fallback : bool
        The decision was an invalid model answer replaced by ADD.
    note : str
    """

    action: str
    id: int
    target_id: int | None
    summary: str
    similarity: float = 0.0
    topic_source: str = ""
    fallback: bool = False
    note: str = ""
    timings: dict[str, float] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------- helpers


_PREFIX = "User said: "
_SENT = re.compile(r"(?<=[.!?])\s+")


def merge_summaries(old: str, new: str, max_chars: int = 600) -> str:
    """Old summary followed by the new sentences it lacks; oldest sentences dropped past ``max_chars``."""
    prefix = _PREFIX if old.startswith(_PREFIX) else ""
    body_old = old[len(prefix):] if prefix else old
    body_new = new[len(_PREFIX):] if new.startswith(_PREFIX) else new
    sents = [s.strip() for s in _SENT.split(body_old) if s.strip()]
    have = {s.lower() for s in sents}
    sents += [s.strip() for s in _SENT.split(body_new) if s.strip() and s.strip().lower() not in have]
    while len(sents) > 1 and len(prefix) + len(" ".join(sents)) > max_chars:
        sents.pop(0)
    return prefix + " ".join(sents)


def supersede_summary(old: str, new: str, embed: Callable[[list[str]], np.ndarray], threshold: float = 0.4) -> tuple[str, int]:
    """Old summary without the sentences ``new`` supersedes, followed by ``new``.

    An old sentence is superseded when its cosine similarity to ``new`` is ``>= threshold``;
    unrelated sentences of the old summary (another subject that shared the record) are kept.

    Returns
    -------
    (summary, kept) : tuple[str, int]
        The combined summary and the number of old sentences kept.
    """
    prefix = _PREFIX if old.startswith(_PREFIX) else ""
    body_old = old[len(prefix):] if prefix else old
    body_new = new[len(_PREFIX):] if new.startswith(_PREFIX) else new
    sents = [x.strip() for x in _SENT.split(body_old) if x.strip()]
    if not sents:
        return new, 0
    e = np.asarray(embed(sents + [body_new]), dtype=np.float32)
    e = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
    sims = e[:-1] @ e[-1]
    kept = [x for x, sim in zip(sents, sims) if float(sim) < threshold]
    if not kept:
        return new, 0
    return (prefix or (_PREFIX if new.startswith(_PREFIX) else "")) + " ".join(kept + [body_new]), len(kept)


def _unrelated(a: np.ndarray, b: np.ndarray, threshold: float) -> bool:
    a = np.asarray(a, np.float32).reshape(-1)
    b = np.asarray(b, np.float32).reshape(-1)
    cos = float(a @ b) / max(float(np.linalg.norm(a) * np.linalg.norm(b)), 1e-12)
    return cos < threshold


def _is_active(record: Any) -> bool:
    status = getattr(record, "status", "active")
    return status is None or str(status).lower() in ("active", "0", "ok", "valid")


def has_all_turn_records(target: Any) -> bool:
    """Whether every turn of a topic record has its turn record (two-level memory)."""
    return len(getattr(target, "turn_ids", ()) or ()) >= len(target.turns or [])


def full_turn_matrix(store: Any, target: Any, all_turns: Sequence[dict], new_turns: Sequence[dict],
                      new_embs: np.ndarray, embed: Callable[[list[str]], np.ndarray],
                      render_turn: Callable[[dict], str] | None = None) -> np.ndarray | None:
    """Turn embeddings float32 ``[len(all_turns), d]`` for ``all_turns`` (the target's turns
    unioned with ``new_turns``): rows of ``new_embs`` for the new turns, the stored vectors of the
    target's turn records for old turns, ``embed([render_turn(t)])`` for turns that have neither
    (``render_turn``: the turn template RMM embeds new turns with,
    :meth:`memkern.text.template.TurnTemplate.render_turn`, so old and new turn vectors embed the same
    text; ``None``: the turn's content).
    ``None`` when ``all_turns`` is empty."""
    if not all_turns:
        return None
    by_key: dict[str, np.ndarray] = {}
    for t, e in zip(new_turns, new_embs):
        by_key.setdefault(turn_key(t), np.asarray(e, np.float32))
    tids = [int(i) for i in (getattr(target, "turn_ids", ()) or ())]
    if tids:
        recs = store.get_batch(tids)
        vecs = np.asarray(store.embeddings(tids), np.float32)
        for r, e in zip(recs, vecs):
            if r.turn is not None:
                by_key.setdefault(turn_key(r.turn), e)
    missing = [i for i, t in enumerate(all_turns) if turn_key(t) not in by_key]
    if missing:
        render = render_turn or (lambda t: str(t.get("content", "")))
        em = np.asarray(embed([render(all_turns[i]) for i in missing]), np.float32)
        for i, e in zip(missing, em):
            by_key[turn_key(all_turns[i])] = e
    return np.stack([by_key[turn_key(t)] for t in all_turns]).astype(np.float32)


# --------------------------------------------------------------------------------------------- deciders


class EmbeddingDecider:
    """Decide by similarity thresholds (LLM-free, deterministic).

    With ``s`` = cosine similarity of the new memory to its most similar existing memory:

    - ``s >= noop_threshold`` (0.92): NOOP (a near-verbatim repeat);
    - ``s >= cue_threshold`` (0.45) and the new summary has a *withdrawal* cue ("no longer",
      "not anymore", "stopped", "quit", "cancelled", "broke up", "gave up", ...) and no *change*
      cue: INVALIDATE the most similar memory;
    - ``s >= cue_threshold`` and a *change* cue ("now", "moved", "switched", "changed",
      "instead", "new", "started", "promoted", ...): UPDATE it (new summary supersedes);
    - ``s >= merge_threshold`` (0.6): MERGE (same topic, details added);
    - otherwise: ADD.

    With ``embed`` given, UPDATE and INVALIDATE act per sentence: the old summary's sentences
    whose similarity to the new summary is ``>= supersede_threshold`` (0.4) are replaced by it,
    the others are kept (see :func:`supersede_summary`); an INVALIDATE that would leave other
    statements of the record standing becomes an UPDATE that drops only the withdrawn ones.

    Before those rules (``slots=True``, default), a contradiction is looked for
    (:mod:`memkern.text.contradict`): a first-person statement of the new summary that makes one of a
    candidate's statements stale ("I live in Berlin" against "I moved to Munich", "I quit my job"
    against "I work at the bakery"), for candidates with similarity ``>= slot_threshold`` (0.2).
    The first such candidate is UPDATEd to its sentences without the stale ones followed by the
    new summary (INVALIDATEd when nothing else remains and the new summary is a withdrawal), so
    a contradicting memory is never MERGEd into one that says both; the old version stays in
    the store's history. ``cues=False`` turns the cue-word rules off (the slot check alone: far
    fewer false UPDATE / INVALIDATE on real conversations, ``bench/RESULTS.md``, conflicting facts).

    Thresholds were calibrated on MiniLM (all-MiniLM-L6-v2) summaries of the bundled sample
    conversation; other embedders may need other values. Cue words are English.
    """

    WITHDRAW = re.compile(
        r"\b(no longer|not any ?more|anymore|stopped|quit|quitting|gave up|give up|cancel+ed|"
        r"called off|broke up|never mind|not true|isn'?t true|wasn'?t true|scratch that|forget (?:that|what))\b",
        re.I,
    )
    CHANGE = re.compile(
        r"\b(moved|moving to|switched|changed|instead|promoted|postponed|rescheduled|replaced|"
        r"upgraded|from now on|these days|now (?:work|live|am|eat|have|use|own)|new (?:job|home|address|phone))\b",
        re.I,
    )

    def __init__(self, noop_threshold: float = 0.92, merge_threshold: float = 0.6, cue_threshold: float = 0.45,
                 embed: Callable[[list[str]], np.ndarray] | None = None, supersede_threshold: float = 0.4,
                 slots: bool = True, slot_threshold: float = 0.2, cues: bool = True):
        for name, v in (("noop_threshold", noop_threshold), ("merge_threshold", merge_threshold),
                        ("cue_threshold", cue_threshold), ("slot_threshold", slot_threshold)):
            if not -1.0 <= float(v) <= 1.0:
                raise bad_arg(name, "a cosine similarity in [-1, 1]", v)
        self.slots = bool(slots)
        self.slot_threshold = float(slot_threshold)
        self.cues = bool(cues)
        self.noop_threshold = float(noop_threshold)
        self.merge_threshold = float(merge_threshold)
        self.cue_threshold = float(cue_threshold)
        self.embed = embed
        self.supersede_threshold = float(supersede_threshold)

    def decide_batch(self, items: Sequence[tuple[str, Sequence[Candidate]]], seed: int | None = 0) -> list[Decision]:
        """One decision per ``(new_summary, candidates sorted by similarity desc)``.

        The :class:`memkern.protocols.Decider` signature; ``seed`` is accepted for it and
        ignored (this decider is deterministic).
        """
        out = []
        for summary, cands in items:
            if not cands:
                out.append(Decision("ADD", reason="no existing memory"))
                continue
            s = cands[0].similarity
            withdraw = self.cues and bool(self.WITHDRAW.search(summary))
            change = self.cues and bool(self.CHANGE.search(summary))
            hit = self._contradiction(summary, cands) if self.slots and s < self.noop_threshold else None
            if s >= self.noop_threshold:
                out.append(Decision("NOOP", 0, reason=f"similarity {s:.3f} >= {self.noop_threshold}"))
            elif hit is not None:
                out.append(hit)
            elif s >= self.cue_threshold and (withdraw or change):
                new_summary, kept = summary, 0
                if self.embed is not None:
                    new_summary, kept = supersede_summary(cands[0].summary, summary, self.embed, self.supersede_threshold)
                if withdraw and not change and kept == 0:
                    out.append(Decision("INVALIDATE", 0, reason=f"withdrawal cue, similarity {s:.3f}"))
                else:
                    why = "change cue" if change else f"withdrawal cue, {kept} other statement(s) kept"
                    out.append(Decision("UPDATE", 0, new_summary, reason=f"{why}, similarity {s:.3f}"))
            elif s >= self.merge_threshold:
                out.append(Decision("MERGE", 0, merge_summaries(cands[0].summary, summary), reason=f"similarity {s:.3f}"))
            else:
                out.append(Decision("ADD", reason=f"similarity {s:.3f} < {self.merge_threshold}"))
        return out


    def _contradiction(self, summary: str, cands: Sequence[Candidate]) -> Decision | None:
        """UPDATE / INVALIDATE of the first candidate the new summary contradicts (class doc), or None."""
        body_new = summary[len(_PREFIX):] if summary.startswith(_PREFIX) else summary
        new = statements(body_new)
        if not new:
            return None
        for j, c in enumerate(cands):
            if c.similarity < self.slot_threshold:
                continue
            prefix = _PREFIX if c.summary.startswith(_PREFIX) else ""
            sents = [x.strip() for x in _SENT.split(c.summary[len(prefix):]) if x.strip()]
            hits = [find_contradictions(new, [(k, o) for o in statements(x)]) for k, x in enumerate(sents)]
            stale = [k for k, h in enumerate(hits) if h]
            if not stale:
                continue
            _, s_new, o = hits[stale[0]][0]
            why = (f"contradiction ({o.attribute}: {o.value!r} -> {'withdrawn' if s_new.negated else repr(s_new.value)}), "
                   f"similarity {c.similarity:.3f}")
            kept = [x for k, x in enumerate(sents) if k not in stale]
            if not kept and all(x.negated for x in new):
                return Decision("INVALIDATE", j, reason=why)
            merged = (prefix or (_PREFIX if summary.startswith(_PREFIX) else "")) + " ".join(kept + [body_new]) \
                if kept else summary
            return Decision("UPDATE", j, merged, reason=why)
        return None


class AppendDecider:
    """Keep every new memory (``"add"``): ADD, or NOOP for an exact repeat (LLM-free).

    For topics that are stretches of the dialogue itself (the ``"embedding"`` and ``"window"``
    extractors): every stretch is evidence, so nothing is merged, rewritten or invalidated. A new
    topic whose similarity to its closest memory is ``>= noop_threshold`` (default 0.999, an
    identical text) and whose summary is the same string is a NOOP.
    """

    def __init__(self, noop_threshold: float = 0.999):
        if not -1.0 <= float(noop_threshold) <= 1.0:
            raise bad_arg("noop_threshold", "a cosine similarity in [-1, 1]", noop_threshold)
        self.noop_threshold = float(noop_threshold)

    def decide_batch(self, items: Sequence[tuple[str, Sequence[Candidate]]], seed: int | None = 0) -> list[Decision]:
        """One :class:`Decision` per ``(new summary, candidates best first)`` item."""
        out = []
        for summary, cands in items:
            c = cands[0] if cands else None
            if c is not None and c.similarity >= self.noop_threshold and c.summary == summary:
                out.append(Decision("NOOP", 0, reason=f"identical memory, similarity {c.similarity:.3f}"))
            else:
                out.append(Decision("ADD", reason="append: every stretch of dialogue is kept"))
        return out


class LLMDecider:
    """Decide by prompting the chat model (validated JSON answer).

    Only candidates with similarity ``>= min_similarity`` are shown (at most ``max_candidates``);
    with none, the decision is ADD without a model call. The answer must parse to
    ``{"action": one of ACTIONS, "index": int in range, "summary": str}``; an unparseable answer,
    an unknown action or a bad index falls back to ADD (logged at warning). A MERGE / UPDATE
    without a usable summary keeps the default summary (merged text / the new summary).
    """

    def __init__(self, chat_model: ChatModel, max_new_tokens: int = 64, min_similarity: float = 0.4, max_candidates: int = 3):
        self.chat_model = chat_model
        self.max_new_tokens = int(max_new_tokens)
        self.min_similarity = float(min_similarity)
        self.max_candidates = int(max_candidates)
        self.last_stats: dict[str, Any] = {}

    def parse(self, text: str, summary: str, cands: Sequence[Candidate]) -> Decision:
        """Validate one model answer into a :class:`Decision` (ADD with ``fallback=True`` if invalid)."""
        try:
            value = parse_json(text, dict)
        except JSONRepairError:
            log.warning("update: unparseable decision %r; falling back to ADD", text[:200])
            return Decision("ADD", fallback=True, reason="unparseable answer")
        action = str(value.get("action", value.get("decision", ""))).strip().upper()
        if action not in ACTIONS:
            log.warning("update: unknown action %r in %r; falling back to ADD", action, text[:200])
            return Decision("ADD", fallback=True, reason=f"unknown action {action!r}")
        if action == "ADD":
            return Decision("ADD", reason="model")
        raw = value.get("index", value.get("id", value.get("target", 0 if len(cands) == 1 else None)))
        idx = None
        if isinstance(raw, (int, float)) and not isinstance(raw, bool) and float(raw).is_integer():
            idx = int(raw)
        elif isinstance(raw, str) and re.fullmatch(r"\s*\[?\s*(\d+)\s*\]?\s*", raw):
            idx = int(re.sub(r"\D", "", raw))
        if idx is None or not 0 <= idx < len(cands):
            log.warning("update: %s with bad index %r (have %d candidates); falling back to ADD", action, raw, len(cands))
            return Decision("ADD", fallback=True, reason=f"bad index {raw!r}")
        new_summary = value.get("summary")
        if not isinstance(new_summary, str) or not new_summary.strip():
            new_summary = None
        else:
            new_summary = " ".join(new_summary.split())
        if action == "MERGE" and new_summary is None:
            new_summary = merge_summaries(cands[idx].summary, summary)
        if action == "UPDATE" and new_summary is None:
            new_summary = summary
        return Decision(action, idx, new_summary if action in ("MERGE", "UPDATE") else None, reason="model")

    def decide_batch(self, items: Sequence[tuple[str, Sequence[Candidate]]], seed: int | None = 0) -> list[Decision]:
        """One decision per ``(new_summary, candidates sorted by similarity desc)``, all prompts
        in one batched ``generate`` call seeded with ``seed`` (the
        :class:`memkern.protocols.Decider` signature)."""
        out: list[Decision | None] = []
        todo, msgs, shown = [], [], []
        for i, (summary, cands) in enumerate(items):
            near = [c for c in cands if c.similarity >= self.min_similarity][: self.max_candidates]
            if not near:
                out.append(Decision("ADD", reason="no similar memory"))
                continue
            out.append(None)
            todo.append(i)
            shown.append(near)
            msgs.append(prompts.update_messages(summary, [c.summary for c in near]))
        self.last_stats = {"calls": 0, "prompts": len(msgs)}
        if msgs:
            texts = self.chat_model.generate(msgs, max_new_tokens=self.max_new_tokens, json=True, seed=seed)
            self.last_stats["calls"] = 1
            for i, near, text in zip(todo, shown, texts):
                d = self.parse(text, items[i][0], near)
                if d.target is not None:  # re-index into the full candidate list
                    d.target = list(items[i][1]).index(near[d.target])
                out[i] = d
        return out  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------- apply


def apply_decision(
    store: Store,
    namespace: str,
    summary: str,
    embedding: np.ndarray,
    turns: list[dict],
    decision: Decision,
    candidates: Sequence[Candidate],
    embed: Callable[[list[str]], np.ndarray],
    meta: dict | None = None,
    topic_source: str = "",
    min_summary_similarity: float = 0.3,
    turn_embeddings: np.ndarray | None = None,
    event_time: float | None = None,
    render_turn: Callable[[dict], str] | None = None,
    turn_text: Callable[[dict], str] | None = None,
) -> UpdateResult:
    """Apply one decision to ``store`` (see the module table for the exact effects).

    Parameters
    ----------
    embedding : float32 [d]
        Embedding of ``summary``.
    turns : list of dict
        The topic's raw turns (with ``session_id`` / ``turn_index``).
    embed : callable
        ``embed([text]) -> float32 [1, d]``, used to re-embed merged / updated summaries.
    min_summary_similarity : float
        A summary written by the model (MERGE / UPDATE) whose cosine similarity to the new
        memory is below this is treated as invented: the merge falls back to concatenating the
        old and new summaries, the update to the new memory's own summary (logged; ``note``).
    turn_embeddings : float32 [len(turns), d], optional
        Two-level memory: embeddings of ``turns`` (row ``i`` for ``turns[i]``). When given, every
        write also keeps the topic's turn records complete (``store`` must be a
        :class:`memkern.MemoryStore`): ADD / INVALIDATE store them with the new record, MERGE adds
        records for the new turns, NOOP / UPDATE replace the target's turn records with one per
        turn of the unioned list (old turns reuse their stored turn vectors; turns of a target
        that had no turn records are embedded with ``embed``).
    event_time : float, optional
        The session's date in unix seconds (:func:`memkern.text.template.event_seconds`), written to
        the store's ``event_time`` (``store`` must take ``event_time=`` on ``add`` / ``merge`` /
        ``update``, :func:`memkern.protocols.supports_event_time`). ADD / INVALIDATE: the new
        record (and its turn records) get it. MERGE / UPDATE, and a NOOP that adds turns: the
        target keeps the *latest* event, ``max(target.event_time, event_time)`` (``event_time``
        when the target has none); new turn records get that time too. ``None``: no event time
        is written (the target's is kept).
    render_turn : callable, optional
        ``render_turn(turn) -> str``: the text a turn is embedded from when a target's old turn has
        no turn record yet (:func:`full_turn_matrix`); RMM passes its turn template. ``None``: the
        turn's content.
    turn_text : callable, optional
        Two-level memory: ``turn_text(turn) -> str``, the text of every turn record this call writes
        (``store`` must take ``turn_texts=``, :func:`memkern.protocols.supports_hybrid_turns`): what
        lexical search matches, e.g. the turn with its speaker and date. ``None``: the store's
        default (the turn's content).
    """
    sim = candidates[0].similarity if candidates else 0.0
    base = dict(similarity=float(sim), topic_source=topic_source, fallback=decision.fallback)
    action = decision.action
    target_id = None
    note = ""
    target = None
    if action != "ADD":
        target_id = int(candidates[decision.target].id)
        try:
            target = store.get(target_id)
        except KeyError:
            target = None
        if target is None or not _is_active(target):
            note = f"{action} target {target_id} no longer active; added instead"
            log.info("update: %s", note)
            action, target = "ADD", None
    two_level = turn_embeddings is not None
    te_kw: dict[str, Any] = {}
    if two_level:
        te = np.asarray(turn_embeddings, dtype=np.float32)
        if te.ndim != 2 or te.shape[0] != len(turns):
            raise bad_arg("turn_embeddings", f"float32 [{len(turns)}, d] (one row per turn)", tuple(te.shape))
        te_kw = {"turn_embeddings": te if len(turns) else None}
        if turn_text is not None and len(turns):
            te_kw["turn_texts"] = [turn_text(t) for t in turns]

    def texts_of(all_turns: Sequence[dict]) -> dict[str, Any]:
        # turn texts of an update that rewrites every turn record of the target
        return {"turn_texts": [turn_text(t) for t in all_turns]} if turn_text is not None and all_turns else {}

    et_kw: dict[str, Any] = {}
    if event_time is not None:
        et = float(event_time)
        old = getattr(target, "event_time", None) if target is not None else None
        # Latest event: a record that folds in a later session is dated by it; an older
        # session folded into a newer record leaves its date.
        et_kw = {"event_time": et if old is None else max(float(old), et)}
    if action == "ADD":
        rid = store.add(namespace, summary, embedding, turns=turns, meta=meta, **te_kw, **et_kw)
        return UpdateResult("ADD", int(rid), None, summary, note=note, **base)
    if action == "NOOP":
        merged_turns = union_turns(target.turns, turns)
        if len(merged_turns) != len(target.turns or []):
            kw = {"turn_embeddings": full_turn_matrix(store, target, merged_turns, turns, te, embed, render_turn),
                  **texts_of(merged_turns)} if two_level else {}
            store.update(target_id, turns=merged_turns, **kw, **et_kw)
        elif two_level and not has_all_turn_records(target):
            store.update(target_id, turns=merged_turns,
                         turn_embeddings=full_turn_matrix(store, target, merged_turns, turns, te, embed, render_turn),
                         **texts_of(merged_turns))
        return UpdateResult("NOOP", target_id, target_id, target.summary, **base)
    if action == "MERGE":
        new_summary = decision.summary or merge_summaries(target.summary, summary)
        emb = np.asarray(embed([new_summary]), dtype=np.float32)[0]
        if decision.reason == "model" and _unrelated(emb, embedding, min_summary_similarity):
            note = f"model's merged summary {new_summary[:80]!r} is unrelated to the new memory; concatenated instead"
            log.warning("update: %s", note)
            new_summary = merge_summaries(target.summary, summary)
            emb = np.asarray(embed([new_summary]), dtype=np.float32)[0]
        if two_level and not has_all_turn_records(target):
            # The target predates two-level memory: one version with every turn given a record.
            merged_turns = union_turns(target.turns, turns)
            store.update(target_id, summary=new_summary, embedding=emb, turns=merged_turns,
                         turn_embeddings=full_turn_matrix(store, target, merged_turns, turns, te, embed, render_turn),
                         **texts_of(merged_turns), **et_kw)
        else:
            store.merge(target_id, new_summary, emb, turns, **te_kw, **et_kw)
        return UpdateResult("MERGE", target_id, target_id, new_summary, note=note, **base)
    if action == "UPDATE":
        new_summary = decision.summary or summary
        emb = embedding if new_summary == summary else np.asarray(embed([new_summary]), dtype=np.float32)[0]
        if decision.reason == "model" and new_summary != summary and _unrelated(emb, embedding, min_summary_similarity):
            note = f"model's updated summary {new_summary[:80]!r} is unrelated to the new memory; new memory kept"
            log.warning("update: %s", note)
            new_summary, emb = summary, embedding
        merged_turns = union_turns(target.turns, turns)
        kw = {"turn_embeddings": full_turn_matrix(store, target, merged_turns, turns, te, embed, render_turn),
              **texts_of(merged_turns)} if two_level else {}
        store.update(target_id, summary=new_summary, embedding=emb, turns=merged_turns, **kw, **et_kw)
        return UpdateResult("UPDATE", target_id, target_id, new_summary, note=note, **base)
    if action == "INVALIDATE":
        store.invalidate(target_id, summary)
        m = dict(meta or {})
        m["invalidates"] = target_id
        rid = store.add(namespace, summary, embedding, turns=turns, meta=m, **te_kw,
                        **({"event_time": float(event_time)} if event_time is not None else {}))
        return UpdateResult("INVALIDATE", int(rid), target_id, summary, **base)
    raise bad_arg("decision.action", f"one of {ACTIONS}", action)
