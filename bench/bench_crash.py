"""Crash campaign: SIGKILL a writer at random moments, with injected I/O faults, and check that
every acknowledged write survives (issue 10).

Each trial forks a child (the parent has ``memkern`` imported, so a trial costs milliseconds, not
an interpreter start) that opens the store, optionally arms the test-only fault injector
(``memkern._store._test_set_fault``: a short write, a failed write, fsync or rename, once or from
the Nth call on), optionally holds the next snapshot at one of its steps (``_test_snapshot_gate``:
just after the log rotation, after the namespaces are copied, before or just after the switch of
CURRENT) while the writes go on, and runs random writes over three namespaces: add, add_batch,
merge, update, invalidate, delete, snapshot, compact (automatic snapshots, every
``snapshot_every`` operations, are written by the store's background thread meanwhile). Before
each call it reports an intent line on a pipe, after it an ack (the call returned) or a failure
(the call raised). The parent SIGKILLs the child after a random delay, then opens the store itself
and checks:

* every acknowledged write is there, exactly (summary, embedding, status, version);
* every failed write left nothing (a failed add is absent, a failed merge/update/invalidate/delete
  left its record as it was);
* only the one in-flight call may or may not have happened, and if it did, it is intact;
* the store always opens.

Stores are started afresh every ``--trials-per-store`` trials so that checking stays cheap.

``--writers W`` runs the same kind of trials with W threads writing at once under fsync="always"
(group commit: one fdatasync covers every write queued meanwhile; a failed one raises in each):
adds, batch adds and updates, each thread in its own namespace, faults injected alike.

    OMP_NUM_THREADS=1 python bench/bench_crash.py --trials 1000
    OMP_NUM_THREADS=1 python bench/bench_crash.py --trials 300 --writers 8
"""
from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

D = 16
# one-shot faults weigh most: after one, the store must go on working (a sticky one fails all later calls)
FAULTS = ["short:{n}", "short:{n}", "write:{n}", "fsync:{n}", "rename:{n}", "short:{n}+", "fsync:{n}+"]
# where a trial may hold the next snapshot (memkern/snapshot.h), so that the kill lands inside it
GATES = ["rotated", "copied", "written", "switched"]
NS = ("u", "v", "w")


def emb(j: int) -> np.ndarray:
    return np.random.default_rng(j).standard_normal(D).astype(np.float32)


def _child(path: str, seed: int, start_j: int, fault: str, fsync: str, snapshot_every: int, wfd: int,
           gate: str = "") -> None:
    """The writer (runs in the forked child until it is killed)."""
    from memkern import MemkernError, _store
    from memkern.store import MemoryStore

    def say(line: str) -> None:
        os.write(wfd, (line + "\n").encode())

    try:
        s = MemoryStore(path, dim=D, fsync=fsync, snapshot_every=snapshot_every)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which fails the trial
        say(f"E open {type(e).__name__}: {e}".replace("\n", " "))
        os._exit(3)
    if fault:
        _store._test_set_fault(fault)
    if gate:
        _store._test_snapshot_gate(gate)  # never released: the snapshot waits there for the kill
    rng = np.random.default_rng(seed)
    live = [int(i) for ns in NS for i in s.ids(ns, include_invalidated=True)]
    active = [int(i) for ns in NS for i in s.ids(ns)]
    j = start_j
    held = False
    while True:
        if gate and not held and _store._test_wait_snapshot_gate(0.0):
            held = True
            say("G")
        ns = NS[int(rng.integers(len(NS)))]
        r = rng.random()
        if r < 0.4 or len(live) < 3:
            op, args = "add", (j, NS.index(ns))
        elif r < 0.55:
            op, args = "batch", (j, int(rng.integers(2, 5)), NS.index(ns))
        elif r < 0.67:
            op, args = "merge", (live[int(rng.integers(len(live)))], j)
        elif r < 0.77:
            op, args = "update", (live[int(rng.integers(len(live)))], j)
        elif r < 0.84 and active:
            op, args = "invalidate", (active[int(rng.integers(len(active)))],)
        elif r < 0.94:
            op, args = "delete", (live[int(rng.integers(len(live)))],)
        elif r < 0.985:
            op, args = "snapshot", ()
        else:
            op, args = "compact", ()
        say("I " + " ".join(map(str, (op, *args))))
        try:
            if op == "add":
                i = s.add(ns, f"r{j}", emb(j), [{"role": "user", "content": f"c{j}"}], {"j": j})
                res = [i]
                live.append(i)
                active.append(i)
            elif op == "batch":
                n = args[1]
                ids = s.add_batch(ns, [f"r{j + t}" for t in range(n)], np.stack([emb(j + t) for t in range(n)]),
                                  metas=[{"j": j + t} for t in range(n)])
                res = [int(x) for x in ids]
                live.extend(res)
                active.extend(res)
            elif op == "merge":
                s.merge(args[0], f"m{j}", emb(j), [{"role": "user", "content": f"c{j}"}])
                res = []
            elif op == "update":
                s.update(args[0], summary=f"u{j}", embedding=emb(j))
                res = []
            elif op == "invalidate":
                s.invalidate(args[0], "x")
                active.remove(args[0])
                res = []
            elif op == "delete":
                s.delete(args[0])
                live.remove(args[0])
                if args[0] in active:
                    active.remove(args[0])
                res = []
            elif op == "snapshot":
                s.snapshot()
                res = []
            else:
                s.compact()
                res = []
            say("A " + " ".join(map(str, res)))
        except MemkernError as e:
            say("F " + str(_store._test_io_counters()["faults"]))
            if s._native.poisoned:  # writes refused until a reopen: wait for the kill
                say("P")
                while True:
                    time.sleep(1)
        if op in ("add", "merge", "update"):
            j += 1
        elif op == "batch":
            j += args[1]


