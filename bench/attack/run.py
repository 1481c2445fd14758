"""Run memkern's attack campaigns: every class module in ``bench/attack/`` with fresh random variants.

A class module defines ``CLASS = "<name>"`` and ``campaign(rng, n, workdir) -> dict`` (see
:mod:`attack`); this runner finds them, runs each with its own ``random.Random`` (seeded from
``--seed`` and the class name) and its own empty work folder, prints one table, and exits 1 when
any class reports a non-memkern exception, an HTTP 500, a hang, a cross-scope read or write, or a
lost acknowledged write (or its campaign itself crashed)::

    .venv/bin/python bench/attack/run.py                       # every class, n=200, a random seed
    .venv/bin/python bench/attack/run.py --classes imports,dates --n 50 --seed 7 --out attack.json

The seed used is printed: rerun with ``--seed`` to replay a failure.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import random
import sys
import tempfile
import time
import traceback
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
# bench/ on the path, never bench/attack/ itself (attack/http.py would shadow the stdlib's http).
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(BENCH)
elif str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from attack.common import COUNTS, FAIL_COUNTS  # noqa: E402


def discover() -> dict:
    """``{CLASS: module}`` of every module in ``bench/attack/`` that defines ``CLASS`` and ``campaign``."""
    import attack

    found = {}
    for info in sorted(pkgutil.iter_modules(attack.__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name in ("run", "common", "values"):
            continue
        mod = importlib.import_module(f"attack.{info.name}")
        if isinstance(getattr(mod, "CLASS", None), str) and callable(getattr(mod, "campaign", None)):
            found[mod.CLASS] = mod
    return found


def run_class(mod, seed: int, n: int, workdir: Path) -> dict:
    """One campaign; a crash of the campaign itself is reported as a failure of its class."""
    rng = random.Random(f"{seed}:{mod.CLASS}")
    t0 = time.perf_counter()
    try:
        res = dict(mod.campaign(rng, n, workdir))
        missing = [k for k in COUNTS if not isinstance(res.get(k), int)]
        if missing:
            raise TypeError(f"campaign result lacks the counts {missing}")
        res.setdefault("examples", [])
    except Exception as e:  # noqa: BLE001 - reported, not raised
        res = {k: 0 for k in COUNTS}
        res["non_memkern_exceptions"] = 1
        res["examples"] = [f"campaign crashed: {type(e).__name__}: {e} "
                           f"{traceback.format_exc(limit=-3)}"]
        res["crashed"] = True
    res["seconds"] = round(time.perf_counter() - t0, 2)
    res["failed"] = bool(res.get("crashed")) or any(res[k] for k in FAIL_COUNTS)
    return res


def table(results: dict) -> str:
    cols = ["class", *COUNTS, "seconds", "result"]
    rows = [[name, *(str(r[k]) for k in COUNTS), f"{r['seconds']:.1f}", "FAIL" if r["failed"] else "ok"]
            for name, r in results.items()]
    width = [max(len(c), *(len(row[i]) for row in rows)) if rows else len(c) for i, c in enumerate(cols)]
    line = lambda vals: "  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(vals, width)))  # noqa
    return "\n".join([line(cols), line(["-" * w for w in width]), *(line(r) for r in rows)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--classes", default=None, help="comma-separated classes to run (default: all found)")
    ap.add_argument("--n", type=int, default=200, help="cases per class (default 200)")
    ap.add_argument("--seed", type=int, default=None, help="seed (default: a fresh random one, printed)")
    ap.add_argument("--out", default=None, help="write the results as JSON to this file")
    ap.add_argument("--workdir", default=None, help="folder for the campaigns' files (default: a temporary one)")
    a = ap.parse_args(argv)
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(2 ** 31)
    found = discover()
    names = list(found) if a.classes is None else [c.strip() for c in a.classes.split(",") if c.strip()]
    unknown = [c for c in names if c not in found]
    if unknown:
        print(f"attack: unknown classes {unknown} (found: {sorted(found)})", file=sys.stderr)
        return 2
    print(f"attack: seed {seed}, n {a.n}, classes {', '.join(names)}", flush=True)
    results = {}
    with tempfile.TemporaryDirectory(prefix="memkern-attack-", dir=a.workdir) as tmp:
        for name in names:
            wd = Path(tmp) / name
            wd.mkdir()
            results[name] = run_class(found[name], seed, a.n, wd)
            print(f"  {name}: {results[name]['cases']} cases in {results[name]['seconds']:.1f} s"
                  + ("  FAIL" if results[name]["failed"] else ""), flush=True)
    print(table(results))
    for name, r in results.items():
        for ex in r["examples"][:6] if r["failed"] else []:
            print(f"  {name}: {ex}")
    if a.out:
        Path(a.out).write_text(json.dumps({"seed": seed, "n": a.n, "results": results}, indent=1))
    return 1 if any(r["failed"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
