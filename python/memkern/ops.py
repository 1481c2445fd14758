"""The reranker's functional ops (``memkern.ops``): see :mod:`memkern.score.ops`."""

from __future__ import annotations

from .score.ops import *  # noqa: F401,F403
from .score.ops import __all__  # noqa: F401