@dataclass
class Rec:
    summary: str
    j: int
    status: str = "active"
    version: int = 1
    ns: str = "u"


@dataclass
class Expected:
    recs: dict[int, Rec] = field(default_factory=dict)
    deleted: set[int] = field(default_factory=set)
    failed_js: set[int] = field(default_factory=set)  # j of adds that raised: never to be seen
    next_j: int = 1


@dataclass
class Stats:
    trials: int = 0
    acked: int = 0
    failed: int = 0
    faults_fired: int = 0
    poisoned: int = 0
    held_snapshots: int = 0  # trials killed while a snapshot was held at a gate
    killed_in_flight: int = 0
    in_flight_landed: int = 0
    problems: list = field(default_factory=list)


def _apply(exp: Expected, op: str, args: list[int], res: list[int]) -> None:
    """An acknowledged operation."""
    if op == "add":
        exp.recs[res[0]] = Rec(f"r{args[0]}", args[0], ns=NS[args[1]])
    elif op == "batch":
        for t, i in enumerate(res):
            exp.recs[i] = Rec(f"r{args[0] + t}", args[0] + t, ns=NS[args[2]])
    elif op in ("merge", "update"):
        r = exp.recs[args[0]]
        r.summary, r.j, r.version = f"{op[0]}{args[1]}", args[1], r.version + 1
    elif op == "invalidate":
        exp.recs[args[0]].status = "invalidated"
    elif op == "delete":
        del exp.recs[args[0]]
        exp.deleted.add(args[0])


def _open_checked(path: Path, holds: bool, stats: Stats, trial: int):
    """The store reopened after a kill, or None: when it cannot open (a problem, recorded), or when
    the first writer died before creating it and nothing was acknowledged (`holds` False)."""
    from memkern.store import MemoryStore

    if not holds and not any((path / n).exists() for n in ("CURRENT", "wal.log")):
        return None
    try:
        return MemoryStore(path)
    except Exception as e:  # noqa: BLE001
        stats.problems.append(f"trial {trial}: the store does not open: {type(e).__name__}: {e}")
        return None


