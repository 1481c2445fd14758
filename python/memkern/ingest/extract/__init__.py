"""Topic extraction (prospective reflection, step 1): one dialogue session -> topic memories.

Two extractors share one protocol, ``extract_batch(sessions) -> list[list[Topic]]``:

- :class:`LLMExtractor` ("llm", the RMM paper's way): a prompt asks the chat model for
  ``{"topics": [{"summary", "turns"}]}``; the answer is repaired (:mod:`memkern.text.jsonrepair`) and
  validated (summaries must be non-empty strings, turn indices are coerced to ints and kept only
  when in range); an unparseable answer gets one retry, then a logged fallback. A session is never
  lost: the fallback stores the session's user statements as one topic, and user turns that no
  topic references are attached to the nearest topic by turn index.
- :class:`TextTilingExtractor` ("embedding", LLM-free; alias :class:`EmbeddingExtractor`): turns
  rendered with the turn template (speaker, date) are embedded; topic boundaries go where the
  similarity between the turns before and after a gap drops most (TextTiling depth scores), with
  minimum and maximum topic sizes; a topic's text is its turns. Deterministic.
- :class:`WindowExtractor` ("window"): fixed windows of ``size`` turns with ``overlap``.
- :class:`SentenceExtractor` ("sentences", LLM-free): user sentences clustered by similarity to
  running topic centroids; the summary is the topic's salient user statements (the extractor
  that was called "embedding" before issue 13).

Sessions from every extractor come back as :class:`Topic` objects whose ``turns`` index into the
session's turn list.
"""
from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ...errors import MemkernTypeError, MemkernValueError, bad_arg
from ...text.jsonrepair import JSONRepairError, coerce_int, parse_json
from .. import prompts
from ...base.validate import check_int, check_turn
from ...protocols import Topic

if TYPE_CHECKING:  # pragma: no cover
    from ...protocols import ChatModel, Embedder

log = logging.getLogger("memkern")

__all__ = [
    "Topic", "LLMExtractor", "EmbeddingExtractor", "TextTilingExtractor", "WindowExtractor", "SentenceExtractor",
    "fallback_topic", "validate_turns", "parse_topics", "complete_coverage", "make_extractor", "EXTRACTORS",
    "gap_similarities", "depth_scores", "tile_boundaries",
]


def validate_turns(turns: Any, name: str = "turns") -> list[dict]:
    """Check a session: a list of dicts with string ``role`` and ``content``; returns a list copy."""
    if isinstance(turns, (str, bytes)) or not isinstance(turns, Sequence):
        raise bad_arg(name, "a list of turn dicts with 'role' and 'content'", type(turns).__name__, MemkernTypeError)
    out = []
    for i, t in enumerate(turns):
        if not isinstance(t, dict):
            raise bad_arg(f"{name}[{i}]", "a dict with 'role' and 'content'", type(t).__name__, MemkernTypeError)
        if "content" not in t or not isinstance(t["content"], str):
            raise bad_arg(f"{name}[{i}]['content']", "a str", t.get("content"), MemkernTypeError)
        if not isinstance(t.get("role", "user"), str):
            raise bad_arg(f"{name}[{i}]['role']", "a str", t.get("role"), MemkernTypeError)
        check_turn(t if "role" in t else dict(t, role="user"), f"{name}[{i}]")  # sizes, UTF-8, JSON values
        out.append(t)
    return out


_SENT_SPLIT = re.compile(r"(?<=[.!?])\s+")
_FILLER = re.compile(
    r"^(hi|hey|hello|thanks|thank you|ok|okay|sure|yes|no|great|cool|bye|good morning|good night)[\s,.!]*",
    re.I,
)


def _salient_sentences(texts: Sequence[str], max_sentences: int = 3) -> list[str]:
    """Informative sentences of user turns: questions and greetings dropped, order kept."""
    out = []
    for text in texts:
        for s in _SENT_SPLIT.split(" ".join(text.split())):
            s = s.strip()
            core = _FILLER.sub("", s).strip()
            if len(core) < 8 or s.endswith("?"):
                continue
            out.append(core[0].upper() + core[1:] if core else core)
    return out[:max_sentences] if max_sentences > 0 else out


