"""Shared pieces of the server attack classes (``http``, ``mcp``, ``scopes``): a real
``memkern serve`` / ``memkern mcp`` process on loopback, hostile request values, and the ledger
of acknowledged writes checked against the store when the campaign ends. The tally is
:class:`attack.common.Tally`.
"""
from __future__ import annotations

import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .common import Tally

#: Seconds a request may take before it counts as a hang.
HANG_S = 30.0
#: Request size limit the servers run with (small, so oversized requests are cheap to send).
MAX_BODY = 256 * 1024
#: Environment of the server processes (one thread, offline).
ENV = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
           TOKENIZERS_PARALLELISM="false")
ENV.pop("MEMKERN_API_KEY", None)


# ------------------------------------------------------------------ results
#: Failure examples a server class returns.
MAX_EXAMPLES = 5


def result(tally: Tally) -> dict:
    """The campaign's counts (:meth:`attack.common.Tally.result`), at most 5 examples."""
    out = tally.result()
    out["examples"] = out["examples"][:MAX_EXAMPLES]
    return out


def tracebacks(log_path: Path) -> list[str]:
    """Tracebacks a server process logged (one line each: its last line)."""
    if not log_path.exists():
        return []
    lines = log_path.read_text(errors="replace").splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last)"):
            j = i + 1
            while j < len(lines) and (lines[j].startswith(" ") or not lines[j].strip()):
                j += 1
            out.append(lines[j] if j < len(lines) else line)
    return out


# ------------------------------------------------------------------ hostile values
_SCRIPTS = [(0x41, 0x5A), (0x61, 0x7A), (0xC0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x5FF),
            (0x600, 0x6FF), (0x900, 0x97F), (0x3040, 0x30FF), (0x4E00, 0x4FFF), (0xAC00, 0xACFF),
            (0x1F300, 0x1F6FF), (0x300, 0x36F), (0x200B, 0x200F), (0x0, 0x1F), (0xFFF0, 0xFFFF),
            (0x10FF00, 0x10FFFF)]
WORDS = ("tea coffee Berlin Lisbon cello violin marathon dog cat sister job nurse chef chess jazz beach "
         "mountain train flight book movie garden python compiler memory").split()


