"""The attack suite, short: every class module in ``bench/attack/`` with a small ``n`` (seconds each).

Targets (every class): 0 non-memkern exceptions, 0 HTTP 500s, 0 hangs, 0 cross-scope reads or
writes, 0 acknowledged writes lost. The seed is fixed so CI is reproducible; set
``MEMKERN_ATTACK_SEED`` to another number (or ``random``) for fresh variants, and run
``bench/attack/run.py`` for the long campaign."""
from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

from attack import run as R  # noqa: E402
from attack.common import COUNTS, FAIL_COUNTS  # noqa: E402

_env = os.environ.get("MEMKERN_ATTACK_SEED", "20261201")
SEED = random.SystemRandom().randrange(2 ** 31) if _env == "random" else int(_env)
N = int(os.environ.get("MEMKERN_ATTACK_N", "25"))
CLASSES = sorted(R.discover())


def test_every_class_module_is_found():
    assert {"imports", "filters", "dates", "ingest", "http", "mcp", "scopes"} <= set(CLASSES)
    found = R.discover()
    assert all(found[c].__name__ == f"attack.{c}" for c in ("http", "mcp"))  # never shadowing the stdlib's


@pytest.mark.slow
@pytest.mark.parametrize("name", CLASSES)
def test_attack_class_short(tmp_path, name):
    res = R.run_class(R.discover()[name], SEED, N, tmp_path)
    assert all(isinstance(res[k], int) for k in COUNTS) and res["cases"] >= N // 2, res
    failed = {k: res[k] for k in FAIL_COUNTS if res[k]}
    assert not failed and not res.get("crashed"), \
        f"attack class {name!r} (seed {SEED}, n {N}): {failed}\n" + "\n".join(res["examples"])


def test_the_runner_reports_failures_and_exits_nonzero(tmp_path, monkeypatch, capsys):
    """A class that reports a failure (or crashes) makes the run fail; the table and JSON say so."""
    import json
    import types

    bad = types.SimpleNamespace(CLASS="broken", campaign=lambda rng, n, wd: {
        "cases": n, "non_memkern_exceptions": 1, "http_500": 0, "hangs": 0, "cross_scope": 0, "lost": 0,
        "examples": ["non_memkern_exceptions: boom"]})
    crash = types.SimpleNamespace(CLASS="crash", campaign=lambda rng, n, wd: 1 / 0)
    good = types.SimpleNamespace(CLASS="fine", campaign=lambda rng, n, wd: {k: 0 for k in COUNTS} | {"cases": n})
    monkeypatch.setattr(R, "discover", lambda: {"broken": bad, "crash": crash, "fine": good})
    out = tmp_path / "r.json"
    assert R.main(["--n", "3", "--seed", "1", "--out", str(out)]) == 1
    text = capsys.readouterr().out
    assert "FAIL" in text and "boom" in text and "ZeroDivisionError" in text
    got = json.loads(out.read_text())
    assert got["seed"] == 1 and got["results"]["fine"]["failed"] is False
    assert got["results"]["broken"]["failed"] and got["results"]["crash"]["failed"]
    assert R.main(["--n", "3", "--seed", "1", "--classes", "fine"]) == 0
    assert R.main(["--classes", "nope"]) == 2
