"""Start-up model loading of a :class:`~memkern.server.service.MemoryService`, and the readiness
``GET /health/ready`` reports.

:class:`Readiness` runs one load function in a background thread, once: the server answers
``/health/live`` while the models load, and ``/health/ready`` says ``loading`` (HTTP 503) until the
load has finished (``ready``, 200) or failed (``failed``, 503 with the error). A request that needs a
model meanwhile waits for the load instead of starting a second one
(:attr:`MemoryService.embedder` builds under a lock the load holds).
"""
from __future__ import annotations

import gc
import logging
import threading
import time
from typing import Callable

log = logging.getLogger("memkern")

__all__ = ["Readiness"]


class Readiness:
    """The state of a one-time background load: ``"idle"`` (not started), ``"loading"``,
    ``"ready"`` or ``"failed"`` (:attr:`reason` holds the error)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = threading.Event()
        self.state = "idle"
        self.reason: str | None = None
        self.started_at: float | None = None
        self.seconds: float | None = None  # how long the load took, once finished

    def start(self, load: Callable[[], None], name: str = "memkern-load", *, freeze_gc: bool = False) -> bool:
        """Run ``load()`` in a daemon thread, unless a load was already started (then ``False``).
        ``freeze_gc``: once it succeeded, collect and ``gc.freeze()`` every object the process
        holds (for a process that serves from then on, as ``memkern serve``)."""
        with self._lock:
            if self.state != "idle":
                return False
            self.state = "loading"
            self.started_at = time.perf_counter()
        threading.Thread(target=self._run, args=(load, bool(freeze_gc)), name=name, daemon=True).start()
        return True

    def _run(self, load: Callable[[], None], freeze_gc: bool) -> None:
        try:
            load()
        except BaseException as exc:  # reported by /health/ready; requests retry the build themselves
            log.error("serve: loading the models failed: %s: %s", type(exc).__name__, exc)
            self.reason = f"{type(exc).__name__}: {exc}"
            self.state = "failed"
        else:
            if freeze_gc:
                # What the load built (models, tokenizers: millions of objects) lives as long as
                # the process: kept out of the collector's full passes, which otherwise traverse
                # it all (pauses of ~0.2 s, the p99 of a served search).
                gc.collect()
                gc.freeze()
            self.state = "ready"
        finally:
            self.seconds = time.perf_counter() - (self.started_at or 0.0)
            if self.state == "ready":
                log.info("serve: models loaded in %.1f s; ready", self.seconds)
            self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a started load has finished (ready or failed); ``False`` on timeout or when
        none was started."""
        if self.state == "idle":
            return False
        return self._done.wait(timeout)

    def detail(self) -> str:
        """Why it is not ready, in the errors' form (``<what>: expected ..., got ...``)."""
        if self.state == "failed":
            return f"models: expected loaded, got a failed load ({self.reason})"
        if self.state == "loading":
            ago = time.perf_counter() - (self.started_at or time.perf_counter())
            return f"models: expected loaded, got still loading ({ago:.1f} s so far)"
        return "models: expected loaded, got not started"
