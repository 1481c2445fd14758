"""One writer and many readers on one store, as separate processes, for a while: a reader must never
see part of a write (``MemoryStore(path, read_only=True)`` + ``refresh()``).

The writer adds batches of records (one ``add_batch`` log entry each) and merges a record after each
(its summary and vector change in one entry: the vector's first component names the version the
summary names), snapshotting every ``--snapshot-every`` operations so that the readers follow the log
across generations and fresh opens race the switch. Each reader loops: refresh, check every batch
whole and every merge whole, and on the first pass and every 10th after it open a fresh view and
check it. Reported: refreshes, fresh opens, checks, errors, torn reads (a failed check), and whether
the final views equal the store.

Run: ``python bench/bench_readers.py [--seconds 60] [--readers 2]`` (the short version is
``tests/store/test_store_readers.py``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

WRITER = textwrap.dedent("""
    import sys, time, numpy as np
    from memkern import MemoryStore
    path, seconds, batch, every = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    s = MemoryStore(path, dim=8, metric="ip", fsync="never", snapshot_every=every)
    rng = np.random.default_rng(0)
    t_end, b, first = time.time() + seconds, 0, None
    while time.time() < t_end:
        v = rng.standard_normal((batch, 8)).astype(np.float32)
        v[:, 0] = 0
        ids = s.add_batch("ns", [f"b{b}-{j} v0" for j in range(batch)], v, metas=[{"batch": b, "of": batch}] * batch)
        first = int(ids[0]) if first is None else first
        e = rng.standard_normal(8).astype(np.float32)
        e[0] = b + 1
        s.merge(first, f"merged v{b + 1}", e)
        b += 1
    s.close()
    print(b)
""")

READER = textwrap.dedent("""
    import json, sys, time
    from memkern import MemoryStore
    path, writer_pid = sys.argv[1], int(sys.argv[2])

    def check(r):
        ids = r.ids("ns")
        recs = r.get_batch(ids)
        by = {}
        for rec in recs:
            by.setdefault(rec.meta["batch"], []).append(rec)
        bad = sum(len(rs) != rs[0].meta["of"] for rs in by.values())
        if len(ids):
            for rec, e in zip(recs, r.embeddings(ids)):
                bad += not rec.summary.endswith(f"v{int(round(float(e[0])))}")
        return len(ids), bad

    import os
    def alive(pid):
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False
    st = {"refreshes": 0, "opens": 0, "checks": 0, "errors": 0, "torn": 0, "reopened_views": 0, "last": 0}
    r = MemoryStore(path, read_only=True)
    while alive(writer_pid):
        try:
            n = r.refresh()
            st["refreshes"] += 1
            k, bad = check(r)
            st["checks"] += 1
            st["torn"] += bad
            st["errors"] += k < st["last"]          # a view that went back in time
            st["last"] = k
            if st["refreshes"] % 10 == 1:           # the first pass too: a slow start still races a fresh open
                with MemoryStore(path, read_only=True) as v:
                    st["torn"] += check(v)[1]
                    st["opens"] += 1
        except Exception as e:  # noqa: BLE001 - counted and reported
            st["errors"] += 1
            st.setdefault("first_error", repr(e))
    time.sleep(0.2)
    r.refresh()
    st["final_ids"] = r.ids("ns").tolist()
    print(json.dumps(st))
""")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--snapshot-every", type=int, default=200)
    ap.add_argument("--json", default=None, help="write the summary here")
    a = ap.parse_args(argv)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "s")
        subprocess.run([sys.executable, "-c", "import sys; from memkern import MemoryStore; "
                        "MemoryStore(sys.argv[1], dim=8, metric='ip').close()", path], check=True, env=env)
        t0 = time.time()
        w = subprocess.Popen([sys.executable, "-c", WRITER, path, str(a.seconds), str(a.batch), str(a.snapshot_every)],
                             stdout=subprocess.PIPE, text=True, env=env)
        readers = [subprocess.Popen([sys.executable, "-c", READER, path, str(w.pid)], stdout=subprocess.PIPE,
                                    text=True, env=env) for _ in range(a.readers)]
        batches = int(w.communicate()[0].strip() or -1)
        outs = [json.loads(p.communicate()[0]) for p in readers]
        from memkern import MemoryStore

        with MemoryStore(path, read_only=True) as s:
            truth = s.ids("ns").tolist()
        summary = {"seconds": round(time.time() - t0, 1), "writer_batches": batches, "readers": a.readers,
                   "refreshes": sum(o["refreshes"] for o in outs), "fresh_opens": sum(o["opens"] for o in outs),
                   "checks": sum(o["checks"] for o in outs), "errors": sum(o["errors"] for o in outs),
                   "torn_reads": sum(o["torn"] for o in outs),
                   "final_views_equal_store": all(o["final_ids"] == truth for o in outs),
                   "first_error": next((o["first_error"] for o in outs if "first_error" in o), None)}
    print(json.dumps(summary, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    ok = summary["errors"] == 0 and summary["torn_reads"] == 0 and summary["final_views_equal_store"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