def fallback_topic(turns: Sequence[dict], max_chars: int = 400) -> Topic:
    """One topic holding the session's user statements verbatim (used when extraction fails)."""
    user = [i for i, t in enumerate(turns) if str(t.get("role", "user")) == "user"] or list(range(len(turns)))
    sents = _salient_sentences([turns[i]["content"] for i in user], max_sentences=0)
    text = " ".join(sents) if sents else " ".join(" ".join(turns[i]["content"].split()) for i in user)
    if len(text) > max_chars:
        text = text[: max_chars - 3] + "..."
    return Topic(summary=f"User said: {text}" if text else "User said nothing notable.", turns=list(range(len(turns))), source="fallback")


def _attach_uncovered(topics: list[Topic], turns: Sequence[dict]) -> None:
    """Attach each user turn no topic references to the topic nearest in turn index (in place)."""
    covered = {i for t in topics for i in t.turns}
    for i, turn in enumerate(turns):
        if i in covered or str(turn.get("role", "user")) != "user":
            continue
        best = min(topics, key=lambda tp: min((abs(j - i) for j in tp.turns), default=10**9))
        best.turns = sorted(set(best.turns) | {i})


_SUMMARY_KEYS = ("summary", "topic", "memory", "text", "content", "fact")
_TURN_KEYS = ("turns", "turn", "turn_ids", "turn_indices", "indices", "reference", "references")
_EXAMPLE_SUMMARIES = {
    t["summary"].strip().lower() for t in parse_json(prompts.EXTRACT_EXAMPLE_OUT, dict)["topics"]
}


def parse_topics(value: Any, n_turns: int) -> list[Topic]:
    """Validate a parsed extraction answer into topics (bad entries dropped, indices repaired).

    Accepts ``{"topics": [...]}``, a bare list of topics, or one topic dict. A topic without any
    valid turn index references the whole session. Summaries copied from the prompt's example
    are dropped. Raises :class:`MemkernValueError` when no valid topic remains.
    """
    if isinstance(value, dict):
        items = value.get("topics", value.get("memories", [value] if any(k in value for k in _SUMMARY_KEYS) else None))
    else:
        items = value
    if isinstance(items, dict):
        items = [items]
    if not isinstance(items, list):
        raise MemkernValueError(f"extraction answer: expected a 'topics' list, got {value!r}")
    topics = []
    for item in items:
        if isinstance(item, str):
            item = {"summary": item}
        if not isinstance(item, dict):
            continue
        summary = next((item[k] for k in _SUMMARY_KEYS if isinstance(item.get(k), str) and item[k].strip()), None)
        if summary is None:
            continue
        summary = " ".join(summary.split())
        if summary.lower() in _EXAMPLE_SUMMARIES:
            continue
        raw = next((item[k] for k in _TURN_KEYS if k in item), [])
        if not isinstance(raw, list):
            raw = [raw]
        idx = sorted({i for i in (coerce_int(x) for x in raw) if i is not None and 0 <= i < n_turns})
        topics.append(Topic(summary=summary, turns=idx or list(range(n_turns)), source="llm"))
    if not topics:
        raise MemkernValueError(f"extraction answer: expected at least one topic with a summary, got {value!r}")
    return topics


