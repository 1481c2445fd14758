"""The ``"window"`` extractor: fixed windows of turns with overlap, rendered with the turn template.
"""
from __future__ import annotations

from typing import Any, Sequence

from ...base.validate import check_int
from ...errors import bad_arg
from ...protocols import Topic
from .session import validate_turns

__all__ = ["WindowExtractor"]


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

        self.size = check_int("size", size, 1)
        self.overlap = check_int("overlap", overlap, 0)
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
