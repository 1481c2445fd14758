"""What every attack class shares: the tally of outcomes, a case runner with a hang deadline, a
deterministic hash embedder (no model files), and the fake model setup of the CLI commands."""
from __future__ import annotations

import contextlib
import hashlib
import io
import re
import signal
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

#: Keys of a campaign's result; the runner fails a class when any count but ``cases`` is nonzero.
COUNTS = ("cases", "non_memkern_exceptions", "http_500", "hangs", "cross_scope", "lost")
FAIL_COUNTS = COUNTS[1:]
#: Examples kept per class (the first ones).
MAX_EXAMPLES = 12


class Hang(BaseException):
    """Raised into a case that ran past its deadline (a BaseException: ``except Exception`` in the
    code under attack does not swallow it)."""


@dataclass
class Tally:
    """Outcome counts of one campaign, and the first examples of each failure."""

    cases: int = 0
    non_memkern_exceptions: int = 0
    http_500: int = 0
    hangs: int = 0
    cross_scope: int = 0
    lost: int = 0
    refused: int = 0
    accepted: int = 0
    examples: list = field(default_factory=list)

    def fail(self, kind: str, what: str) -> None:
        """Count a failure of ``kind`` (one of :data:`FAIL_COUNTS`), keep ``what`` as an example."""
        setattr(self, kind, getattr(self, kind) + 1)
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(f"{kind}: {' '.join(what.split())[:400]}")

    def result(self) -> dict:
        out = {k: int(getattr(self, k)) for k in COUNTS}
        out.update(refused=self.refused, accepted=self.accepted, examples=list(self.examples))
        return out


@contextlib.contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`Hang` in the main thread once ``seconds`` have passed (SIGALRM; a no-op off
    the main thread, where the caller's wall-clock check still counts the hang)."""
    if threading.current_thread() is not threading.main_thread() or seconds <= 0:
        yield
        return

    def on_alarm(signum, frame):
        raise Hang(f"no answer within {seconds:g} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_case(tally: Tally, label: str, fn: Callable[[], Any], timeout: float = 30.0) -> tuple[str, Any]:
    """Run one hostile case: ``("accepted", value)`` when ``fn`` returns, ``("refused", exc)`` when
    it raises a :class:`memkern.MemkernError`; anything else (another exception, a hang) is counted
    in ``tally`` and returns ``("failed", exc)``."""
    from memkern import MemkernError

    tally.cases += 1
    t0 = time.monotonic()
    try:
        with deadline(timeout):
            value = fn()
    except Hang as e:
        tally.fail("hangs", f"{label}: {e}")
        return "failed", e
    except MemkernError as e:
        if time.monotonic() - t0 > timeout:
            tally.fail("hangs", f"{label}: refused after {time.monotonic() - t0:.1f} s")
            return "failed", e
        tally.refused += 1
        return "refused", e
    except Exception as e:  # noqa: BLE001 - what the campaign counts
        tb = traceback.extract_tb(e.__traceback__)
        where = f"{tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno}" if tb else "?"
        tally.fail("non_memkern_exceptions", f"{label}: {type(e).__name__} at {where}: {e}")
        return "failed", e
    if time.monotonic() - t0 > timeout:
        tally.fail("hangs", f"{label}: answered after {time.monotonic() - t0:.1f} s")
        return "failed", None
    tally.accepted += 1
    return "accepted", value


class HashEmbedder:
    """A deterministic bag-of-words embedder (no model files): each word hashes to a unit vector,
    a text is the normalised sum. ``encode(texts, kind)`` -> float32 ``[n, dim]``."""

    def __init__(self, dim: int = 32):
        self.dim = dim
        self._cache: dict[str, np.ndarray] = {}

    def _word(self, w: str) -> np.ndarray:
        v = self._cache.get(w)
        if v is None:
            seed = int.from_bytes(hashlib.sha256(w.encode("utf-8", "surrogatepass")).digest()[:8], "little")
            v = np.random.default_rng(seed).standard_normal(self.dim)
            v = (v / np.linalg.norm(v)).astype(np.float32)
            self._cache[w] = v
        return v

    def encode(self, texts, kind: str = "passage", **kw: Any) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            for w in re.findall(r"\w+", str(t).lower())[:256]:
                out[i] += self._word(w)
            n = float(np.linalg.norm(out[i]))
            out[i] = out[i] / n if n > 0 else self._word("<empty>")
        return out


@contextlib.contextmanager
def fake_cli_models(dim: int = 32) -> Iterator[HashEmbedder]:
    """The CLI commands build their models through ``commands._common.build_models``: replace it
    with a :class:`HashEmbedder` (no chat model: use ``--extractor embedding``)."""
    from memkern.cli import common as C

    emb = HashEmbedder(dim)
    old = C.build_models
    C.build_models = lambda args, need_chat=True: (None, emb)
    try:
        yield emb
    finally:
        C.build_models = old


def cli(argv: list[str]) -> tuple[int, str]:
    """``memkern <argv>`` in this process: (exit code, stderr)."""
    from memkern import cli as _cli

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = _cli.main(list(argv))
    return code, err.getvalue()


def check_cli_error(tally: Tally, label: str, code: int, err: str) -> bool:
    """A refused command: exit 2 and one line ``memkern: error: ...`` naming no Python exception
    type. Counts a failure otherwise; returns whether it was a clean refusal."""
    lines = err.strip().splitlines()
    if code == 2 and len(lines) == 1 and lines[0].startswith("memkern: error: ") and "Traceback" not in err:
        return True
    tally.fail("non_memkern_exceptions", f"{label}: exit {code}, stderr {err.strip()[:300]!r}")
    return False


def tree_state(path) -> dict:
    """Every file under ``path`` (but ``LOCK``) -> its SHA-256: what a refused operation must leave."""
    from pathlib import Path

    root = Path(path)
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != "LOCK"}