class LLMExtractor:
    """Extract topics by prompting a chat model for JSON (the RMM paper's extractor).

    Parameters
    ----------
    chat_model : object with ``generate(prompts, max_new_tokens=None, json=False, ...)``
    max_new_tokens : int
        Budget of the extraction answer.
    retries : int
        Retries after an unparseable or invalid answer (default 1), then the fallback topic.
    embed : callable, optional
        ``embed(texts) -> float32 [n, d]``; when given, user statements that no extracted summary
        covers become extra topics (:func:`complete_coverage`, ``coverage_threshold``).
    coverage_threshold : float
    """

    name = "llm"

    def __init__(self, chat_model: ChatModel, max_new_tokens: int = 160, retries: int = 1, embed: Any = None,
                 coverage_threshold: float = 0.45):
        self.chat_model = chat_model
        self.max_new_tokens = int(max_new_tokens)
        self.retries = int(retries)
        self.embed = embed
        self.coverage_threshold = float(coverage_threshold)
        self.last_stats: dict[str, Any] = {}

    def _generate(self, messages: list[list[dict]], seed: int | None) -> list[str]:
        return self.chat_model.generate(messages, max_new_tokens=self.max_new_tokens, json=True, seed=seed)

    def extract_batch(self, sessions: Sequence[Sequence[dict]], seed: int | None = 0) -> list[list[Topic]]:
        """Topics of each session; one batched ``generate`` call per attempt.

        Returns
        -------
        list[list[Topic]]
            One list per session, never empty for a session with turns.
        """
        sessions = [validate_turns(s, f"sessions[{i}]") for i, s in enumerate(sessions)]
        results: list[list[Topic] | None] = [None if s else [] for s in sessions]
        last_raw: dict[int, str] = {}
        stats = {"calls": 0, "retries": 0, "fallbacks": 0, "seconds": 0.0}
        for attempt in range(self.retries + 1):
            todo = [i for i, r in enumerate(results) if r is None]
            if not todo:
                break
            msgs = [prompts.extract_messages(sessions[i], retry_of=last_raw.get(i)) for i in todo]
            t0 = time.perf_counter()
            outs = self._generate(msgs, seed)
            stats["seconds"] += time.perf_counter() - t0
            stats["calls"] += 1
            if attempt:
                stats["retries"] += len(todo)
            for i, out in zip(todo, outs):
                try:
                    topics = parse_topics(parse_json(out), len(sessions[i]))
                except (JSONRepairError, MemkernValueError) as exc:
                    last_raw[i] = out
                    log.info("extract: session %d attempt %d unparseable (%s)", i, attempt, str(exc)[:160])
                    continue
                if self.embed is not None:
                    topics = complete_coverage(topics, sessions[i], self.embed, self.coverage_threshold)
                _attach_uncovered(topics, sessions[i])
                results[i] = topics
        for i, r in enumerate(results):
            if r is None:
                stats["fallbacks"] += 1
                log.warning(
                    "extract: no valid topics from the model for session %d after %d attempts; "
                    "storing its user statements as one fallback topic (raw answer: %r)",
                    i, self.retries + 1, last_raw.get(i, "")[:200],
                )
                results[i] = [fallback_topic(sessions[i])]
        self.last_stats = stats
        return results  # type: ignore[return-value]

    def extract(self, turns: Sequence[dict], seed: int | None = 0) -> list[Topic]:
        """Topics of one session (see :meth:`extract_batch`)."""
        return self.extract_batch([turns], seed=seed)[0]


