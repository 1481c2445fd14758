"""Topic extraction (prospective reflection, step 1): one dialogue session -> topic memories.

Two extractors share one protocol, ``extract_batch(sessions) -> list[list[Topic]]``:

- :class:`LLMExtractor` ("llm", the RMM paper's way): a prompt asks the chat model for
  ``{"topics": [{"summary", "turns"}]}``; the answer is repaired (:mod:`memkern.jsonrepair`) and
  validated (summaries must be non-empty strings, turn indices are coerced to ints and kept only
  when in range); an unparseable answer gets one retry, then a logged fallback. A session is never
  lost: the fallback stores the session's user statements as one topic, and user turns that no
  topic references are attached to the nearest topic by turn index.
- :class:`EmbeddingExtractor` ("embedding", LLM-free): each user turn (with the assistant reply
  that follows it) is embedded; a new topic starts where a turn's similarity to the running topic
  centroid falls below ``threshold``; the summary is the topic's salient user statements (the
  informative sentences, most central first). Deterministic for a deterministic embedder.

Sessions from every extractor come back as :class:`Topic` objects whose ``turns`` index into the
session's turn list.
"""
from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .errors import MemkernTypeError, MemkernValueError, bad_arg
from .jsonrepair import JSONRepairError, parse_json
from .prompts import rmm as prompts

log = logging.getLogger("memkern")

__all__ = ["Topic", "LLMExtractor", "EmbeddingExtractor", "fallback_topic", "validate_turns", "make_extractor"]


@dataclass
class Topic:
    """One topic memory extracted from a session.

    Attributes
    ----------
    summary : str
        Short statement about the user.
    turns : list[int]
        Indices into the session's turns (sorted, unique, in range).
    source : str
        ``"llm"``, ``"embedding"`` or ``"fallback"`` (extraction failed; the session's user
        statements were kept verbatim).
    """

    summary: str
    turns: list[int] = field(default_factory=list)
    source: str = "llm"


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


def _coerce_index(x: Any) -> int | None:
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, float) and x.is_integer():
        return int(x)
    if isinstance(x, str):
        m = re.search(r"-?\d+", x)
        return int(m.group(0)) if m else None
    return None


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
        idx = sorted({i for i in (_coerce_index(x) for x in raw) if i is not None and 0 <= i < n_turns})
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
    """

    name = "llm"

    def __init__(self, chat_model: Any, max_new_tokens: int = 160, retries: int = 1):
        self.chat_model = chat_model
        self.max_new_tokens = int(max_new_tokens)
        self.retries = int(retries)
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


class EmbeddingExtractor:
    """LLM-free extraction by semantic segmentation of the session (deterministic).

    Each exchange (a user turn plus the non-user turns that follow it) is embedded from its user
    text. Exchanges are scanned in order; exchange ``j`` joins the current topic when
    ``cos(e_j, centroid) >= threshold`` (centroid = normalised mean of the topic's embeddings),
    else it starts a new topic. The summary is ``"User said: "`` + the topic's salient user
    sentences (greetings, fillers and questions dropped), at most ``max_sentences``, most central
    sentence first when the topic has more.

    Parameters
    ----------
    embedder : object with ``encode(texts, kind="passage") -> float32 [n, d]``
    threshold : float
        Cosine similarity to the running centroid below which a new topic starts (default 0.3,
        calibrated on MiniLM, where sentences on one subject score ~0.35-0.7 and unrelated ones
        ~0.0-0.2).
    max_sentences : int
        Sentences kept in a summary.
    """

    name = "embedding"

    def __init__(self, embedder: Any, threshold: float = 0.3, max_sentences: int = 3):
        if not 0.0 <= float(threshold) <= 1.0:
            raise bad_arg("threshold", "a float in [0, 1]", threshold)
        self.embedder = embedder
        self.threshold = float(threshold)
        self.max_sentences = int(max_sentences)
        self.last_stats: dict[str, Any] = {}

    @staticmethod
    def _exchanges(turns: Sequence[dict]) -> list[list[int]]:
        groups: list[list[int]] = []
        for i, t in enumerate(turns):
            if str(t.get("role", "user")) == "user" or not groups:
                groups.append([i])
            else:
                groups[-1].append(i)
        return groups

    def extract_batch(self, sessions: Sequence[Sequence[dict]], seed: int | None = None) -> list[list[Topic]]:
        sessions = [validate_turns(s, f"sessions[{i}]") for i, s in enumerate(sessions)]
        groups = [self._exchanges(s) for s in sessions]
        texts: list[str] = []
        for s, gs in zip(sessions, groups):
            for g in gs:
                user = [s[i]["content"] for i in g if str(s[i].get("role", "user")) == "user"]
                texts.append(" ".join(user) if user else s[g[0]]["content"])
        t0 = time.perf_counter()
        emb = np.asarray(self.embedder.encode(texts, kind="passage"), dtype=np.float32) if texts else np.zeros((0, 1), np.float32)
        self.last_stats = {"seconds": time.perf_counter() - t0, "calls": 1 if texts else 0}
        emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
        out: list[list[Topic]] = []
        pos = 0
        for s, gs in zip(sessions, groups):
            e = emb[pos : pos + len(gs)]
            pos += len(gs)
            segs: list[list[int]] = []  # indices into gs
            for j in range(len(gs)):
                if segs:
                    c = e[segs[-1]].sum(0)
                    c = c / max(float(np.linalg.norm(c)), 1e-12)
                    if float(e[j] @ c) >= self.threshold:
                        segs[-1].append(j)
                        continue
                segs.append([j])
            topics = []
            for seg in segs:
                turn_idx = sorted(i for j in seg for i in gs[j])
                order = seg
                if len(seg) > 1:  # most central exchange first
                    c = e[seg].mean(0)
                    order = sorted(seg, key=lambda j: -float(e[j] @ c))
                user_texts = [s[i]["content"] for j in order for i in gs[j] if str(s[i].get("role", "user")) == "user"]
                sents = _salient_sentences(user_texts, self.max_sentences)
                if not sents:
                    if not any(str(s[i].get("role", "user")) == "user" for i in turn_idx):
                        continue  # assistant-only segment: attached below
                    sents = [" ".join(user_texts[0].split())[:300]] if user_texts else []
                topics.append(Topic(summary="User said: " + " ".join(sents), turns=turn_idx, source="embedding"))
            if s and not topics:
                topics = [fallback_topic(s)]
            elif s:
                _attach_uncovered(topics, s)
            out.append(topics)
        return out

    def extract(self, turns: Sequence[dict], seed: int | None = None) -> list[Topic]:
        return self.extract_batch([turns])[0]


def make_extractor(kind: str, chat_model: Any = None, embedder: Any = None, **kwargs: Any):
    """Build the extractor named ``kind`` (``"llm"`` or ``"embedding"``)."""
    if kind == "llm":
        return LLMExtractor(chat_model, **kwargs)
    if kind == "embedding":
        return EmbeddingExtractor(embedder, **kwargs)
    raise bad_arg("extractor", "'llm' or 'embedding'", kind)
