"""The ``memkern`` command: ``main.py`` parses, one module per command, ``common.py`` holds the shared
options.
"""

from __future__ import annotations

from .main import (
    main,
)

__all__ = [
    "main",
]