class SentenceExtractor:
    """LLM-free extraction by clustering the user's sentences (``"sentences"``; deterministic).

    (Until issue 13 this was the ``"embedding"`` extractor; it is kept under its own name.)

    Units are the sentences of the user turns (greetings, fillers and questions dropped). The
    first unit of a user turn is embedded together with the assistant turn just before it (so
    that "It does, lots of night shifts." stays with the question it answers). Units are scanned
    in order: a unit joins the topic of this session whose centroid (normalised mean of its unit
    embeddings) is most similar, if that similarity is ``>= threshold``; otherwise it starts a new
    topic. A topic's summary is ``"User said: "`` + its sentences in order (at most
    ``max_sentences``; the most central ones when it has more); its turns are the user turns of
    its sentences plus the assistant replies that follow them. One turn can thus feed several
    topics, and a topic can span turns far apart.

    Parameters
    ----------
    embedder : object with ``encode(texts, kind="passage") -> float32 [n, d]``
    threshold : float
        Cosine similarity to a topic centroid needed to join it (default 0.3, calibrated on
        MiniLM, where sentences on one subject score ~0.3-0.7 and unrelated ones ~0.0-0.2).
    max_sentences : int
        Sentences kept in a summary.
    context_weight : float
        Weight of the preceding assistant turn in the first unit's embedding.
    min_words : int
        A topic with fewer words joins its most similar topic of the session.
    """

    name = "sentences"

    def __init__(self, embedder: Embedder, threshold: float = 0.3, max_sentences: int = 4, context_weight: float = 0.5,
                 min_words: int = 6):
        if not 0.0 <= float(threshold) <= 1.0:
            raise bad_arg("threshold", "a float in [0, 1]", threshold)
        if int(max_sentences) < 1:
            raise bad_arg("max_sentences", "an int >= 1", max_sentences)
        self.embedder = embedder
        self.threshold = float(threshold)
        self.max_sentences = int(max_sentences)
        self.context_weight = float(context_weight)
        self.min_words = int(min_words)
        self.last_stats: dict[str, Any] = {}

    @staticmethod
    def _units(turns: Sequence[dict]) -> list[tuple[int, str, int | None]]:
        """(user turn index, sentence, preceding assistant turn index or None) per unit."""
        units = []
        for i, t in enumerate(turns):
            if str(t.get("role", "user")) != "user":
                continue
            prev = i - 1 if i > 0 and str(turns[i - 1].get("role", "user")) != "user" else None
            for k, sent in enumerate(_salient_sentences([t["content"]], max_sentences=0)):
                units.append((i, sent, prev if k == 0 else None))
        return units

    def extract_batch(self, sessions: Sequence[Sequence[dict]], seed: int | None = None) -> list[list[Topic]]:
        """Topics of each session (``seed`` is accepted for protocol compatibility; unused)."""
        sessions = [validate_turns(s, f"sessions[{i}]") for i, s in enumerate(sessions)]
        units = [self._units(s) for s in sessions]
        texts: list[str] = []
        ctx_texts: list[str] = []
        for s, us in zip(sessions, units):
            texts += [u[1] for u in us]
            ctx_texts += [s[u[2]]["content"] for u in us if u[2] is not None]
        t0 = time.perf_counter()
        allt = texts + ctx_texts
        emb = np.asarray(self.embedder.encode(allt, kind="passage"), dtype=np.float32) if allt else np.zeros((0, 1), np.float32)
        self.last_stats = {"seconds": time.perf_counter() - t0, "calls": 1 if allt else 0, "units": len(texts)}
        emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
        sent_e, ctx_e = emb[: len(texts)], emb[len(texts):]
        out: list[list[Topic]] = []
        pos = cpos = 0
        for s, us in zip(sessions, units):
            e = sent_e[pos : pos + len(us)].copy()
            for j, u in enumerate(us):
                if u[2] is not None:
                    v = e[j] + self.context_weight * ctx_e[cpos]
                    e[j] = v / max(float(np.linalg.norm(v)), 1e-12)
                    cpos += 1
            pos += len(us)
            segs: list[list[int]] = []
            for j in range(len(us)):
                best, best_sim = None, -2.0
                for g, seg in enumerate(segs):
                    c = e[seg].sum(0)
                    sim = float(e[j] @ c) / max(float(np.linalg.norm(c)), 1e-12)
                    if sim > best_sim:
                        best, best_sim = g, sim
                if best is not None and best_sim >= self.threshold:
                    segs[best].append(j)
                else:
                    segs.append([j])
            # A tiny segment (fewer than min_words words, e.g. "I'm Maya.") joins its most similar
            # neighbour segment rather than becoming a memory of its own.
            changed = True
            while changed and len(segs) > 1:
                changed = False
                for g, seg in enumerate(segs):
                    if sum(len(us[j][1].split()) for j in seg) >= self.min_words:
                        continue
                    c = e[seg].sum(0)
                    others = [h for h in range(len(segs)) if h != g]
                    h = max(others, key=lambda h: float(e[segs[h]].sum(0) @ c) / max(float(np.linalg.norm(e[segs[h]].sum(0))), 1e-12))
                    segs[h] = sorted(segs[h] + seg)
                    del segs[g]
                    changed = True
                    break
            topics = []
            for seg in segs:
                keep = seg
                if len(seg) > self.max_sentences:
                    c = e[seg].mean(0)
                    keep = sorted(sorted(seg, key=lambda j: -float(e[j] @ c))[: self.max_sentences])
                user_idx = sorted({us[j][0] for j in seg})
                turn_idx = set(user_idx)
                for i in user_idx:  # the assistant replies that follow
                    k = i + 1
                    while k < len(s) and str(s[k].get("role", "user")) != "user":
                        turn_idx.add(k)
                        k += 1
                summary = "User said: " + " ".join(us[j][1] for j in keep)
                topics.append(Topic(summary=summary, turns=sorted(turn_idx), source="sentences"))
            if s and not topics:
                topics = [fallback_topic(s)]
            elif s:
                _attach_uncovered(topics, s)
            out.append(topics)
        return out

    def extract(self, turns: Sequence[dict], seed: int | None = None) -> list[Topic]:
        """Topics of one session (see :meth:`extract_batch`)."""
        return self.extract_batch([turns])[0]


