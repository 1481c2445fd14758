"""The package's import graph follows its layout by stage.

Every module of ``python/memkern`` (and ``kernels/``, which installs as ``memkern.kernels``) sits
in a row of :data:`ROWS`; a module may import from its own folder and from any row below its own,
never from a row above and never in a circle. The graph is read with :mod:`ast` (module level,
inside functions and under ``TYPE_CHECKING``), so nothing is imported to check it.

:data:`ALLOWED` lists the violations that still exist. It is a ratchet: the test also fails when an
allowed violation is gone, so the list shrinks with the code and never hides a new violation.
"""
from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "python" / "memkern"
KERNELS = REPO / "kernels"

# folder (first component under memkern) or top-level module -> row; higher rows import lower ones
ROWS = {
    "__init__": 12,  # the package's faces: __init__, __main__, ops, graphs (see TOP)
    "cli": 11,
    "server": 10, "eval": 10,
    "distributed": 9, "integrations": 9,
    "loops": 8,
    "data": 7,
    "ingest": 6,
    "store": 5,
    "score": 4,
    "kernels": 3.5,
    "models": 3,
    "text": 2,
    "base": 1, "protocols": 1,
    "errors": 0,
    "_store": -1,  # the compiled native module (csrc/), a leaf
}

# the top row: the lazy top-level names, ``python -m memkern`` and the two re-export modules
TOP = {"memkern", "memkern.__main__", "memkern.ops", "memkern.graphs"}

# Modules that are not in their row's folder yet: module -> the folder (key of ROWS) it moves to.
# Their imports are judged by the row they will have; each is also listed as "unplaced" in ALLOWED.
PENDING: dict[str, str] = {}

# Violations that exist today and are fixed by the redesign, one string each (see violations()).
ALLOWED: set[str] = set()


