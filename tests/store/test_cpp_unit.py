"""Builds and runs the C++ unit tests (``tests/cpp``: log codec, record encoding, CRC-32, log file
torn/damaged detection, snapshot round trips) through ctest, so the README's test command runs them.

The CMake project is configured once into ``build/cpp-tests`` with ``MEMKERN_BUILD_TESTS=ON``,
``MEMKERN_BUILD_MODULE=OFF`` (no Python needed by the tests), a Debug build with AddressSanitizer +
UBSan, and the venv's cmake and ninja; later runs rebuild incrementally (a few seconds when
nothing changed). The hnswlib headers are found by ``cmake/HnswlibHeaders.cmake`` as for the module
(the copy the module's build already fetched is reused when there is one).
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / "cpp-tests"
SUITES = ("crc32", "record", "log_codec", "wal", "snapshot", "store_memory")  # tests/cpp/CMakeLists.txt


def _tool(name: str) -> str:
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        pytest.fail(f"{name} not found (next to {sys.executable} or on PATH): run ./scripts/setup.sh")
    return found


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL=os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2"))
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def _configure(cmake: str, ninja: str) -> None:
    if (BUILD / "CMakeCache.txt").exists() and (BUILD / "build.ninja").exists():
        return  # configured before; the build step re-runs CMake itself when CMakeLists change
    args = [cmake, "-S", str(ROOT), "-B", str(BUILD), "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}",
            "-DCMAKE_BUILD_TYPE=Debug", "-DMEMKERN_BUILD_MODULE=OFF", "-DMEMKERN_BUILD_TESTS=ON",
            "-DMEMKERN_SANITIZE=ON", f"-DPython_EXECUTABLE={sys.executable}"]
    fetched = sorted(glob.glob(str(ROOT / "build" / "*" / "_hnswlib" / "hnswlib-*" / "hnswlib" / "hnswlib.h")))
    fetched = [f for f in fetched if "cpp-tests" not in f]
    if fetched:
        args.append(f"-DHNSWLIB_INCLUDE_DIR={Path(fetched[-1]).parents[1]}")
    proc = _run(args, timeout=300)
    assert proc.returncode == 0, f"cmake configure failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


@pytest.mark.slow
def test_cpp_unit_tests_pass_under_ctest():
    cmake, ninja, ctest = _tool("cmake"), _tool("ninja"), _tool("ctest")
    _configure(cmake, ninja)
    build = _run([cmake, "--build", str(BUILD)], timeout=600)
    assert build.returncode == 0, f"C++ unit tests did not build:\n{build.stdout[-4000:]}\n{build.stderr[-2000:]}"
    proc = _run([ctest, "--test-dir", str(BUILD), "--output-on-failure", "--timeout", "120"], timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"ctest failed:\n{out[-6000:]}"
    m = re.search(r"100% tests passed(?:, 0 tests failed)? out of (\d+)", out)  # ctest's summary (both wordings)
    assert m and int(m.group(1)) == len(SUITES), out[-3000:]
    for suite in SUITES:
        assert re.search(rf"Test\s+#\d+: {suite} \.+\s+Passed", out), (suite, out[-3000:])