def _check_int(name: str, value: Any, low: int) -> int:
    return check_int(name, value, low)


def _unit_rows(e: np.ndarray) -> np.ndarray:
    return e / np.maximum(np.linalg.norm(e, axis=-1, keepdims=True), 1e-12)


def gap_similarities(e: np.ndarray, window: int) -> np.ndarray:
    """Cosine similarity across each gap between neighbouring turns (TextTiling's block comparison).

    Parameters
    ----------
    e : float32 [n, d]
        Turn embeddings (any scale).
    window : int
        Turns on each side of a gap (fewer at the session's ends).

    Returns
    -------
    float32 [n - 1]
        ``sim[g - 1] = cos(sum(e[g - window:g]), sum(e[g:g + window]))`` for the gap before turn ``g``.
    """
    n = e.shape[0]
    if n < 2:
        return np.zeros(0, np.float32)
    u = _unit_rows(np.asarray(e, np.float32))
    c = np.concatenate([np.zeros((1, u.shape[1]), np.float32), np.cumsum(u, 0, dtype=np.float64).astype(np.float32)])
    g = np.arange(1, n)
    left = c[g] - c[np.maximum(g - window, 0)]
    right = c[np.minimum(g + window, n)] - c[g]
    return np.sum(_unit_rows(left) * _unit_rows(right), axis=1).astype(np.float32)


def depth_scores(sim: np.ndarray) -> np.ndarray:
    """TextTiling depth of each gap: ``(left peak - sim) + (right peak - sim)``, where a peak is the
    highest similarity reached climbing away from the gap while similarity rises. float32 ``[n - 1]``."""
    sim = np.asarray(sim, np.float32)
    m = len(sim)
    depth = np.zeros(m, np.float32)
    for g in range(m):  # m = turns of one session - 1 (tens): not a hot path
        lp = sim[g]
        j = g - 1
        while j >= 0 and sim[j] >= lp:
            lp = sim[j]
            j -= 1
        rp = sim[g]
        j = g + 1
        while j < m and sim[j] >= rp:
            rp = sim[j]
            j += 1
        depth[g] = (lp - sim[g]) + (rp - sim[g])
    return depth