def module_files(roots=((PKG, "memkern"), (KERNELS, "memkern.kernels"))) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package and of ``kernels/``."""
    out = {}
    for root, prefix in roots:
        for f in sorted(root.rglob("*.py")):
            rel = f.relative_to(root).with_suffix("").parts
            if rel[-1] == "__init__":
                rel = rel[:-1]
            out[".".join((prefix, *rel))] = f
    if (roots[0][0] / "_store.pyi").exists():
        out["memkern._store"] = roots[0][0] / "_store.pyi"
    return out


def _resolve(mod: str, level: int, importer: str, is_pkg: bool) -> str:
    if level == 0:
        return mod
    base = importer.split(".") if is_pkg else importer.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, mod] if mod else base)


def import_graph(files: dict[str, Path] | None = None) -> dict[str, set[str]]:
    """Module -> the memkern modules it imports (``from X import m`` counts ``X.m`` when ``m`` is a
    module, else ``X``)."""
    files = module_files() if files is None else files
    graph: dict[str, set[str]] = {m: set() for m in files}
    for m, f in files.items():
        if f.suffix != ".py":
            continue
        is_pkg = f.name == "__init__.py"
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"), str(f))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                src = _resolve(node.module or "", node.level, m, is_pkg)
                for a in node.names:
                    sub = f"{src}.{a.name}"
                    targets.append(sub if sub in files else src)
            for t in targets:
                while t not in files and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t in files and t != m and t.startswith("memkern"):
                    graph[m].add(t)
    return graph


def folder(mod: str) -> str:
    """The key of :data:`ROWS` a module belongs to (``PENDING`` modules: the one they move to)."""
    if mod in PENDING:
        return PENDING[mod]
    if mod in TOP:
        return "__init__"
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return sorted(out)


def violations() -> set[str]:
    """Every breach of the layout, one string each:

    ``unplaced <module>`` (a module in no row), ``up <a> -> <b>`` (an import into a row that is not
    below ``a``'s, from another folder), ``cycle <a> <b> ...`` (an import circle).
    """
    graph = import_graph()
    out = set()
    for m in graph:
        if folder(m) not in ROWS:
            out.add(f"unplaced {m}")
        elif m in PENDING:
            out.add(f"unplaced {m}")
    for a, targets in graph.items():
        fa = folder(a)
        for b in targets:
            fb = folder(b)
            if fa == fb or fa not in ROWS or fb not in ROWS:
                continue
            if not ROWS[fa] > ROWS[fb]:
                out.add(f"up {a} -> {b}")
    for comp in cycles(graph):
        out.add("cycle " + " ".join(comp))
    return out


def test_the_graph_reader_sees_relative_lazy_and_type_checking_imports(tmp_path):
    pkg = tmp_path / "memkern"
    (pkg / "store").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("")
    (pkg / "protocols.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .store import engine\n")
    (pkg / "store" / "__init__.py").write_text("from .engine import MemoryStore\n")
    (pkg / "store" / "engine.py").write_text("from .. import errors\nfrom ..protocols import X\n"
                                            "def f():\n    import memkern.store\n")
    g = import_graph(module_files([(pkg, "memkern")]))
    assert g["memkern.store"] == {"memkern.store.engine"}
    assert g["memkern.store.engine"] == {"memkern.errors", "memkern.protocols", "memkern.store"}
    assert g["memkern.protocols"] == {"memkern.store.engine"}
    assert cycles(g) == [["memkern.protocols", "memkern.store", "memkern.store.engine"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_every_module_sits_in_a_row():
    graph = import_graph()
    assert "memkern.errors" in graph and "memkern.kernels.rerank" in graph
    missing = [m for m in PENDING if m not in graph]
    assert not missing, f"PENDING names modules that no longer exist: {missing}"
    stale = [m for m, f in PENDING.items() if f not in ROWS]
    assert not stale, f"PENDING names folders that are in no row: {stale}"


def test_imports_point_down_and_never_in_a_circle():
    got = violations()
    new = sorted(got - ALLOWED)
    fixed = sorted(ALLOWED - got)
    assert not new, "layout violations (import only from rows below, no circles):\n" + "\n".join(new)
    assert not fixed, "fixed violations still listed in ALLOWED (remove them):\n" + "\n".join(fixed)


def test_tests_mirror_the_package():
    """Every test file sits in the folder of the stage it tests (``tests/<stage>/``, a folder of
    ``python/memkern``, or ``tests/kernels/``), or in one of the few folders that are not a stage."""
    tests = REPO / "tests"
    stages = {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists()} | {"kernels"}
    other = {"project", "helpers", "fixtures", "cpp", "install"}
    assert not sorted(p.name for p in tests.glob("test_*.py")), "test files at the top of tests/"
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders - stages - other == set(), "test folders that are not a stage of the package"
    for p in tests.rglob("test_*.py"):
        assert p.parent.name in stages | {"project", "install"}, p


def test_the_kernels_folder_never_shadows_a_top_level_kernels_package():
    """``kernels/`` installs as ``memkern.kernels``; with an ``__init__.py`` it would also be a
    regular top-level package ``kernels`` wherever the repository root is on ``sys.path`` (a
    ``python -c`` or a Ray worker started there), hiding transformers' own ``kernels`` dependency.
    Without one it is only a namespace portion, which any installed package of that name beats."""
    import subprocess
    import sys

    assert not (KERNELS / "__init__.py").exists()
    code = ("import importlib.util, json; s = importlib.util.find_spec('kernels'); "
            "print(json.dumps(None if s is None else [s.origin, list(s.submodule_search_locations or [])]))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    import json

    got = json.loads(r.stdout)
    if got is not None and got[0] not in (None, "namespace"):  # a regular package: never the repository's
        assert not str(got[0]).startswith(str(KERNELS)), got
    import memkern
    import memkern.kernels.rerank as rerank

    assert Path(rerank.__file__).resolve().parent in (KERNELS.resolve(), Path(memkern.__file__).resolve().parent / "kernels")
