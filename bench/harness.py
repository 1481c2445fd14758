"""One harness for every comparison in ``bench/``: interleaved rounds, statistics, pinned threads.

A comparison times two (or more) callables that compute *the same thing*:

* **interleaved**: after ``warmup`` untimed rounds, each timed round runs every side once in turn
  (A, B, A, B, ...), so a burst of machine noise hits both sides alike instead of all of one;
* **statistics**: per side the median over ``rounds`` (>= 5 by default) seconds per call, the
  inter-quartile range and min/max; the ratio is the median of the per-round ratios (paired);
* **CPU / wall**: per side the process CPU time divided by wall time. A single-threaded side
  reads ~1.0; well below 1.0 means the process waited for a core (a starved, shared machine), and
  above 1.0 means several threads ran;
* **threads pinned and stated**: :func:`pin_threads` sets torch's intra-op threads and the
  OMP/MKL/OpenBLAS environment; each side states its own thread setting (``threads=``) in the
  result (e.g. a peer's ``num_threads``), and :func:`thread_settings` records the process's;
* **same result**: ``check(result_a, result_b)`` is called on the outputs of the warm-up round and
  of the last timed round; it must return ``None``/``True`` or raise. ``False`` or an exception
  raises :class:`CheckFailed`, so a benchmark never reports a ratio between different answers.

Usage::

    from harness import Side, compare, pin_threads
    with pin_threads(1):
        c = compare(Side("memkern", lambda: store.search("ns", q, k=10), threads=1),
                    Side("hnswlib", lambda: index.knn_query(q, k=10, num_threads=1)[0], threads=1),
                    check=lambda a, b: recall_close(a[0], b), rounds=7, label="batch search")
    print(c.summary())

:func:`machine_info` gives the date, cores, CPU model, load average and package versions that
every table in the report states.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import importlib.metadata
import math
import os
import platform
import statistics
import time
from typing import Any, Callable, Iterator, Sequence

THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
PEER_PACKAGES = ("memkern", "numpy", "torch", "hnswlib", "faiss-cpu", "chromadb", "onnxruntime", "transformers")


class CheckFailed(AssertionError):
    """The sides of a comparison did not compute the same thing (raised by :func:`compare`)."""


@dataclasses.dataclass
class Side:
    """One implementation in a comparison.

    Parameters
    ----------
    name : label in tables.
    fn : zero-argument callable doing the work once; its return value goes to ``check``.
    threads : the thread setting this side runs with (stated in the result; e.g. a peer's
        ``num_threads``); ``None`` means "the process setting" (:func:`thread_settings`).
    setup : optional zero-argument callable run before *each* call, untimed (e.g. a fresh
        directory for a write benchmark).
    """

    name: str
    fn: Callable[[], Any]
    threads: int | str | None = None
    setup: Callable[[], Any] | None = None


@dataclasses.dataclass
class SideStats:
    name: str
    threads: int | str | None
    times: list  # seconds per call, one per timed round
    cpu_times: list  # process CPU seconds per call, one per timed round

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def q1(self) -> float:
        return _quantile(self.times, 0.25)

    @property
    def q3(self) -> float:
        return _quantile(self.times, 0.75)

    @property
    def min(self) -> float:
        return min(self.times)

    @property
    def max(self) -> float:
        return max(self.times)

    @property
    def cpu_per_wall(self) -> float:
        w = sum(self.times)
        return sum(self.cpu_times) / w if w > 0 else float("nan")

    def to_dict(self) -> dict:
        return {"name": self.name, "threads": self.threads, "median_s": self.median, "q1_s": self.q1,
                "q3_s": self.q3, "min_s": self.min, "max_s": self.max, "cpu_per_wall": self.cpu_per_wall,
                "rounds": len(self.times), "times_s": list(self.times)}


@dataclasses.dataclass
class Comparison:
    """Result of :func:`compare`: per-side statistics, the paired ratio and the run's settings."""

    label: str
    sides: list  # list[SideStats]
    order: list  # names in the order they ran (warm-up and timed rounds), for auditing
    ratios: list  # per timed round: time(side 0) / time(side 1)
    checked: bool
    settings: dict
    extra: dict = dataclasses.field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """Median of the per-round ratios ``time(sides[0]) / time(sides[1])`` (< 1: side 0 faster)."""
        return statistics.median(self.ratios)

    @property
    def speedup(self) -> float:
        """``1 / ratio``: how many times faster side 0 is than side 1."""
        return 1.0 / self.ratio

    def side(self, name: str) -> SideStats:
        for s in self.sides:
            if s.name == name:
                return s
        raise KeyError(name)

    def to_dict(self) -> dict:
        return {"label": self.label, "sides": [s.to_dict() for s in self.sides], "ratio": self.ratio,
                "ratio_q1": _quantile(self.ratios, 0.25), "ratio_q3": _quantile(self.ratios, 0.75),
                "ratios": list(self.ratios), "checked": self.checked, "settings": self.settings,
                "extra": self.extra}

    def summary(self, unit: str = "ms") -> str:
        scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
        parts = [f"{s.name} {s.median * scale:.3f} {unit} [IQR {s.q1 * scale:.3f}-{s.q3 * scale:.3f}, "
                 f"cpu/wall {s.cpu_per_wall:.2f}, threads {s.threads}]" for s in self.sides]
        return (f"{self.label}: " + "; ".join(parts)
                + f"; ratio {self.sides[0].name}/{self.sides[1].name} {self.ratio:.3f} "
                  f"(IQR {_quantile(self.ratios, 0.25):.3f}-{_quantile(self.ratios, 0.75):.3f})")


