"""Topic extraction (prospective reflection, step 1): one dialogue session -> topic memories.

Four extractors share one protocol, ``extract_batch(sessions) -> list[list[Topic]]``:

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
  running topic centroids; the summary is the topic's salient user statements.

Sessions from every extractor come back as :class:`Topic` objects whose ``turns`` index into the
session's turn list.

Modules: ``session`` (turn checks, salient statements, fallback topic), ``llm``, ``sentences``,
``tiling`` (the extractors), ``tiling_math`` (gap similarities, depth scores, boundaries), ``window``,
``factory`` (:func:`make_extractor`, :data:`EXTRACTORS`).
"""

from ...protocols import Topic
from .factory import EXTRACTORS, make_extractor
from .llm import LLMExtractor, complete_coverage, parse_topics
from .sentences import SentenceExtractor
from .session import fallback_topic, validate_turns
from .tiling import EmbeddingExtractor, TextTilingExtractor
from .tiling_math import depth_scores, gap_similarities, tile_boundaries
from .window import WindowExtractor

__all__ = [
    "Topic", "LLMExtractor", "EmbeddingExtractor", "TextTilingExtractor", "WindowExtractor", "SentenceExtractor",
    "fallback_topic", "validate_turns", "parse_topics", "complete_coverage", "make_extractor", "EXTRACTORS",
    "gap_similarities", "depth_scores", "tile_boundaries",
]