def text(rng: random.Random, long: bool = False) -> str:
    """A random text: words, any script, control characters, a lone surrogate, blanks, JSON- or
    date-looking strings, or a long one."""
    r = rng.random()
    if r < 0.35:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12)))
    if r < 0.55:
        out = []
        for _ in range(rng.randint(1, 40)):
            lo, hi = rng.choice(_SCRIPTS)
            out.append(chr(rng.randint(lo, hi)))
        return "".join(out)
    if r < 0.62:
        s = " ".join(rng.choice(WORDS) for _ in range(3))
        i = rng.randint(0, len(s))
        return s[:i] + chr(rng.randint(0xD800, 0xDFFF)) + s[i:]
    if r < 0.67:
        return rng.choice(["", " ", "\n\t ", "\u3000", "\x00"])
    if r < 0.74:
        return rng.choice(['[{"role": "user", "content": "hi"}]', '{"a": 1}', "null", "true", "1e400", "[]",
                           "2023-05-08", "1:56 pm on 8 May, 2023", "99999-01-01", "0000-00-00", "NaN"])
    if r < 0.80 or long:
        n = rng.choice([1000, 5000, 33_000, 70_000, 300_000] if long else [1000, 5000, 33_000])
        return rng.choice(WORDS) * (n // 4)
    return rng.choice(WORDS) + " " + str(rng.randint(-10 ** 6, 10 ** 6))


def number(rng: random.Random) -> Any:
    return rng.choice([0, 1, -1, 5, 1000, 2 ** 31, 2 ** 53 + 1, 2 ** 63 - 1, 2 ** 63, 2 ** 64, -(2 ** 63) - 1,
                       10 ** 30, 0.5, -0.0, 1e-300, 1e308, 3.14, rng.uniform(-1e6, 1e6), rng.randint(-50, 50)])


def date(rng: random.Random) -> Any:
    return rng.choice([None, 0, 1.5, 1_683_504_000, 5e11, -5e11, 1e12, -1e12, 1e13, 253402300799, 253402300800,
                       -62135596800, -62135596801, True, False, "2023-05-08", "2023-05-08T10:00:00+02:00",
                       "1:56 pm on 8 May, 2023", "2023/05/20 (Sat) 02:21", "8 May 2023", "garbage date",
                       "99999-01-01", "9999-12-31", "0001-01-01", "", [1], {"t": 1}, text(rng)])


def scope_id(rng: random.Random, pool: list[str]) -> Any:
    r = rng.random()
    if r < 0.75:
        return rng.choice(pool)
    return rng.choice(["a:b", "", ".hidden", "a..b", "x" * 39, "x" * 600, "ü", "a b", "a/../b", "%2e%2e",
                       "\ud800", 5, True, None, ["a"], {"a": 1}, "u:alice", "r:x", "ALICE", "alice\n"])


def json_value(rng: random.Random, depth: int = 0) -> Any:
    """A random JSON value: nested objects and lists (sometimes 40+ deep), big ints, odd floats,
    hostile strings and keys."""
    r = rng.random()
    if depth > 3 or r < 0.45:
        return rng.choice([lambda: text(rng), lambda: number(rng), lambda: rng.choice([True, False, None])])()
    if r < 0.5:
        v: Any = rng.choice(WORDS)
        for _ in range(rng.choice([34, 40, 200])):
            v = {"k": v} if rng.random() < 0.5 else [v]
        return v
    if r < 0.75:
        return {text(rng) if rng.random() < 0.2 else rng.choice(WORDS) + str(i): json_value(rng, depth + 1)
                for i in range(rng.choice([1, 2, 5, 20, 2000]) if depth == 0 else rng.randint(0, 4))}
    return [json_value(rng, depth + 1) for _ in range(rng.randint(0, 6))]


def dumps(value: Any) -> bytes:
    """JSON as a hostile client writes it: ASCII with ``\\uXXXX`` escapes (a lone surrogate
    survives), NaN / Infinity literals."""
    return json.dumps(value, ensure_ascii=True, allow_nan=True, separators=(",", ":")).encode("ascii")


def mutate(rng: random.Random, body: dict, fields: dict) -> dict:
    """``body`` with a few fields dropped, replaced by values of the wrong type, or added."""
    body = dict(body)
    for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
        op = rng.random()
        if op < 0.4 and fields:
            k = rng.choice(list(fields))
            body[k] = fields[k]()
        elif op < 0.6 and body:
            body.pop(rng.choice(list(body)))
        elif op < 0.8:
            k = rng.choice(list(body) or ["x"])
            body[k] = json_value(rng)
        else:
            body[rng.choice(["userid", "extra", "colour", text(rng)[:20] or "k"])] = json_value(rng)
    return body


class Values:
    """The request values of a campaign run: clean (valid) while ``clean`` is set, else hostile.
    Needs ``self.rng`` (a ``random.Random``) and ``self.K`` (this module)."""

    clean = False

    def text(self) -> str:
        if self.clean:
            return " ".join(self.rng.choice(self.K.WORDS) for _ in range(self.rng.randint(2, 10)))
        return self.K.text(self.rng)

    def json_value(self):
        return {"source": self.text()} if self.clean else self.K.json_value(self.rng)

    def date(self):
        return self.rng.choice([None, 1_683_504_000, "2023-05-08", "8 May 2023"]) if self.clean else self.K.date(self.rng)

    def mutate(self, body: dict, fields: dict) -> dict:
        return dict(body) if self.clean else self.K.mutate(self.rng, body, fields)


# ------------------------------------------------------------------ processes
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_chat(workdir: Path) -> Path:
    """A tiny random-weight chat model folder (memkern.models.chat_hf.tiny_chat_model, seed 0),
    built once into the model cache (``memkern.base.paths.cache_dir("models", ...)``): respond runs the
    real tokenizer and generate path in milliseconds. ``workdir`` holds the build until it is
    moved into place."""
    from memkern.base.paths import cache_dir

    folder = cache_dir("models", "tiny-chat-seed0")
    if not (folder / "config.json").exists():
        tmp = workdir / "tiny-chat-build"
        code = ("import sys\nfrom memkern.models.chat_hf import tiny_chat_model\n"
                "m = tiny_chat_model(seed=0, max_new_tokens=16)\n"
                "m.model.save_pretrained(sys.argv[1]); m.tokenizer.save_pretrained(sys.argv[1])\n")
        subprocess.run([sys.executable, "-c", code, str(tmp)], env=ENV, check=True, timeout=600, capture_output=True)
        folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(tmp, folder)  # atomic; another campaign may have won
        except OSError:
            if not (folder / "config.json").exists():
                raise
    return folder


class Serve:
    """``memkern serve`` on 127.0.0.1 (a free port), its log in ``workdir``; :meth:`kill` and
    :meth:`start` restart it over the same store."""

    def __init__(self, workdir: Path, store: Path, extra: list[str], env: dict):
        self.workdir, self.store, self.extra, self.env = workdir, store, extra, env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.logs: list[Path] = []
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        import httpx

        log = self.workdir / f"serve-{len(self.logs)}.log"
        self.logs.append(log)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "memkern", "serve", "--store", str(self.store), "--port", str(self.port),
             "--threads", "1", "--log-level", "warning", "--max-body-bytes", str(MAX_BODY), *self.extra],
            env=self.env, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
        deadline = time.time() + 240
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.time() > deadline:
                self.proc.kill()
                raise RuntimeError(f"memkern serve did not start: {log.read_text()[-2000:]}")
            time.sleep(0.2)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> int:
        if not self.alive():
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -9

    def tracebacks(self) -> list[str]:
        return [t for log in self.logs for t in tracebacks(log)]