def tile_boundaries(depth: np.ndarray, n: int, target_turns: float, min_turns: int, max_turns: int) -> list[int]:
    """Segment starts (sorted, first 0) for ``n`` turns from gap depths.

    ``round(n / target_turns) - 1`` cuts are placed at the deepest gaps (ties: earlier gap first)
    such that every segment keeps at least ``min_turns`` turns; then any segment longer than
    ``max_turns`` is cut at its deepest admissible gap until none is (evenly when no gap is
    admissible; among equally deep gaps the one nearest the segment's middle).
    """
    if n <= 0:
        return []
    want = max(0, int(round(n / float(target_turns))) - 1)
    cuts: list[int] = []
    order = np.argsort(-np.asarray(depth, np.float64), kind="stable")  # gap index j = cut before turn j + 1
    for j in order:
        if len(cuts) >= want:
            break
        b = int(j) + 1
        edges = [0] + sorted(cuts) + [n]
        k = int(np.searchsorted(edges, b))
        if b - edges[k - 1] >= min_turns and edges[k] - b >= min_turns:
            cuts.append(b)
    cuts.sort()
    changed = True
    while changed:
        changed = False
        edges = [0] + cuts + [n]
        for a, z in zip(edges[:-1], edges[1:]):
            if z - a <= max_turns:
                continue
            lo, hi = a + min_turns, z - min_turns  # admissible cut positions b in [lo, hi]
            if lo <= hi:
                # deepest admissible gap; among equal depths the one nearest the middle
                cand = np.arange(lo, hi + 1)
                score = np.asarray(depth, np.float64)[cand - 1] - 1e-9 * np.abs(cand - (a + z) / 2.0)
                b = int(cand[int(np.argmax(score))])
            else:
                b = a + (z - a) // 2
            cuts = sorted(cuts + [b])
            changed = True
            break
    return [0] + cuts


