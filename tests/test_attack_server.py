"""The short version of the server attack classes (``bench/attack/http.py``, ``mcp.py``,
``scopes.py``): a few dozen fresh random hostile cases each against a real ``memkern serve`` /
``memkern mcp`` process, every target at 0. The seed is in the failure message (rerun one with
``bench/attack/<class>.py``'s ``campaign(random.Random(seed), n, workdir)``)."""
from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("mcp")

ATTACK = Path(__file__).resolve().parents[1] / "bench" / "attack"
TARGETS = ("non_memkern_exceptions", "http_500", "hangs", "cross_scope", "lost")


def _load(name: str):
    # by path, under a unique name: "http" / "mcp" on sys.path would shadow the stdlib and the mcp package
    spec = importlib.util.spec_from_file_location(f"memkern_attack_{name}", ATTACK / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("attack")  # shared: the tiny chat model is built once


@pytest.mark.parametrize("name, n", [("http", 40), ("mcp", 40), ("scopes", 40)])
def test_attack_class_meets_every_target(workdir, name, n):
    mod = _load(name)
    assert mod.CLASS == name
    seed = random.SystemRandom().randrange(1 << 32)
    out = mod.campaign(random.Random(seed), n, workdir / name)
    assert set(out) == {"cases", *TARGETS, "examples"}
    assert out["cases"] == n
    assert all(out[k] == 0 for k in TARGETS), (f"seed {seed}", out)