# ------------------------------------------------------------------ acknowledged writes
class Ledger:
    """The state every acknowledged write implies: id -> (namespace, summary, meta), ``None``
    once an acknowledged delete removed it."""

    def __init__(self):
        self.state: dict[int, tuple[str, str, dict] | None] = {}

    def added(self, rid: int, namespace: str, summary: str, meta: dict) -> None:
        self.state[int(rid)] = (namespace, summary, dict(meta))

    def updated(self, rid: int, summary: str, meta: dict) -> None:
        if self.state.get(int(rid)) is not None:
            ns = self.state[int(rid)][0]
            self.state[int(rid)] = (ns, summary, dict(meta))

    def deleted(self, rid: int) -> None:
        if int(rid) in self.state:
            self.state[int(rid)] = None

    def namespace(self, rid: int) -> str | None:
        s = self.state.get(int(rid))
        return None if s is None else s[0]

    def check(self, store_path: Path, tally: Tally) -> None:
        """Reopen the store and count every acknowledged write it does not hold as ``lost``."""
        import memkern

        with memkern.MemoryStore(store_path) as st:
            for rid, want in self.state.items():
                try:
                    rec = st.get(rid)
                except KeyError:
                    rec = None
                if want is None:
                    if rec is not None:
                        tally.fail("lost", f"acknowledged delete of {rid} undone")
                elif rec is None:
                    tally.fail("lost", f"acknowledged record {rid} ({want[0]}) missing")
                elif (rec.namespace, rec.summary, dict(rec.meta or {})) != want:
                    tally.fail("lost", f"record {rid}: expected {want!r:.120}, found "
                                       f"{(rec.namespace, rec.summary, rec.meta)!r:.120}")


def contained(ns: str | None, scope: dict) -> bool:
    """Whether the record namespace ``ns`` is a server scope that ``scope``'s given ids contain."""
    from memkern.server import scopes as S

    s = S.decode(ns) if isinstance(ns, str) else None
    if s is None:
        return False
    given = {k: v for k, v in scope.items() if k in ("user_id", "agent_id", "run_id") and v is not None}
    return bool(given) and all(getattr(s, k) == v for k, v in given.items())


def finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