def _verify(path: Path, exp: Expected, in_flight: tuple[str, list[int]] | None, stats: Stats, trial: int) -> None:
    uncertain: set[int] = set()
    if in_flight and in_flight[0] in ("merge", "update", "invalidate", "delete"):
        uncertain.add(in_flight[1][0])
    s = _open_checked(path, bool(exp.recs or exp.deleted), stats, trial)
    if s is None:
        return
    try:
        present = {int(i) for ns in NS for i in s.ids(ns, include_invalidated=True)}
        want = set(exp.recs) - uncertain
        lost = want - present
        if lost:
            stats.problems.append(f"trial {trial}: acknowledged records lost: {sorted(lost)[:10]}")
        came_back = exp.deleted & present
        if came_back:
            stats.problems.append(f"trial {trial}: deleted records came back: {sorted(came_back)[:10]}")
        ids = sorted(want & present)
        recs = s.get_batch(ids)
        vecs = s.embeddings(ids) if ids else np.zeros((0, D), np.float32)
        for i, r, v in zip(ids, recs, vecs):
            e = exp.recs[i]
            if (r.summary, r.status, r.version, r.namespace) != (e.summary, e.status, e.version, e.ns) or \
                    not np.array_equal(v, emb(e.j)):
                stats.problems.append(f"trial {trial}: record {i} is {(r.summary, r.status, r.version, r.namespace)}, "
                                      f"acknowledged {(e.summary, e.status, e.version, e.ns)}")
        extra = present - set(exp.recs) - uncertain - exp.deleted
        if extra and not (in_flight and in_flight[0] in ("add", "batch")):
            stats.problems.append(f"trial {trial}: records nobody acknowledged: {sorted(extra)[:10]}")
        for i in sorted(extra):  # the in-flight add landed: it must be intact, then it is expected
            r = s.get(i)
            j = int(r.summary[1:])
            if r.summary != f"r{j}" or not np.array_equal(r.embedding, emb(j)):
                stats.problems.append(f"trial {trial}: in-flight record {i} is damaged")
            if j in exp.failed_js:
                stats.problems.append(f"trial {trial}: record {i} of an add that raised is there")
            exp.recs[i] = Rec(r.summary, j, ns=r.namespace)
        for i in uncertain:  # the in-flight change: either state is fine, adopt what is there
            if i in present:
                r = s.get(i)
                old = exp.recs.get(i)
                j = int(r.summary[1:]) if r.summary[1:].isdigit() else (old.j if old else 0)
                if old and (r.summary, r.status, r.version) != (old.summary, old.status, old.version):
                    stats.in_flight_landed += 1
                exp.recs[i] = Rec(r.summary, j, r.status, r.version, r.namespace)
                if not np.array_equal(r.embedding, emb(j)):
                    stats.problems.append(f"trial {trial}: in-flight change of {i} is damaged")
            else:
                exp.recs.pop(i, None)
                exp.deleted.add(i)
                stats.in_flight_landed += 1
        if extra:
            stats.in_flight_landed += 1
    finally:
        s.close()


def _stop_after(stats: Stats, trial: int, log, in_flight_words: str) -> bool:
    """After a trial's check: logs the first problem (and progress every 100 trials); True to stop."""
    if stats.problems:
        if log:
            log(stats.problems[-1])
        return True
    if log and (trial + 1) % 100 == 0:
        log(f"{trial + 1} trials: {stats.acked} acknowledged, {stats.failed} raised, "
            f"{stats.killed_in_flight} {in_flight_words}")
    return False


