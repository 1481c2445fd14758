#!/usr/bin/env python3
"""Check a built memkern wheel before it is distributed (run by scripts/build_wheel.sh).

- ``--compile-commands FILE``: no compile command of the build targets one CPU (``-march=`` other
  than the x86-64 baseline, ``-mtune=native``, ``-mcpu=``, or an ISA extension flag such as
  ``-mavx2`` / ``-mfma``); the SIMD kernels are selected at run time instead.
- the wheel holds every tracked source file of the packages that ``[tool.scikit-build]
  wheel.packages`` maps (read from pyproject.toml, so moving modules needs no change here), one
  native module, and no stray files (``__pycache__``, ``.pyc``, tests);
- its metadata: the version of ``memkern/base/version.py`` and no torch / transformers / triton among
  the requirements outside an extra;
- ``--manylinux``: the file name carries a ``manylinux`` platform tag.

Exit 1 with one line per problem.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: flags that tie the code to one CPU (the baseline x86-64 target is allowed)
FORBIDDEN = re.compile(r"-march=(?!x86-64$)\S+|-mtune=native|-mcpu=\S+|-m(avx\w*|fma\w*|sse4\S*|ssse3|bmi\w*|f16c|"
                       r"popcnt|lzcnt|movbe|amx\w*)")


def _toml(path: Path) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    return tomllib.loads(path.read_text(encoding="utf-8"))


def check_compile_commands(path: Path) -> list[str]:
    entries = json.loads(path.read_text(encoding="utf-8"))
    if not entries:
        return [f"{path}: no compile commands"]
    bad = []
    for e in entries:
        args = e.get("arguments") or shlex.split(e["command"])
        hits = sorted({a for a in args if FORBIDDEN.fullmatch(a)})
        if hits:
            bad.append(f"{e['file']}: compiled with CPU-specific flags {hits}")
    return bad


def expected_files() -> dict[str, str]:
    """wheel path -> source path of every tracked file in the mapped package folders."""
    wheel = _toml(ROOT / "pyproject.toml")["tool"]["scikit-build"]["wheel"]
    mapping, exclude = wheel["packages"], wheel.get("exclude", [])
    out = {}
    for dest, src in mapping.items():
        files = subprocess.run(["git", "ls-files", "--", src], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout.split()
        for f in files:
            wpath = f"{dest}/{Path(f).relative_to(src).as_posix()}"
            if any(len(d) > len(dest) and wpath.startswith(d + "/") for d in mapping):
                continue  # a folder mapped on its own (memkern/kernels) comes from its own source
            if any(wpath.startswith(p) if p.endswith("/") else fnmatch.fnmatch(wpath, p.replace("**/", "*"))
                   for p in exclude):
                continue  # left out on purpose (wheel.exclude)
            out[wpath] = f
    return out


def check_wheel(wheel: Path, manylinux: bool) -> list[str]:
    bad = []
    m = re.fullmatch(r"memkern-([^-]+)-(cp\d+)-(cp\d+)-(\S+)\.whl", wheel.name)
    if not m:
        return [f"{wheel.name}: not a memkern CPython wheel name"]
    version, _, _, platform = m.groups()
    init = (ROOT / "python/memkern/base/version.py").read_text(encoding="utf-8")
    source_version = re.search(r'^__version__ = "([^"]+)"', init, re.M).group(1)
    if version != source_version:
        bad.append(f"version {version} != memkern.__version__ {source_version}")
    if manylinux and not re.search(r"manylinux_\d+_\d+_x86_64|manylinux\d+_x86_64", platform):
        bad.append(f"platform tag {platform}: expected a manylinux tag")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read(f"memkern-{version}.dist-info/METADATA").decode()
    for want in sorted(set(expected_files()) - names):
        bad.append(f"missing from the wheel: {want}")
    natives = [n for n in names if re.fullmatch(r"memkern/_store\.cpython-\d+-x86_64-linux-gnu\.so", n)]
    if len(natives) != 1:
        bad.append(f"expected one native module memkern/_store*.so, found {natives}")
    stray = sorted(n for n in names if "__pycache__" in n or n.endswith(".pyc") or n.startswith(("tests/", "bench/")))
    bad += [f"stray file in the wheel: {n}" for n in stray]
    core = [line.split(":", 1)[1].strip() for line in meta.splitlines()
            if line.startswith("Requires-Dist:") and "extra ==" not in line]
    heavy = [r for r in core if re.match(r"(torch|transformers|triton)\b", r)]
    if heavy:
        bad.append(f"the base install requires {heavy}: they belong in extras")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel", type=Path)
    ap.add_argument("--compile-commands", type=Path, default=None)
    ap.add_argument("--manylinux", action="store_true", help="require a manylinux platform tag")
    args = ap.parse_args(argv)
    bad = check_wheel(args.wheel, args.manylinux)
    if args.compile_commands is not None:
        bad += check_compile_commands(args.compile_commands)
    for line in bad:
        print(f"check_wheel: {line}", file=sys.stderr)
    if not bad:
        print(f"check_wheel: {args.wheel.name} ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
