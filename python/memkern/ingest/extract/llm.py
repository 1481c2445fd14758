"""The ``"llm"`` extractor (the RMM paper's way): prompt a chat model for JSON topics, repair and
validate the answer (:func:`parse_topics`), retry once, then fall back; :func:`complete_coverage` adds
the user statements no summary covers.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ...errors import MemkernValueError
from ...protocols import Topic
from ...text.jsonrepair import JSONRepairError, coerce_int, parse_json
from .. import prompts
from .session import attach_uncovered, fallback_topic, salient_sentences, validate_turns

if TYPE_CHECKING:  # pragma: no cover
    from ...protocols import ChatModel

log = logging.getLogger("memkern")

__all__ = ["LLMExtractor", "parse_topics", "complete_coverage"]


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
                attach_uncovered(topics, sessions[i])
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
        sents = salient_sentences([t["content"]], max_sentences=0)
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