def run_campaign(trials: int, root: Path, *, seed: int = 0, trials_per_store: int = 25, fsync: str = "always",
                 snapshot_every: tuple[int, ...] = (7, 1000), fault_rate: float = 0.4, max_kill_s: float = 0.2,
                 gate_rate: float = 0.3, log=print) -> Stats:
    """Runs `trials` SIGKILL trials under `root`; returns the statistics (problems must be empty).
    Each store takes its ``snapshot_every`` from the given choices in turn: frequent snapshots put
    kills inside snapshots, rare ones leave long logs (where garbage from a failed append would
    stay until the next open). A ``gate_rate`` share of the trials holds the next snapshot at a
    random step (GATES) while the writes go on."""
    import memkern.store  # noqa: F401 - imported once, before the forks

    rng = np.random.default_rng(seed)
    stats = Stats()
    exp = Expected()
    path = root / "s0"
    for trial in range(trials):
        if trial % trials_per_store == 0:
            path = root / f"s{trial // trials_per_store}"
            shutil.rmtree(path, ignore_errors=True)
            exp = Expected()
            every = snapshot_every[(trial // trials_per_store) % len(snapshot_every)]
        fault = ""
        if rng.random() < fault_rate:
            fault = FAULTS[int(rng.integers(len(FAULTS)))].format(n=int(rng.integers(1, 12)))
        gate = GATES[int(rng.integers(len(GATES)))] if rng.random() < gate_rate else ""
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            try:
                os.close(rfd)
                _child(str(path), int(rng.integers(2**31)) + trial, exp.next_j, fault, fsync, every, wfd, gate)
            finally:
                os._exit(1)
        os.close(wfd)
        buf = _read_until_kill(rfd, pid, time.monotonic() + float(rng.uniform(0.0, max_kill_s)) + 0.02, stats, trial)
        stats.trials += 1
        in_flight = None
        fired = 0
        for ln in buf.decode().split("\n")[:-1]:  # a partial last line was never completed
            parts = ln.split()
            if parts[0] == "I":
                in_flight = (parts[1], [int(x) for x in parts[2:]])
                if parts[1] == "add":  # add j ns
                    exp.next_j = max(exp.next_j, in_flight[1][0] + 1)
                elif parts[1] in ("merge", "update"):  # merge id j
                    exp.next_j = max(exp.next_j, in_flight[1][1] + 1)
                elif parts[1] == "batch":
                    exp.next_j = max(exp.next_j, in_flight[1][0] + in_flight[1][1])
            elif parts[0] == "A":
                _apply(exp, in_flight[0], in_flight[1], [int(x) for x in parts[1:]])
                stats.acked += 1
                in_flight = None
            elif parts[0] == "F":
                stats.failed += 1
                if in_flight[0] == "add":
                    exp.failed_js.add(in_flight[1][0])
                elif in_flight[0] == "batch":
                    exp.failed_js.update(range(in_flight[1][0], in_flight[1][0] + in_flight[1][1]))
                fired = max(fired, int(parts[1]))
                in_flight = None  # it raised: nothing of it may be there (checked by _verify)
            elif parts[0] == "P":
                stats.poisoned += 1
            elif parts[0] == "G":
                stats.held_snapshots += 1
            elif parts[0] == "E":
                stats.problems.append(f"trial {trial}: {ln}")
        stats.faults_fired += fired
        if in_flight is not None:
            stats.killed_in_flight += 1
        _verify(path, exp, in_flight, stats, trial)
        if _stop_after(stats, trial, log, "kills mid-call"):
            break
    # A campaign where (almost) nothing succeeds proves nothing: the writes must mostly work.
    if stats.trials == trials and stats.acked < 2 * trials:
        stats.problems.append(f"only {stats.acked} operations were acknowledged in {trials} trials")
    if stats.trials == trials and stats.poisoned > trials // 4:
        stats.problems.append(f"{stats.poisoned} of {trials} trials ended with the store refusing writes")
    return stats


# ---------------------------------------------------------------------------- several writers
# ``--writers W`` (W > 1): W threads of one process write at once under fsync="always", so that the
# store commits them in groups (one fdatasync for every write queued meanwhile). Thread w adds,
# batch-adds and updates records of its own namespace ``t<w>``; every line on the pipe names its
# thread, and each thread has at most one call in flight when the kill comes.


def _writers_child(path: str, seed: int, start_j: int, fault: str, writers: int, snapshot_every: int,
                   wfd: int) -> None:
    import threading

    from memkern import MemkernError, _store
    from memkern.store import MemoryStore

    def say(line: str) -> None:
        os.write(wfd, (line + "\n").encode())  # one write() of < PIPE_BUF bytes: never interleaved

    try:
        s = MemoryStore(path, dim=D, fsync="always", snapshot_every=snapshot_every)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which fails the trial
        say(f"E - open {type(e).__name__}: {e}".replace("\n", " "))
        os._exit(3)
    if fault:
        _store._test_set_fault(fault)

    def writer(w: int) -> None:
        rng = np.random.default_rng(seed + w)
        ns = f"t{w}"
        live = [int(i) for i in s.ids(ns)]
        j = start_j + w * 10**7
        while True:
            r = rng.random()
            if r < 0.6 or not live:
                op, args = "add", (j,)
            elif r < 0.8:
                op, args = "batch", (j, int(rng.integers(2, 5)))
            else:
                op, args = "update", (live[int(rng.integers(len(live)))], j)
            say(f"I {w} " + " ".join(map(str, (op, *args))))
            try:
                if op == "add":
                    res = [s.add(ns, f"r{j}", emb(j))]
                elif op == "batch":
                    res = [int(x) for x in s.add_batch(ns, [f"r{j + t}" for t in range(args[1])],
                                                       np.stack([emb(j + t) for t in range(args[1])]))]
                else:
                    s.update(args[0], summary=f"u{j}", embedding=emb(j))
                    res = []
                live.extend(res)
                say(f"A {w} " + " ".join(map(str, res)))
            except MemkernError:
                say(f"F {w} {_store._test_io_counters()['faults']}")
                if s._native.poisoned:
                    say(f"P {w}")
                    return
            j += args[1] if op == "batch" else 1

    ts = [threading.Thread(target=writer, args=(w,), daemon=True) for w in range(writers)]
    for t in ts:
        t.start()
    while True:
        time.sleep(1)


def _verify_writers(path: Path, exp: dict[int, Expected], in_flight: dict, stats: Stats, trial: int) -> None:
    s = _open_checked(path, any(e.recs for e in exp.values()), stats, trial)
    if s is None:
        return
    try:
        for w, e in exp.items():
            fl = in_flight.get(w)
            uncertain = {fl[1][0]} if fl and fl[0] == "update" else set()
            present = {int(i) for i in s.ids(f"t{w}")}
            want = set(e.recs) - uncertain
            if want - present:
                stats.problems.append(f"trial {trial}: writer {w}: acknowledged records lost: {sorted(want - present)[:10]}")
            ids = sorted(want & present)
            for i, r, v in zip(ids, s.get_batch(ids), s.embeddings(ids) if ids else []):
                x = e.recs[i]
                if (r.summary, r.version) != (x.summary, x.version) or not np.array_equal(v, emb(x.j)):
                    stats.problems.append(f"trial {trial}: record {i} is {(r.summary, r.version)}, "
                                          f"acknowledged {(x.summary, x.version)}")
            extra = present - set(e.recs)
            if extra and not (fl and fl[0] in ("add", "batch")):
                stats.problems.append(f"trial {trial}: writer {w}: records nobody acknowledged: {sorted(extra)[:10]}")
            for i in sorted(extra):  # its in-flight add landed whole: expected from now on
                r = s.get(i)
                j = int(r.summary[1:])
                if r.summary != f"r{j}" or not np.array_equal(r.embedding, emb(j)) or j in e.failed_js:
                    stats.problems.append(f"trial {trial}: in-flight record {i} is damaged or raised")
                e.recs[i] = Rec(r.summary, j, ns=f"t{w}")
                stats.in_flight_landed += 1
            for i in uncertain & present:  # the in-flight update: either version is fine
                r = s.get(i)
                j = int(r.summary[1:])
                if not np.array_equal(r.embedding, emb(j)):
                    stats.problems.append(f"trial {trial}: in-flight update of {i} is damaged")
                e.recs[i] = Rec(r.summary, j, version=r.version, ns=f"t{w}")
    finally:
        s.close()


def run_writers_campaign(trials: int, root: Path, writers: int, *, seed: int = 0, trials_per_store: int = 25,
                         snapshot_every: tuple[int, ...] = (50, 5000), fault_rate: float = 0.4,
                         max_kill_s: float = 0.2, log=print) -> Stats:
    """SIGKILL trials with ``writers`` threads writing at once under fsync="always" (group commit);
    returns the statistics (problems must be empty). Faults are injected as in
    :func:`run_campaign`; a failed shared fdatasync makes every write of its group raise."""
    import memkern.store  # noqa: F401 - imported once, before the forks

    rng = np.random.default_rng(seed)
    stats = Stats()
    exp: dict[int, Expected] = {}
    next_j = 1
    path = root / "w0"
    for trial in range(trials):
        if trial % trials_per_store == 0:
            path = root / f"w{trial // trials_per_store}"
            shutil.rmtree(path, ignore_errors=True)
            exp = {w: Expected() for w in range(writers)}
            every = snapshot_every[(trial // trials_per_store) % len(snapshot_every)]
        fault = ""
        if rng.random() < fault_rate:
            fault = FAULTS[int(rng.integers(len(FAULTS)))].format(n=int(rng.integers(1, 40)))
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(rfd)
                _writers_child(str(path), int(rng.integers(2**31)) + trial, next_j, fault, writers, every, wfd)
            finally:
                os._exit(1)
        os.close(wfd)
        buf = _read_until_kill(rfd, pid, time.monotonic() + float(rng.uniform(0.0, max_kill_s)) + 0.05, stats, trial)
        stats.trials += 1
        in_flight: dict[int, tuple[str, list[int]]] = {}
        fired = 0
        for ln in buf.decode().split("\n")[:-1]:
            parts = ln.split()
            kind = parts[0]
            if kind == "E":
                stats.problems.append(f"trial {trial}: {ln}")
                continue
            w = int(parts[1])
            if kind == "I":
                in_flight[w] = (parts[2], [int(x) for x in parts[3:]])
                a = in_flight[w][1]
                next_j = max(next_j, (a[0] + a[1] if parts[2] == "batch" else a[-1] + 1) - w * 10**7)
            elif kind == "A":
                op, a = in_flight.pop(w)
                res = [int(x) for x in parts[2:]]
                e = exp[w]
                if op == "add":
                    e.recs[res[0]] = Rec(f"r{a[0]}", a[0], ns=f"t{w}")
                elif op == "batch":
                    for t, i in enumerate(res):
                        e.recs[i] = Rec(f"r{a[0] + t}", a[0] + t, ns=f"t{w}")
                else:
                    r = e.recs[a[0]]
                    r.summary, r.j, r.version = f"u{a[1]}", a[1], r.version + 1
                stats.acked += 1
            elif kind == "F":
                op, a = in_flight.pop(w)
                stats.failed += 1
                if op == "add":
                    exp[w].failed_js.add(a[0])
                elif op == "batch":
                    exp[w].failed_js.update(range(a[0], a[0] + a[1]))
                fired = max(fired, int(parts[2]))
            elif kind == "P":
                stats.poisoned += 1
        stats.faults_fired += fired
        stats.killed_in_flight += len(in_flight)
        _verify_writers(path, exp, in_flight, stats, trial)
        if _stop_after(stats, trial, log, "calls in flight at the kills"):
            break
    if stats.trials == trials and stats.acked < 2 * trials:
        stats.problems.append(f"only {stats.acked} operations were acknowledged in {trials} trials")
    return stats


def _read_until_kill(rfd: int, pid: int, deadline: float, stats: Stats, trial: int) -> bytes:
    """Reads the child's lines until `deadline`, SIGKILLs it, and returns everything it wrote."""
    buf = b""
    while time.monotonic() < deadline:
        r, _, _ = select.select([rfd], [], [], max(0.0, deadline - time.monotonic()))
        if r:
            chunk = os.read(rfd, 65536)
            if not chunk:
                break
            buf += chunk
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    while True:
        chunk = os.read(rfd, 65536)
        if not chunk:
            break
        buf += chunk
    os.close(rfd)
    if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
        stats.problems.append(f"trial {trial}: the writer exited by itself ({status}): {buf[-500:]!r}")
    return buf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fsync", default="always", choices=["always", "batch", "never"])
    ap.add_argument("--trials-per-store", type=int, default=25)
    ap.add_argument("--fault-rate", type=float, default=0.4)
    ap.add_argument("--gate-rate", type=float, default=0.3, help="share of trials that hold a snapshot at a step")
    ap.add_argument("--writers", type=int, default=1,
                    help="threads writing at once (> 1: the group-commit campaign, fsync always)")
    ap.add_argument("--json", help="write the summary here")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="memkern-crash-"))
    t0 = time.perf_counter()
    try:
        if a.writers > 1:
            st = run_writers_campaign(a.trials, root, a.writers, seed=a.seed, trials_per_store=a.trials_per_store,
                                      fault_rate=a.fault_rate)
        else:
            st = run_campaign(a.trials, root, seed=a.seed, fsync=a.fsync, trials_per_store=a.trials_per_store,
                              fault_rate=a.fault_rate, gate_rate=a.gate_rate)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    dt = time.perf_counter() - t0
    summary = {
        "trials": st.trials, "fsync": "always" if a.writers > 1 else a.fsync, "writers": a.writers, "seed": a.seed, "acknowledged_ops": st.acked,
        "raised_ops": st.failed, "faults_fired": st.faults_fired, "poisoned_stores": st.poisoned,
        "kills_during_a_held_snapshot": st.held_snapshots,
        "kills_mid_call": st.killed_in_flight, "in_flight_that_landed": st.in_flight_landed,
        "problems": st.problems, "seconds": round(dt, 1),
    }
    print(json.dumps(summary, indent=1))
    print(f"{st.trials} SIGKILL trials in {dt:.0f} s: {st.acked} acknowledged operations, {st.failed} raised "
          f"(injected faults fired {st.faults_fired} times, {st.poisoned} stores refused writes until reopened), "
          f"{st.held_snapshots} kills while a snapshot was held at a step, "
          f"{st.killed_in_flight} kills inside a call; acknowledged writes lost or damaged: "
          f"{'NONE' if not st.problems else len(st.problems)}")
    if a.json:
        Path(a.json).write_text(json.dumps(summary, indent=1))
    sys.exit(1 if st.problems else 0)


if __name__ == "__main__":
    main()