class TextTilingExtractor:
    """LLM-free topics as contiguous stretches of the session (``"embedding"``; deterministic).

    TextTiling with sentence embeddings: every turn is rendered with the turn template
    (:mod:`memkern.text.template`, speaker and date included) and embedded; at each gap between
    neighbouring turns the ``window`` turns before and after are compared
    (:func:`gap_similarities`); a gap's depth score measures how far similarity drops there
    relative to the peaks on both sides (:func:`depth_scores`); the deepest gaps become topic
    boundaries, about one per ``target_turns`` turns, with every topic between ``min_turns`` and
    ``max_turns`` turns (:func:`tile_boundaries`). A topic's text (its summary) is its turns
    rendered as one block (:meth:`memkern.text.template.TurnTemplate.render_block`), so a topic holds
    every turn of its stretch, speaker names and the session date included.

    Parameters
    ----------
    embedder : object with ``encode(texts, kind="passage") -> float32 [n, d]``
    target_turns : float
        Mean topic size aimed at (default 4, the size of the fixed windows it replaces).
    min_turns, max_turns : int
        Bounds on a topic's size (defaults 2 and 8).
    window : int
        Turns on each side of a gap in the block comparison (default 2).
    template : memkern.text.template.TurnTemplate or str, optional
        How turns become text (default :data:`memkern.text.template.DEFAULT_TEMPLATE`).
    """

    name = "embedding"

    def __init__(self, embedder: Embedder, target_turns: float = 4.0, min_turns: int = 2, max_turns: int = 8,
                 window: int = 2, template: Any = None):
        from ...text.template import default_template

        self.min_turns = _check_int("min_turns", min_turns, 1)
        self.max_turns = _check_int("max_turns", max_turns, 1)
        if self.max_turns < 2 * self.min_turns - 1:
            raise bad_arg("max_turns", f">= 2 * min_turns - 1 ({2 * self.min_turns - 1})", max_turns)
        if isinstance(target_turns, bool) or not isinstance(target_turns, (int, float, np.number)) \
                or not self.min_turns <= float(target_turns) <= self.max_turns:
            raise bad_arg("target_turns", f"a number in [min_turns, max_turns] = [{self.min_turns}, {self.max_turns}]",
                          target_turns)
        self.target_turns = float(target_turns)
        self.window = _check_int("window", window, 1)
        self.embedder = embedder
        self.template = default_template(template)
        self.last_stats: dict[str, Any] = {}

    def segment(self, e: np.ndarray) -> list[list[int]]:
        """Contiguous segments (lists of turn indices) of one session's turn embeddings ``[n, d]``."""
        n = int(e.shape[0])
        if n == 0:
            return []
        depth = depth_scores(gap_similarities(e, self.window))
        starts = tile_boundaries(depth, n, self.target_turns, self.min_turns, self.max_turns)
        ends = starts[1:] + [n]
        return [list(range(a, z)) for a, z in zip(starts, ends)]

    def extract_batch(self, sessions: Sequence[Sequence[dict]], seed: int | None = None,
                      turn_embeddings: Sequence[Any] | None = None) -> list[list[Topic]]:
        """Topics of each session (one ``encode`` call for all turns; ``seed`` unused).

        ``turn_embeddings``: optional, one float32 ``[len(sessions[i]), d]`` array per session,
        the embeddings of its turns rendered with this extractor's template (what it would
        embed): then nothing is embedded here (:meth:`memkern.RMM.end_session` embeds each turn
        once, for this and for its turn record).
        """
        sessions = [validate_turns(s, f"sessions[{i}]") for i, s in enumerate(sessions)]
        t0 = time.perf_counter()
        if turn_embeddings is not None:
            if isinstance(turn_embeddings, (str, bytes)) or len(turn_embeddings) != len(sessions):
                raise bad_arg("turn_embeddings", f"None or one array per session ({len(sessions)})",
                              type(turn_embeddings).__name__ if not hasattr(turn_embeddings, "__len__")
                              else f"length {len(turn_embeddings)}")
            parts = []
            for i, (s, e) in enumerate(zip(sessions, turn_embeddings)):
                e = np.asarray(e, np.float32)
                if e.ndim != 2 or e.shape[0] != len(s):
                    raise bad_arg(f"turn_embeddings[{i}]", f"float32 [{len(s)}, d] (one row per turn)", tuple(e.shape))
                parts.append(e)
            emb = np.concatenate(parts) if parts else np.zeros((0, 1), np.float32)
            self.last_stats = {"seconds": 0.0, "calls": 0, "units": 0}
        else:
            texts = [self.template.render_turn(t) for s in sessions for t in s]
            emb = np.asarray(self.embedder.encode(texts, kind="passage"), np.float32) if texts else np.zeros((0, 1), np.float32)
            self.last_stats = {"seconds": time.perf_counter() - t0, "calls": 1 if texts else 0, "units": len(texts)}
        out: list[list[Topic]] = []
        pos = 0
        for s in sessions:
            segs = self.segment(emb[pos:pos + len(s)])
            pos += len(s)
            out.append([Topic(summary=self.template.render_block([s[i] for i in seg]), turns=seg, source="embedding")
                        for seg in segs])
        return out

    def extract(self, turns: Sequence[dict], seed: int | None = None) -> list[Topic]:
        """Topics of one session (see :meth:`extract_batch`)."""
        return self.extract_batch([turns])[0]


EmbeddingExtractor = TextTilingExtractor
"""The ``"embedding"`` extractor (an alias of :class:`TextTilingExtractor`)."""