def _quantile(xs: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default), without numpy."""
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _run_check(check, results: list, label: str, when: str) -> None:
    a = results[0]
    for name_b, b in results[1:]:
        try:
            ok = check(a[1], b)
        except Exception as e:  # noqa: BLE001 - any failure of the check is a failed comparison
            raise CheckFailed(f"{label}: {a[0]} and {name_b} differ ({when}): {type(e).__name__}: {e}") from e
        if ok is False:
            raise CheckFailed(f"{label}: {a[0]} and {name_b} differ ({when}): check returned False")


def compare(*sides: Side, check: Callable[[Any, Any], Any] | None, rounds: int = 5, warmup: int = 1,
            number: int = 1, label: str = "", extra: dict | None = None) -> Comparison:
    """Time ``sides`` interleaved and assert they computed the same thing.

    Parameters
    ----------
    *sides : two or more :class:`Side`; ratios are ``sides[0] / sides[1]``.
    check : ``check(result_of_sides[0], result_of_other_side)`` for every other side; return
        ``None``/``True`` when equal, ``False`` or raise otherwise. Required: pass ``None`` only
        for timings where equality is established elsewhere, and say so in ``extra``.
    rounds : timed rounds (>= 5 unless a very long workload forces fewer; must be >= 1).
    warmup : untimed rounds before, interleaved the same way.
    number : calls per side per round (the time is divided by it): use it for calls of micro-
        seconds so one timing is not dominated by the clock.
    label : name of the comparison in tables.
    extra : free-form facts to keep with the result (data sizes, parameters).

    Returns
    -------
    :class:`Comparison`

    Raises
    ------
    CheckFailed
        If ``check`` fails on the warm-up or the last round's results.
    ValueError
        For fewer than two sides or non-positive ``rounds``/``number``, or a negative ``warmup``.
    """
    if len(sides) < 2:
        raise ValueError(f"sides: expected at least 2, got {len(sides)}")
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds: expected an int >= 1, got {rounds!r}")
    if not isinstance(number, int) or number < 1:
        raise ValueError(f"number: expected an int >= 1, got {number!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup: expected an int >= 0, got {warmup!r}")
    names = [s.name for s in sides]
    if len(set(names)) != len(names):
        raise ValueError(f"sides: expected distinct names, got {names}")
    order: list[str] = []
    times = {s.name: [] for s in sides}
    cpus = {s.name: [] for s in sides}

    def one(s: Side, timed: bool):
        if s.setup is not None:
            s.setup()
        order.append(s.name)
        c0, t0 = time.process_time(), time.perf_counter()
        r = None
        for _ in range(number):
            r = s.fn()
        t1, c1 = time.perf_counter(), time.process_time()
        if timed:
            times[s.name].append((t1 - t0) / number)
            cpus[s.name].append((c1 - c0) / number)
        return r

    last = None
    for w in range(warmup):
        res = [(s.name, one(s, False)) for s in sides]
        if w == 0 and check is not None:
            _run_check(check, res, label, "warm-up")
    for _ in range(rounds):
        last = [(s.name, one(s, True)) for s in sides]
    if check is not None:
        _run_check(check, last, label, "last round")
    a = times[sides[0].name]
    b = times[sides[1].name]
    ratios = [x / y if y > 0 else float("inf") for x, y in zip(a, b)]
    return Comparison(
        label=label,
        sides=[SideStats(s.name, s.threads if s.threads is not None else thread_settings()["torch"],
                         times[s.name], cpus[s.name]) for s in sides],
        order=order, ratios=ratios, checked=check is not None, settings=thread_settings(),
        extra=dict(extra or {}),
    )


def latencies(*sides: Side, calls: Sequence[Callable[[Side, int], Any]] | None = None, n: int = 200,
              warmup: int = 10, label: str = "",
              check: Callable[[Any, Any], Any] | None = None) -> dict:
    """Per-call latency distributions (p50/p99) of sides called *alternately* call by call.

    ``sides[i].fn`` is replaced by ``calls[i](side, j)`` when ``calls`` is given (the j-th call,
    e.g. the j-th query); otherwise ``fn()`` is called ``n`` times. ``check`` compares the j-th
    results of side 0 and each other side for every j.

    Returns
    -------
    dict: per side name ``{"p50_s", "p99_s", "mean_s", "cpu_per_wall", "threads"}`` and ``"label"``.
    """
    if len(sides) < 2:
        raise ValueError(f"sides: expected at least 2, got {len(sides)}")
    lat = {s.name: [] for s in sides}
    cpu = {s.name: 0.0 for s in sides}
    for j in range(-warmup, n):
        res = []
        for i, s in enumerate(sides):
            c0, t0 = time.process_time(), time.perf_counter()
            r = calls[i](s, max(j, 0)) if calls is not None else s.fn()
            t1, c1 = time.perf_counter(), time.process_time()
            if j >= 0:
                lat[s.name].append(t1 - t0)
                cpu[s.name] += c1 - c0
            res.append((s.name, r))
        if check is not None and j >= 0:
            _run_check(check, res, label, f"call {j}")
    out: dict = {"label": label, "checked": check is not None, "settings": thread_settings()}
    for s in sides:
        xs = lat[s.name]
        out[s.name] = {"p50_s": _quantile(xs, 0.5), "p99_s": _quantile(xs, 0.99), "mean_s": statistics.fmean(xs),
                       "cpu_per_wall": cpu[s.name] / sum(xs) if sum(xs) > 0 else float("nan"),
                       "threads": s.threads, "calls": len(xs)}
    return out


def interleaved_add_vs_hnswlib(store, index, x, texts: Sequence[str], chunk: int, namespace: str = "bench",
                               start: int = 0) -> dict:
    """Fill ``store`` (a :class:`memkern.MemoryStore`) and ``index`` (an initialised
    ``hnswlib.Index`` with room for ``len(x)``) with the same records, chunk by chunk, alternating
    the sides per chunk (``store.add_batch`` of ``x[s:s+chunk]`` with their ``texts``, then
    ``index.add_items`` with labels ``s..`` on one thread + a dict of the same records, what a
    raw-hnswlib user keeps beside the index) so machine noise hits both sides alike.

    Parameters
    ----------
    x : float32 ``[n, d]``; texts : ``n`` str; chunk : records per call; start : hnswlib label of
    ``x[0]`` (an index grown over several calls continues its labels).

    Returns
    -------
    dict: ``store_s`` / ``hnswlib_s`` (float lists, seconds per chunk), ``t_store`` / ``t_base``
    (their sums), ``ratio`` (``t_store / t_base``), ``ratio_median`` (median of the per-chunk
    ratios, a paired statistic) and ``records`` (the dict).
    """
    import numpy as np

    n = len(x)
    records: dict[int, dict] = {}
    ts: list[float] = []
    tb: list[float] = []
    for s0 in range(0, n, chunk):
        e, tx = x[s0:s0 + chunk], texts[s0:s0 + chunk]
        t0 = time.perf_counter()
        store.add_batch(namespace, tx, e)
        t1 = time.perf_counter()
        labels = np.arange(start + s0, start + s0 + len(e))
        index.add_items(e, labels, num_threads=1)
        for j, lab in enumerate(labels.tolist()):
            records[lab] = {"namespace": namespace, "summary": tx[j], "turns": [], "meta": {}}
        t2 = time.perf_counter()
        ts.append(t1 - t0)
        tb.append(t2 - t1)
    t_store, t_base = sum(ts), sum(tb)
    return {"store_s": ts, "hnswlib_s": tb, "t_store": t_store, "t_base": t_base, "ratio": t_store / t_base,
            "ratio_median": statistics.median(a / b for a, b in zip(ts, tb)), "records": records}


# ------------------------------------------------------------------------------------- threads
def thread_settings() -> dict:
    """The process's thread settings: torch intra-op threads and the OMP/MKL/OpenBLAS environment."""
    out: dict[str, Any] = {k: os.environ.get(k) for k in THREAD_ENV}
    try:
        import torch

        out["torch"] = torch.get_num_threads()
    except ImportError:  # pragma: no cover - torch is a dependency
        out["torch"] = None
    return out


