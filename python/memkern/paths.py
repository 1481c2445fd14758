"""Where memkern writes outside a store: the cache root (converted models, eval embeddings)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """``$MEMKERN_CACHE/<parts>``, else ``$XDG_CACHE_HOME/memkern/<parts>``, else
    ``~/.cache/memkern/<parts>`` (not created here)."""
    root = os.environ.get("MEMKERN_CACHE")
    if root:
        return Path(root).expanduser().joinpath(*parts)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base.joinpath("memkern", *parts)
