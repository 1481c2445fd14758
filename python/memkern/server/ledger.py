"""The server's record of accepted feedback: each response's feedback is taken once, also across restarts."""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Any

from ..base.atomic import append_durably, atomic_write

__all__ = ["FeedbackLedger"]


class FeedbackLedger:
    """The response ids whose feedback was accepted: once per response.

    Kept in memory and, for a store on disk, appended to ``<store>/server/feedback-given`` (one
    id per line, fsynced before the feedback is applied; mode 0600), so a restarted server refuses
    them too. At start the file is read and rewritten with its last ``keep`` ids
    (:func:`memkern.base.atomic.atomic_write`).
    """

    FILE = "feedback-given"

    def __init__(self, store_path: Any, keep: int):
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self.keep = max(int(keep), 1)
        self.path = None if not store_path else os.path.join(os.fspath(store_path), "server", self.FILE)
        if self.path is not None and os.path.exists(self.path):
            with open(self.path, encoding="ascii", errors="replace") as f:
                for line in f:
                    rid = line.strip()
                    if len(rid) == 32 and all(c in "0123456789abcdef" for c in rid):  # a torn last line is skipped
                        self._ids[rid] = None
            while len(self._ids) > self.keep:
                self._ids.popitem(last=False)
            self._rewrite()

    def _rewrite(self) -> None:
        atomic_write(self.path, "".join(f"{rid}\n" for rid in self._ids))

    def __contains__(self, rid: str) -> bool:
        with self._lock:
            return rid in self._ids

    def add(self, rid: str) -> None:
        """Record ``rid`` (durably, for a store on disk) before its feedback is applied."""
        with self._lock:
            if self.path is not None:
                append_durably(self.path, f"{rid}\n".encode("ascii"))
            self._ids[rid] = None
            while len(self._ids) > self.keep:
                self._ids.popitem(last=False)
