"""``bench/mutation.py``: a test run past its timeout is its own outcome (never counted as killed),
and the outcome cache is keyed so that a campaign can be run in pieces without reusing an outcome
whose source or tests changed."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def mutation(monkeypatch):
    monkeypatch.setattr(sys, "path", [str(BENCH), *sys.path])
    spec = importlib.util.spec_from_file_location("mutation_under_test", BENCH / "mutation.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)       # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _mutant(mod, tests, file="python/pkg/x.py", find="X = 1", replace="X = 2"):
    return mod.Mutant("m1", "area", file, find, replace, "what", tuple(tests))


@pytest.mark.slow
@pytest.mark.parametrize("fork", [False, True], ids=["subprocess", "fork"])
def test_timeout_is_its_own_outcome_and_not_killed(mutation, tmp_path, fork, monkeypatch):
    monkeypatch.setattr(mutation, "ROOT", tmp_path)       # the forked run's log goes under it
    slow = tmp_path / "test_slow.py"
    slow.write_text("import time\n\ndef test_slow():\n    time.sleep(60)\n")
    status, detail = mutation._run_tests(_mutant(mutation, [str(slow)]), timeout=1.0, fork=fork)
    assert status == "timeout" and "timeout" in detail
    quick = tmp_path / "test_quick.py"
    quick.write_text("def test_ok():\n    pass\n\ndef test_bad():\n    assert False\n")
    assert mutation._run_tests(_mutant(mutation, [f"{quick}::test_ok"]), timeout=60, fork=fork)[0] == "survived"
    assert mutation._run_tests(_mutant(mutation, [f"{quick}::test_bad"]), timeout=60, fork=fork)[0] == "killed"

    m = _mutant(mutation, ["tests/test_a.py"])
    text = mutation.report([mutation.Outcome(m, "killed", 1.0), mutation.Outcome(m, "timeout", 2.0, detail)])
    assert "killed 1; survived 0; timed out 1;" in text
    assert "**Score: 1/2 = 50.0% killed**" in text      # the timeout is in the denominator
    assert f"- `m1`: timeout. {detail}" in text


def _repo(root: Path) -> None:
    (root / "python" / "pkg").mkdir(parents=True)
    (root / "python" / "pkg" / "x.py").write_text("X = 1\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_x.py").write_text(
        "import sys\nsys.path.insert(0, 'python')\nfrom pkg.x import X\n\ndef test_x():\n    assert X == 1\n")
    (root / "tests" / "test_other.py").write_text("def test_other():\n    pass\n")
    for cmd in (["init", "-q"], ["add", "-A"],
                ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "init"]):
        subprocess.run(["git", *cmd], cwd=root, check=True, capture_output=True)


def _fake_pytest(mutation, root, monkeypatch):
    """Stand-in for the pytest run (saves a subprocess per mutant): killed when the mutated file
    is on disk while its test file still checks ``X == 1``."""
    def run_tests(m, timeout, fork=False):
        mutated = (root / m.file).read_text() != "X = 1\n"
        checks = "X == 1" in (root / m.tests[0]).read_text()
        return ("killed" if mutated and checks else "survived"), "fake"
    monkeypatch.setattr(mutation, "ROOT", root)
    monkeypatch.setattr(mutation, "CACHE", root / "cache.json")
    monkeypatch.setattr(mutation, "_installed_module", lambda: None)
    monkeypatch.setattr(mutation, "_run_tests", run_tests)


def test_cache_reuses_outcomes_and_invalidates_on_changed_tests_or_source(mutation, tmp_path, monkeypatch):
    root = tmp_path / "repo"
    root.mkdir()
    _repo(root)
    _fake_pytest(mutation, root, monkeypatch)
    m = _mutant(mutation, ["tests/test_x.py"])

    first = mutation.run([m], timeout=120, check_only=False, use_cache=True)
    assert [(o.status, o.cached) for o in first] == [("killed", False)]
    assert (root / "python" / "pkg" / "x.py").read_text() == "X = 1\n"       # restored
    import json
    assert json.loads((root / "cache.json").read_text())["baseline: tests/test_x.py"]["status"] == "survived"
    again = mutation.run([m], timeout=120, check_only=False, use_cache=True)
    assert [(o.status, o.cached) for o in again] == [("killed", True)]

    # another test file changes: the key holds; the mutant's own test file changes: it is rerun
    (root / "tests" / "test_other.py").write_text("def test_other():\n    assert True\n")
    assert mutation.run([m], timeout=120, check_only=False, use_cache=True)[0].cached
    (root / "tests" / "test_x.py").write_text("def test_x():\n    pass\n")
    o = mutation.run([m], timeout=120, check_only=False, use_cache=True)[0]
    assert (o.status, o.cached) == ("survived", False)

    # an uncommitted source change refuses the cache; once committed, every outcome is rerun
    (root / "python" / "pkg" / "y.py").write_text("Y = 1\n")
    with pytest.raises(SystemExit, match="uncommitted"):
        mutation.run([m], timeout=120, check_only=False, use_cache=True)
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "y"],
                   cwd=root, check=True)
    assert not mutation.run([m], timeout=120, check_only=False, use_cache=True)[0].cached


def test_budget_leaves_mutants_for_the_next_run(mutation, tmp_path, monkeypatch):
    root = tmp_path / "repo"
    root.mkdir()
    _repo(root)
    _fake_pytest(mutation, root, monkeypatch)
    a = _mutant(mutation, ["tests/test_x.py"])
    b = mutation.Mutant("m2", "area", "python/pkg/x.py", "X = 1", "X = 3", "what", ("tests/test_x.py",))
    first = mutation.run([a, b], timeout=120, check_only=False, use_cache=True, budget=1e-9)
    assert [o.mutant.id for o in first] == ["m1"]           # the first always starts
    second = mutation.run([a, b], timeout=120, check_only=False, use_cache=True, budget=1e-9)
    assert [(o.mutant.id, o.cached) for o in second] == [("m1", True), ("m2", False)]


def test_failing_baseline_is_an_error_not_a_kill(mutation, tmp_path, monkeypatch):
    root = tmp_path / "repo"
    root.mkdir()
    _repo(root)
    _fake_pytest(mutation, root, monkeypatch)
    (root / "tests" / "test_x.py").write_text("def test_x():\n    assert X == 1\n")  # NameError: X == 1 fails
    monkeypatch.setattr(mutation, "_run_tests", lambda m, timeout, fork=False: ("killed", "1 failed"))
    (o,) = mutation.run([_mutant(mutation, ["tests/test_x.py"])], timeout=120, check_only=False)
    assert o.status == "error" and "unmutated tests do not pass" in o.detail