@contextlib.contextmanager
def pin_threads(n: int) -> Iterator[dict]:
    """Pin torch's intra-op threads and the OMP/MKL/OpenBLAS environment to ``n``; restore after.

    The environment variables reach libraries that read them when they start their pools (set
    them before importing faiss/numpy for full effect; the root ``conftest.py`` and the ``memkern
    bench`` command do); torch is pinned directly. Yields :func:`thread_settings`.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n: expected an int >= 1, got {n!r}")
    import torch

    old_env = {k: os.environ.get(k) for k in THREAD_ENV}
    old_torch = torch.get_num_threads()
    for k in THREAD_ENV:
        os.environ[k] = str(n)
    torch.set_num_threads(n)
    try:
        yield thread_settings()
    finally:
        torch.set_num_threads(old_torch)
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ------------------------------------------------------------------------------------- machine
def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info() -> dict:
    """Date, host, cores, CPU model, load average and package versions, for every table."""
    model = None
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        usable = os.cpu_count()
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": os.cpu_count(), "usable_cores": usable, "cpu": model or platform.processor(),
        "loadavg": [round(x, 2) for x in os.getloadavg()], "python": platform.python_version(),
        "versions": {p: package_version(p) for p in PEER_PACKAGES},
    }


def fmt_machine(m: dict) -> str:
    """One line stating the machine for a table caption."""
    v = ", ".join(f"{k} {x}" for k, x in m["versions"].items() if x)
    return (f"{m['date']}; {m['cores']} cores ({m['usable_cores']} usable), {m['cpu']}, load average "
            f"{m['loadavg'][0]}; Python {m['python']}; {v}")


def to_jsonable(o):
    """``o`` with comparisons (``to_dict``), tuples and numpy scalars turned into JSON-ready values."""
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if isinstance(o, dict):
        return {k: to_jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [to_jsonable(v) for v in o]
    if hasattr(o, "item") and callable(o.item) and getattr(o, "shape", None) == ():
        return o.item()
    return o


class NoPeers(RuntimeError):
    """A comparison part found none of its peers installed: there is nothing to compare against, so
    the part is skipped (``memkern bench`` says so and goes on with the other parts)."""


def require_peers(classes: list, part: str) -> list:
    """``classes`` (the installed peers), or :class:`NoPeers` naming the extra that installs them."""
    if not classes:
        raise NoPeers(f"{part}: no peer installed to compare with (pip install 'memkern[bench]' installs "
                      "hnswlib, faiss-cpu and chromadb); skipped")
    return classes


def peers_available(classes, log=print) -> list:
    """The peer classes (each with ``name`` and ``available() -> reason or ""``) that are installed,
    restricted to ``MEMKERN_BENCH_PEERS`` (comma list) when set; a skipped one is logged with why."""
    only = [p for p in os.environ.get("MEMKERN_BENCH_PEERS", "").split(",") if p]
    out = []
    for cls in classes:
        if only and cls.name not in only:
            log(f"skipping {cls.name}: not in MEMKERN_BENCH_PEERS={','.join(only)}")
            continue
        why = cls().available()
        if why:
            log(f"skipping {cls.name}: {why}")
        else:
            out.append(cls)
    return out
