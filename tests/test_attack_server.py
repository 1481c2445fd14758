"""The server attack classes (``bench/attack/http.py``, ``mcp.py``, ``scopes.py``) with fresh
random variants: ``tests/test_attack_short.py`` runs every class with a fixed seed; here the
server classes run once more with a new seed each time, against real ``memkern serve`` /
``memkern mcp`` processes, every target at 0. The seed is in the failure message (replay it with
``bench/attack/run.py --classes <class> --seed <seed>``)."""
from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("mcp")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from attack import run as R  # noqa: E402
from attack.common import COUNTS, FAIL_COUNTS  # noqa: E402

SERVER_CLASSES = ("http", "mcp", "scopes")


def test_the_runner_finds_the_server_classes():
    found = R.discover()
    assert set(SERVER_CLASSES) <= set(found)
    assert all(found[c].__name__ == f"attack.{c}" for c in SERVER_CLASSES)  # never shadowing http / mcp


@pytest.mark.parametrize("name", SERVER_CLASSES)
def test_server_attack_class_with_a_fresh_seed(tmp_path, name):
    seed = random.SystemRandom().randrange(2 ** 31)
    res = R.run_class(R.discover()[name], seed, 30, tmp_path)
    assert all(isinstance(res[k], int) for k in COUNTS) and res["cases"] == 30, res
    failed = {k: res[k] for k in FAIL_COUNTS if res[k]}
    assert not failed and not res.get("crashed"), \
        f"attack class {name!r} (seed {seed}): {failed}\n" + "\n".join(res["examples"])
