"""Extractors by name: :data:`EXTRACTORS` and :func:`make_extractor`."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import bad_arg
from .llm import LLMExtractor
from .sentences import SentenceExtractor
from .tiling import TextTilingExtractor
from .window import WindowExtractor

if TYPE_CHECKING:  # pragma: no cover
    from ...protocols import ChatModel, Embedder

__all__ = ["EXTRACTORS", "make_extractor"]

EXTRACTORS = ("llm", "embedding", "window", "sentences")


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
