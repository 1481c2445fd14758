"""The embedder and chat model of a :class:`~memkern.server.service.MemoryService`, shared by all its threads.

- :class:`BatchingEmbedder`: concurrent requests' texts are embedded together, first come first
  served, by one thread at a time (Hugging Face fast tokenizers and the embedder's query cache are
  not thread-safe).
- :class:`LockedChatModel`: the chat model runs one call at a time under a lock.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Any

import numpy as np

from ..errors import bad_arg

__all__ = ["BatchingEmbedder", "LockedChatModel"]


class _Request:
    __slots__ = ("texts", "kind", "result", "error", "done")

    def __init__(self, texts: list[str], kind: str):
        self.texts, self.kind = texts, kind
        self.result: np.ndarray | None = None
        self.error: BaseException | None = None
        self.done = False


class BatchingEmbedder:
    """An embedder shared by many threads: concurrent callers' texts are embedded together, in
    arrival order, one batch at a time.

    Each caller queues its request; when no batch is running, the caller at hand becomes the
    leader: it takes the queued requests of the first one's ``kind`` (up to ``max_batch`` texts,
    first come first served), runs one ``encode`` for all of them (outside the queue's lock),
    hands every caller its rows and wakes them. The model is thus called by one thread at a time
    (Hugging Face fast tokenizers and the embedder's query cache are not thread-safe), requests are
    served in order (no caller starves), and under load one batched forward replaces many single
    ones. A batch that fails is retried request by request, so one bad request fails alone.
    """

    def __init__(self, inner: Any, max_batch: int = 64):
        self._inner = inner
        self.max_batch = int(max_batch)
        self._queue: deque[_Request] = deque()
        self._cv = threading.Condition()
        self._busy = False
        self.batches = 0  # encode calls made (for tests and stats)

    @property
    def dim(self) -> int:
        return self._inner.dim

    def encode(self, texts, kind="passage", **kw):
        req = _Request(list(texts), kind)
        with self._cv:
            self._queue.append(req)
            while not req.done:
                if self._busy:
                    self._cv.wait()
                    continue
                self._busy = True
                batch = [self._queue.popleft()]
                n = len(batch[0].texts)
                while self._queue and self._queue[0].kind == batch[0].kind and n + len(self._queue[0].texts) <= self.max_batch:
                    n += len(self._queue[0].texts)
                    batch.append(self._queue.popleft())
                self._cv.release()
                try:
                    self._run(batch)
                finally:
                    self._cv.acquire()
                    self._busy = False
                    for r in batch:
                        r.done = True
                    self._cv.notify_all()
        if req.error is not None:
            raise req.error
        return req.result

    def _run(self, batch: list[_Request]) -> None:
        self.batches += 1
        try:
            out = np.asarray(self._inner.encode([t for r in batch for t in r.texts], kind=batch[0].kind))
            if out.ndim != 2 or out.shape[0] != sum(len(r.texts) for r in batch):
                raise bad_arg("embedder.encode(...)", f"[{sum(len(r.texts) for r in batch)}, d] rows", out.shape)
            start = 0
            for r in batch:
                r.result = out[start:start + len(r.texts)]
                start += len(r.texts)
        except BaseException as exc:  # handed to the caller, raised in its own thread
            if len(batch) == 1:
                batch[0].error = exc
                return
            for r in batch:  # one failing request must not fail the others
                self._run([r])


class LockedChatModel:
    """A chat model whose calls run one at a time (``lock``)."""

    def __init__(self, inner: Any, lock: threading.Lock):
        self._inner = inner
        self._lock = lock

    def generate(self, prompts, max_new_tokens=None, json=False, temperature=0.0, seed=None):
        with self._lock:
            return self._inner.generate(prompts, max_new_tokens=max_new_tokens, json=json,
                                        temperature=temperature, seed=seed)

    def count_tokens(self, text):
        with self._lock:
            return self._inner.count_tokens(text)