class WindowExtractor:
    """Fixed windows of ``size`` turns, consecutive windows sharing ``overlap`` turns (``"window"``).

    Windows start every ``size - overlap`` turns; the last one ends at the session's end. A
    topic's text is its turns rendered as one block with the turn template. No model call.

    Parameters
    ----------
    size : int
        Turns per window (default 4).
    overlap : int
        Turns shared by neighbouring windows, ``0 <= overlap < size`` (default 0).
    template : memkern.text.template.TurnTemplate or str, optional
    embedder : ignored
        Accepted so that every extractor can be built the same way.
    """

    name = "window"

    def __init__(self, size: int = 4, overlap: int = 0, template: Any = None, embedder: Any = None):
        from ...text.template import default_template

        self.size = _check_int("size", size, 1)
        self.overlap = _check_int("overlap", overlap, 0)
        if self.overlap >= self.size:
            raise bad_arg("overlap", f"an int in [0, size) = [0, {self.size})", overlap)
        self.template = default_template(template)
        self.last_stats: dict[str, Any] = {}

    def windows(self, n: int) -> list[list[int]]:
        """Turn indices of each window over ``n`` turns."""
        step = self.size - self.overlap
        out = []
        for a in range(0, max(n, 1), step):
            if a >= n:
                break
            out.append(list(range(a, min(a + self.size, n))))
            if a + self.size >= n:
                break
        return out

    def extract_batch(self, sessions: Sequence[Sequence[dict]], seed: int | None = None) -> list[list[Topic]]:
        sessions = [validate_turns(s, f"sessions[{i}]") for i, s in enumerate(sessions)]
        self.last_stats = {"seconds": 0.0, "calls": 0, "units": sum(len(s) for s in sessions)}
        return [[Topic(summary=self.template.render_block([s[i] for i in w]), turns=w, source="window")
                 for w in self.windows(len(s))] for s in sessions]

    def extract(self, turns: Sequence[dict], seed: int | None = None) -> list[Topic]:
        return self.extract_batch([turns])[0]


EXTRACTORS = ("llm", "embedding", "window", "sentences")


def complete_coverage(
    topics: list[Topic], turns: Sequence[dict], embed: Any, threshold: float = 0.45
) -> list[Topic]:
    """Add a topic for each user statement that no extracted summary covers (never lose a fact).

    Small models often summarise only the first subject of a session. Each user turn (with
    salient content) whose best cosine similarity to the topic summaries is below ``threshold``
    becomes an extra topic ``"User said: <its salient sentences>"`` with ``source="uncovered"``.

    Parameters
    ----------
    topics : list[Topic]
        Extracted topics (not modified).
    turns : sequence of dict
        The session.
    embed : callable
        ``embed(texts) -> float32 [n, d]`` (any scale; rows are normalised here).
    threshold : float
        Cosine similarity under which a statement counts as uncovered.

    Returns
    -------
    list[Topic]
        ``topics`` followed by the added ones, in turn order.
    """
    user = []
    for i, t in enumerate(turns):
        if str(t.get("role", "user")) != "user":
            continue
        sents = _salient_sentences([t["content"]], max_sentences=0)
        if sents:
            user.append((i, sents))
    if not user or not topics:
        return list(topics)
    texts = [tp.summary for tp in topics] + [" ".join(s) for _, s in user]
    e = np.asarray(embed(texts), dtype=np.float32)
    e = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
    sims = e[len(topics):] @ e[: len(topics)].T  # [n_user, n_topics]
    out = list(topics)
    for (i, sents), row in zip(user, sims):
        if float(row.max()) < threshold:
            out.append(Topic(summary="User said: " + " ".join(sents[:3]), turns=[i], source="uncovered"))
    return out


def make_extractor(kind: str, chat_model: ChatModel | None = None, embedder: Embedder | None = None,
                   **kwargs: Any) -> LLMExtractor | TextTilingExtractor | WindowExtractor | SentenceExtractor:
    """Build the extractor named ``kind`` (one of :data:`EXTRACTORS`).

    ``"llm"``: :class:`LLMExtractor` (needs ``chat_model``); ``"embedding"``:
    :class:`TextTilingExtractor`; ``"window"``: :class:`WindowExtractor` (fixed windows with
    overlap); ``"sentences"``: :class:`SentenceExtractor` (user sentences clustered by topic).
    ``kwargs`` go to the class.
    """
    if kind == "llm":
        return LLMExtractor(chat_model, **kwargs)
    if kind == "embedding":
        return TextTilingExtractor(embedder, **kwargs)
    if kind == "window":
        return WindowExtractor(**kwargs)
    if kind == "sentences":
        return SentenceExtractor(embedder, **kwargs)
    raise bad_arg("extractor", f"one of {EXTRACTORS}", kind)
