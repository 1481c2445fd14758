"""The ``"embedding"`` extractor (LLM-free, deterministic): TextTiling over the embeddings of the
turns rendered with the turn template (:mod:`memkern.ingest.extract.tiling_math`).
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ...base.validate import check_int
from ...errors import bad_arg
from ...protocols import Topic
from .session import validate_turns
from .tiling_math import depth_scores, gap_similarities, tile_boundaries

if TYPE_CHECKING:  # pragma: no cover
    from ...protocols import Embedder

__all__ = ["TextTilingExtractor", "EmbeddingExtractor"]


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

        self.min_turns = check_int("min_turns", min_turns, 1)
        self.max_turns = check_int("max_turns", max_turns, 1)
        if self.max_turns < 2 * self.min_turns - 1:
            raise bad_arg("max_turns", f">= 2 * min_turns - 1 ({2 * self.min_turns - 1})", max_turns)
        if isinstance(target_turns, bool) or not isinstance(target_turns, (int, float, np.number)) \
                or not self.min_turns <= float(target_turns) <= self.max_turns:
            raise bad_arg("target_turns", f"a number in [min_turns, max_turns] = [{self.min_turns}, {self.max_turns}]",
                          target_turns)
        self.target_turns = float(target_turns)
        self.window = check_int("window", window, 1)
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
