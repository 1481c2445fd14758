#!/usr/bin/env python3
"""Move memkern's modules into the layout by stage and rewrite every reference to them.

Commands (run from anywhere; they act on the repository that holds this script)::

    relayout.py move STEP [--take-old]   git mv the files of STEP (a..g, m or all), write its faces, rewrite
    relayout.py rewrite                  rewrite imports, dotted names and file paths everywhere
    relayout.py verify                   check that every memkern import in the tree resolves
    relayout.py mutants                  rewrite the file paths of bench/mutants.py
    relayout.py resolve                  after a merge with conflicts: take the other side of every
                                         conflicted file whose side here only rewrote paths
    relayout.py map                      print the module map (old -> new)

After merging code written against the old paths (``git merge main`` into this branch)::

    relayout.py resolve          # conflicts where this side only rewrote imports: the other side wins
    relayout.py move all         # files that landed in moved folders or at old paths
    relayout.py rewrite          # their imports, dotted names and paths
    relayout.py verify           # every import resolves
    bench/mutation.py --check    # mutants whose snippet moved or was edited here

``rewrite`` and ``verify`` are idempotent and read the tree as it is: after merging code written
against the old paths, ``relayout.py move all && relayout.py rewrite && relayout.py verify`` moves
files that landed in moved folders and fixes their imports. ``move`` leaves a file alone when both
its old and new path exist (it says so); ``--take-old`` then replaces the new file by the old one.

How imports are rewritten (with :mod:`ast`-located spans, the rest of each line kept):

* a module of :data:`MOVES` is replaced by its new module, relative inside the package when the
  statement was relative; a relative import that no longer resolves from the file's new place is
  read from its old place (a file moved with its folder, or merged in afterwards);
* ``from face import name`` (a module of :data:`FACES`, kept at its old path as a re-export) is
  routed, inside the package, to the module the face takes ``name`` from; outside the package a
  name the face exports is left as it is;
* a statement whose names now live in several modules is split into one statement per module.

Dotted names ``memkern.<old>`` in strings, comments and ``.md`` files follow :data:`TEXT_MAP`,
except the span names given to ``traced(...)`` / ``span(...)`` and span attribute keys read as
``attributes["memkern...."]`` (documented telemetry names).
"""
from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "python" / "memkern"
PKG_REL = "python/memkern"

# step -> [(old path, new path)] relative to python/memkern; a path ending in "/" moves a folder
MOVES: dict[str, list[tuple[str, str]]] = {
    "a": [("validate.py", "base/validate.py"), ("atomic.py", "base/atomic.py"), ("paths.py", "base/paths.py"),
          ("telemetry.py", "base/telemetry.py"), ("turns.py", "base/turns.py")],
    "b": [("template.py", "text/template.py"), ("contradict.py", "text/contradict.py"),
          ("jsonrepair.py", "text/jsonrepair.py"), ("timeexpr.py", "text/time/parse.py")],
    "c": [("ops.py", "score/ops/autograd.py"), ("reranker.py", "score/reranker.py"),
          ("trainer.py", "score/trainer.py"), ("graphs.py", "score/graphs.py"),
          ("_reference.py", "score/reference.py")],
    "d": [("store.py", "store/engine.py"), ("inmemory.py", "store/memory.py"), ("aio.py", "store/aio.py"),
          ("bank.py", "store/bank.py"), ("lexical.py", "store/reference.py"),
          ("transfer.py", "store/transfer/install.py")],
    "e": [("extract.py", "ingest/extract/__init__.py"), ("update.py", "ingest/apply.py"),
          ("prompts/rmm.py", "ingest/prompts.py")],
    "f": [("rmm/", "loops/rmm/"), ("memreread.py", "loops/memreread/loop.py"),
          ("prompts/memreread.py", "loops/memreread/prompts.py"), ("prompts/__init__.py", None)],
    "g": [("cli.py", "cli/main.py"), ("commands/_common.py", "cli/common.py"), ("commands/__init__.py", None),
          ("commands/", "cli/")],
    # models/lookup.py split by job: the paths (a leaf) keep its history; two functions that convert the
    # GGUF move into gguf.py, the set-up that loads both models into setup.py (NAME_MAP)
    "m": [("models/lookup.py", "models/paths.py")],
}

# folders created by a step: path -> docstring of its __init__.py (only written when missing)
FOLDERS = {
    "a": {"base": "What every stage stands on: argument checks and bounds, the one durable file write, where "
                  "files live, tracing, turn identity and the version."},
    "b": {"text": "Reading text without a model: the turn template, time expressions, first-person slot "
                  "statements and the JSON that models emit."},
    "c": {"score": "Data is scored: the functional ops and their backend choice, the learned reranker, its "
                   "trainer, CUDA graphs and the float64 references."},
    "d": {},
    "e": {"ingest": "Data enters: a session's turns become topics (``extract``), each topic is decided "
                    "against the memories it resembles (ADD / MERGE / UPDATE / INVALIDATE / NOOP) and written "
                    "into a store (``apply``), with the prompts that step sends (``prompts``)."},
    "f": {"loops": "The loops that use memory: RMM (reflect, retrieve, respond, learn) and MemReread."},
    "g": {},
    "m": {},
}

# re-export modules at a public path: face module -> (module the names come from, docstring, extra names)
FACES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "memkern.text.time": ("memkern.text.time.parse", "Time expressions: reading dates and spans in text, and "
                          "the time prior that rescores memories by when they happened.", ()),
    "memkern.ops": ("memkern.score.ops.functional", "The reranker's functional ops (``memkern.ops``): see "
                    ":mod:`memkern.score.ops`.", ()),
    "memkern.score.ops": ("memkern.score.ops.functional", "The reranker's functional ops: scores, Gumbel top-m "
                          "selection, the REINFORCE gradient and the fused step, each on the best backend.", ()),
    "memkern.graphs": ("memkern.score.graphs", "CUDA graphs of the reranker step (``memkern.graphs``): see "
                       ":mod:`memkern.score.graphs`.", ("WARMUP",)),
    "memkern.store": ("memkern.store.engine", "Data is stored: the native store's front end (``MemoryStore``), "
                      "records, the in-memory store, the async front end, the memory bank, export / import and "
                      "the BM25 reference.",
                      ("DEFAULT_EF_SEARCH", "MAX_K", "MAX_EF", "MAX_CANDIDATES", "MAX_RESULTS", "MAX_NORM",
                       "MAX_ALPHA", "MAX_FILTER_KEYS", "MAX_FILTER_VALUES", "MAX_FILTER_STR", "MAX_QUERY_TEXT",
                       "DEFAULT_RECENCY_WEIGHT", "turns_with_topics")),
    "memkern.store.transfer": ("memkern.store.transfer.install", "Export and import of a store: the JSONL "
                               "format, its checks and the atomic install.", ()),
    "memkern.loops.memreread": ("memkern.loops.memreread.loop", "MemReread: answer a question over a long "
                                "text by reading it in chunks into a bounded memory, rereading what is missing.",
                                ()),
    "memkern.cli": ("memkern.cli.main", "The ``memkern`` command: ``main.py`` parses, one module per command, "
                    "``common.py`` holds the shared options.", ("main",)),
}
# the step that writes each face
FACE_STEP = {"memkern.text.time": "b", "memkern.ops": "c", "memkern.score.ops": "c", "memkern.graphs": "c",
             "memkern.store": "d", "memkern.store.transfer": "d", "memkern.loops.memreread": "f",
             "memkern.cli": "g"}
# extra names a face takes from another module: face -> {name: module}
_OPS_EXTRA = {"RerankScores": "memkern.score.ops.autograd", "resolve_backend": "memkern.score.ops.backend",
              "philox_uniform": "memkern.score.ops.philox",
              **{n: "memkern.score.ops.results" for n in ("GumbelTopM", "ReinforceGrad", "RerankForward", "RerankStep")}}
FACE_EXTRA = {"memkern.store": {"InMemoryStore": "memkern.store.memory"}, "memkern.ops": _OPS_EXTRA,
              "memkern.score.ops": _OPS_EXTRA}

# (old module, name) -> new module, for names that move on their own (inside the package only)
NAME_MAP = {("memkern", "__version__"): "memkern.base.version",
            ("memkern.models.lookup", "default_chat_model_path"): "memkern.models.gguf",
            ("memkern.models.lookup", "default_tokenizer_path"): "memkern.models.gguf",
            ("memkern.models.lookup", "setup_default_models"): "memkern.models.setup",
            ("memkern.models.lookup", "list_models"): "memkern.models.setup"}
NEW_FILES = {"a": {"base/version.py": '"""The package version (read by the build from this file)."""\n\n'
                                      '__version__ = "0.1.0"\n'}}

# dotted names in text whose public path differs from the module the code moved to
TEXT_OVERRIDE = {"memkern.timeexpr": "memkern.text.time", "memkern.transfer": "memkern.store.transfer",
                 "memkern.memreread": "memkern.loops.memreread", "memkern.prompts": "memkern.ingest.prompts",
                 "memkern.update": "memkern.ingest.apply", "memkern.cli": None, "memkern.ops": None,
                 "memkern.graphs": None, "memkern.store": None}

SCAN_DIRS = ("python", "kernels", "tests", "bench", "scripts", "docs", ".ci")
SKIP = {"scripts/relayout.py", "tests/project/test_public_api.py", "tests/project/test_layout.py", "tests/project/test_relayout.py", "CHANGELOG.md"}
TEXT_ROOT_FILES = ("README.md", "pyproject.toml", "DEVELOPERS.md", "conftest.py")


def _dotted(path: str) -> str:
    p = path[:-3] if path.endswith(".py") else path.rstrip("/")
    parts = p.split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["memkern", *parts])


def module_map() -> dict[str, str]:
    """Old dotted module (or folder prefix) -> new dotted module, for every step."""
    out = {}
    for moves in MOVES.values():
        for old, new in moves:
            if new is not None:
                out[_dotted(old)] = _dotted(new)
    return out


MODULE_MAP = module_map()
TEXT_MAP = {k: TEXT_OVERRIDE.get(k, v) for k, v in MODULE_MAP.items()}
TEXT_MAP = {k: v for k, v in TEXT_MAP.items() if v is not None}
TEXT_MAP["memkern.prompts"] = TEXT_OVERRIDE["memkern.prompts"]
PATH_MAP = {f"{PKG_REL}/{old}": f"{PKG_REL}/{new}" for moves in MOVES.values() for old, new in moves if new}


def map_module(mod: str) -> str | None:
    """The new name of an old module (longest prefix of MODULE_MAP), or None when it did not move."""
    parts = mod.split(".")
    for i in range(len(parts), 1, -1):
        head = ".".join(parts[:i])
        if head in MODULE_MAP:
            return ".".join([MODULE_MAP[head], *parts[i:]])
    return None


def unmap_module(mod: str) -> str | None:
    """The old name of a moved module, or None."""
    parts = mod.split(".")
    inverse = {v: k for k, v in MODULE_MAP.items()}
    for i in range(len(parts), 1, -1):
        head = ".".join(parts[:i])
        if head in inverse:
            return ".".join([inverse[head], *parts[i:]])
    return None


# ------------------------------------------------------------------------------------------------ tree
class Tree:
    """The package's modules as they are on disk: dotted name -> file, and their top-level names."""

    def __init__(self) -> None:
        self.files: dict[str, Path] = {}
        for f in sorted(PKG.rglob("*.py")):
            rel = f.relative_to(PKG).with_suffix("").parts
            if rel[-1] == "__init__":
                rel = rel[:-1]
            self.files[".".join(("memkern", *rel))] = f
        for f in sorted((REPO / "kernels").glob("*.py")):
            name = "memkern.kernels" if f.stem == "__init__" else f"memkern.kernels.{f.stem}"
            self.files[name] = f
        self.native = {"memkern._store"} if any(PKG.glob("_store*")) else set()
        # kernels/ without an __init__.py installs as the namespace package memkern.kernels
        self.namespaces = {"memkern.kernels"} if (REPO / "kernels").is_dir() and "memkern.kernels" not in self.files else set()
        self._names: dict[str, tuple[set[str], bool]] = {}

    def is_module(self, mod: str) -> bool:
        return mod in self.files or mod in self.native or mod in self.namespaces

    def is_package(self, mod: str) -> bool:
        f = self.files.get(mod)
        return mod in self.namespaces or (f is not None and f.name == "__init__.py")

    def names(self, mod: str) -> tuple[set[str], bool]:
        """Top-level names a module binds, and whether it may bind more (``__getattr__``, ``*``)."""
        if mod in self._names:
            return self._names[mod]
        if mod not in self.files:
            return set(), True
        try:
            tree = ast.parse(self.files[mod].read_text(encoding="utf-8"))
        except SyntaxError:  # a file with merge conflict markers: assume it binds what is asked
            return set(), True
        names: set[str] = set()
        more = False

        def visit(body):
            nonlocal more
            for n in body:
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(n.name)
                    more |= n.name == "__getattr__"
                elif isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                        for e in ast.walk(t):
                            if isinstance(e, ast.Name):
                                names.add(e.id)
                elif isinstance(n, ast.Import):
                    names.update((a.asname or a.name).split(".")[0] for a in n.names)
                elif isinstance(n, ast.ImportFrom):
                    for a in n.names:
                        if a.name == "*":
                            more = True
                        names.add(a.asname or a.name)
                elif isinstance(n, (ast.If, ast.Try, ast.With)):
                    visit(n.body)
                    visit(getattr(n, "orelse", []))
                    for h in getattr(n, "handlers", []):
                        visit(h.body)
                    visit(getattr(n, "finalbody", []))
        visit(tree.body)
        self._names[mod] = (names, more)
        return names, more

    def defines(self, mod: str, name: str) -> bool:
        if self.is_module(f"{mod}.{name}"):
            return True
        if mod in self.native:
            return True
        names, more = self.names(mod)
        return name in names or more

    def face_source(self, face: str, name: str) -> str | None:
        """The module a face takes ``name`` from (per its own ``from X import`` statements)."""
        if face not in self.files:
            return None
        tree = ast.parse(self.files[face].read_text(encoding="utf-8"))
        for n in tree.body:
            if isinstance(n, ast.ImportFrom) and any((a.asname or a.name) == name for a in n.names):
                return resolve(n.module or "", n.level, face, True if self.is_package(face) else False)
        return None


def module_of(path: Path) -> str | None:
    try:
        rel = path.relative_to(PKG)
    except ValueError:
        if path.parent == REPO / "kernels":
            return "memkern.kernels" if path.stem == "__init__" else f"memkern.kernels.{path.stem}"
        return None
    parts = rel.with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(("memkern", *parts))


def resolve(mod: str, level: int, importer: str, is_pkg: bool) -> str:
    if level == 0:
        return mod
    base = importer.split(".") if is_pkg else importer.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, mod] if mod else base)


def relative(target: str, importer: str, is_pkg: bool) -> tuple[int, str]:
    """``(level, module)`` of a relative import of ``target`` from ``importer``."""
    pkg = importer.split(".") if is_pkg else importer.split(".")[:-1]
    tgt = target.split(".")
    c = 0
    while c < min(len(pkg), len(tgt)) and pkg[c] == tgt[c]:
        c += 1
    return len(pkg) - c + 1, ".".join(tgt[c:])


# ------------------------------------------------------------------------------------------------ rewrite
def _line_offsets(text: str) -> list[int]:
    offs = [0]
    for line in text.splitlines(keepends=True):
        offs.append(offs[-1] + len(line))
    return offs


def _new_target(tree: Tree, src: str, name: str | None, inside: bool, importer: str | None) -> str:
    """Where ``from src import name`` (``name`` None: ``*``) should point now; ``"SUB:<module>"`` when
    ``name`` is a submodule that moved (imported from its new parent)."""
    if (inside or src != "memkern") and name is not None and (src, name) in NAME_MAP \
            and importer != NAME_MAP[(src, name)] and tree.is_module(NAME_MAP[(src, name)]):
        return NAME_MAP[(src, name)]
    if name is not None:
        sub = f"{src}.{name}"
        if tree.is_module(sub):
            real = FACES[sub][0] if sub in FACES else ""
            shadowed = real.rsplit(".", 1)[-1] in tree.names(sub)[0] if real.startswith(sub + ".") else False
            if sub in FACES and tree.is_module(real) and importer != "memkern" and not shadowed \
                    and not _face_part(importer, sub):
                return "SUB:" + real  # a face imported as a module object: the real module
            return src
        moved = map_module(f"{src}.{name}")
        if moved is not None and tree.is_module(moved):
            return "SUB:" + moved
    if src in FACES and tree.is_module(FACES[src][0]) and name is not None and not _face_part(importer, src):
        if inside or not tree.defines(src, name):
            return tree.face_source(src, name) or FACE_EXTRA.get(src, {}).get(name) or FACES[src][0]
        return src
    if tree.is_module(src) and (name is None or tree.defines(src, name)):
        return src
    new = map_module(src)
    if new is not None and new != src and tree.is_module(new):
        return _new_target(tree, new, name, inside, importer)
    return src


def _face_part(importer: str | None, face: str) -> bool:
    """A face's own module, and the module it re-exports, never route through the face."""
    return importer is not None and importer in (face, FACES[face][0])


def rewrite_imports(path: Path, text: str, tree: Tree) -> str:
    importer = module_of(path)
    inside = importer is not None
    is_pkg = path.name == "__init__.py"
    old_importer = unmap_module(importer) if importer else None
    old_is_pkg = _old_is_package(path, is_pkg)
    try:
        parsed = ast.parse(text)
    except SyntaxError:
        return text
    offs = _line_offsets(text)
    edits: list[tuple[int, int, str]] = []
    for node in ast.walk(parsed):
        if isinstance(node, ast.ImportFrom):
            edit = _rewrite_from(node, text, offs, tree, importer, old_importer, is_pkg, inside, old_is_pkg)
        elif isinstance(node, ast.Import):
            edit = _rewrite_import(node, text, offs, tree)
        else:
            continue
        if edit is not None:
            edits.append(edit)
    edits += _rewrite_code_strings(parsed, text, offs, tree)
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    return text


def _rewrite_code_strings(parsed, text, offs, tree):
    """Imports inside string constants that hold Python code (``python -c`` scripts in tests): each
    line of a string that is one import statement is rewritten as code outside the package, in
    place (a statement that splits becomes ``a; b`` on its line)."""
    edits = []
    for node in ast.walk(parsed):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str) and "import" in node.value
                and "memkern" in node.value):
            continue
        start, end = _span(node, offs, text)
        seg = text[start:end]
        changed = False
        for line in {x.strip() for x in node.value.splitlines()}:
            if "memkern" not in line or not line.startswith(("from ", "import ")):
                continue
            try:
                stmt = ast.parse(line).body
            except SyntaxError:
                continue
            if len(stmt) != 1 or not isinstance(stmt[0], (ast.Import, ast.ImportFrom)):
                continue
            new = "; ".join(x.strip() for x in rewrite_imports(REPO / "string.py", line, tree).splitlines())
            if new != line and line in seg:
                seg = re.sub(r"(?:(?<![\w.])|(?<=\\n))" + re.escape(line) + r"(?![\w.])", lambda m: new, seg)
                changed = True
        if changed:
            edits.append((start, end, seg))
    return edits


def _span(node, offs, text):
    def at(line: int, col: int) -> int:
        start = offs[line - 1]
        raw = text[start:offs[line]].encode("utf-8")[:col]
        return start + len(raw.decode("utf-8", errors="ignore"))
    return at(node.lineno, node.col_offset), at(node.end_lineno, node.end_col_offset)


def _rewrite_import(node: ast.Import, text, offs, tree):
    changed = False
    parts = []
    for a in node.names:
        name = a.name
        if name.startswith("memkern.") and not tree.is_module(name):
            new = map_module(name)
            if new is not None:
                name, changed = new, True
        if a.asname and name in FACES and tree.is_module(FACES[name][0]):
            name, changed = FACES[name][0], True
        parts.append(name + (f" as {a.asname}" if a.asname else ""))
    if not changed:
        return None
    start, end = _span(node, offs, text)
    return start, end, "import " + ", ".join(parts)


def _old_is_package(path: Path, is_pkg: bool) -> bool:
    """Whether the file was a package's ``__init__`` at its old place (a module can become one)."""
    try:
        rel = path.relative_to(PKG).as_posix()
    except ValueError:
        return is_pkg
    for moves in MOVES.values():
        for old, new in moves:
            if new is not None and not new.endswith("/") and rel == new:
                return old.endswith("__init__.py")
    return is_pkg


def _rewrite_from(node: ast.ImportFrom, text, offs, tree, importer, old_importer, is_pkg, inside,
                  old_is_pkg=None):
    if node.level == 0 and not (node.module or "").startswith("memkern") or node.module == "__future__":
        return None
    if node.level and importer is None:
        return None
    src = resolve(node.module or "", node.level, importer, is_pkg) if node.level else node.module
    if node.level and old_importer is not None:
        ok = tree.is_module(src) and all(tree.defines(src, a.name) or a.name == "*" for a in node.names)
        if not ok:
            src = resolve(node.module or "", node.level, old_importer, is_pkg if old_is_pkg is None else old_is_pkg)
    if not src.startswith("memkern"):
        return None
    groups: dict[str, list[str]] = {}
    order = []
    for a in node.names:
        if a.name == "*":
            tgt = _new_target(tree, src, None, inside, importer)
            alias = "*"
        else:
            tgt = _new_target(tree, src, a.name, inside, importer)
            alias = a.name + (f" as {a.asname}" if a.asname else "")
            if tgt.startswith("SUB:"):
                new_mod = tgt[4:]
                parent, leaf = new_mod.rsplit(".", 1)
                tgt = parent
                local = a.asname or a.name
                alias = leaf if leaf == local else f"{leaf} as {local}"
        if tgt not in groups:
            groups[tgt] = []
            order.append(tgt)
        groups[tgt].append(alias)
    if order == [src] and not node.level:
        return None

    def spell(mod: str) -> str:
        if node.level:
            level, rest = relative(mod, importer, is_pkg)
            return "." * level + rest
        return mod

    if len(order) == 1:
        new_mod = spell(order[0])
        seg_start, seg_end = _span(node, offs, text)
        seg = text[seg_start:seg_end]
        m = re.match(r"from\s+([.\w]+)\s+import\s+", seg)
        if m is None:
            return None
        head = "." * node.level + (node.module or "")
        names_now = [a.name + (f" as {a.asname}" if a.asname else "") for a in node.names]
        if groups[order[0]] == names_now:
            if new_mod == head:
                return None
            return seg_start + m.start(1), seg_start + m.end(1), new_mod
        return seg_start, seg_end, _fmt_from(new_mod, groups[order[0]], node.col_offset)
    seg_start, seg_end = _span(node, offs, text)
    indent = " " * node.col_offset
    lines = [_fmt_from(spell(t), groups[t], node.col_offset) for t in order]
    return seg_start, seg_end, ("\n" + indent).join(lines)


def _fmt_from(mod: str, names: list[str], col: int, width: int = 110) -> str:
    """``from mod import names``, wrapped in parentheses past ``width`` characters."""
    one = f"from {mod} import {', '.join(names)}"
    if col + len(one) <= width or names == ["*"]:
        return one
    lines, cur = [], ""
    pad = " " * (col + 4)
    for n in names:
        piece = f"{n}, "
        if cur and len(pad) + len(cur) + len(piece) > width:
            lines.append(pad + cur.rstrip())
            cur = ""
        cur += piece
    lines.append(pad + cur.rstrip().rstrip(",") + ",")
    return f"from {mod} import (\n" + "\n".join(lines) + "\n" + " " * col + ")"


_DOTTED = re.compile(r"(?<![\w.])memkern(?:\.\w+)+")
_SPAN = re.compile(r"""(?:traced\(|span\(|attributes\[)\s*["'](memkern\.[\w.]+)["']""")
_PATH = re.compile(r"python/memkern/[\w/]+(?:\.py)?/?")


def span_names(files) -> set[str]:
    out = set()
    for f in files:
        if f.suffix == ".py":
            out.update(_SPAN.findall(f.read_text(encoding="utf-8")))
    return out


def rewrite_text(text: str, protected: set[str], tree: Tree) -> str:
    """Dotted names and file paths of modules that have moved (old gone, new present)."""
    def dotted(m: re.Match) -> str:
        s = m.group(0)
        if s in protected:
            return s
        parts = s.split(".")
        for i in range(len(parts), 1, -1):
            head = ".".join(parts[:i])
            if head in TEXT_MAP:
                if tree.is_module(head) or not tree.is_module(MODULE_MAP.get(head, TEXT_MAP[head])):
                    return s
                return ".".join([TEXT_MAP[head], *parts[i:]])
            if head in TEXT_OVERRIDE and TEXT_OVERRIDE[head] is None:
                return s
        return s

    def path(m: re.Match) -> str:
        s = m.group(0)
        for old in sorted(PATH_MAP, key=len, reverse=True):
            if not (s == old or old.endswith("/") and s.startswith(old)):
                continue
            if (REPO / old).exists() and not old.endswith("/") and not _is_face(REPO / old) \
                    or not (REPO / PATH_MAP[old]).exists():
                return s
            if old.endswith("/") and (REPO / old).is_dir() and any((REPO / old).glob("*.py")):
                return s
            return PATH_MAP[old] + s[len(old):]
        return s

    return _PATH.sub(path, _DOTTED.sub(dotted, text))


def scan_files() -> list[Path]:
    out = []
    for d in SCAN_DIRS:
        root = REPO / d
        if not root.exists():
            continue
        for f in sorted(root.rglob("*")):
            rel = f.relative_to(REPO).as_posix()
            if f.is_file() and f.suffix in (".py", ".pyi", ".md", ".toml", ".txt", ".sh") and \
                    not rel.startswith("tests/fixtures/") and "__pycache__" not in f.parts:
                out.append(f)
    out += [REPO / f for f in TEXT_ROOT_FILES if (REPO / f).exists()]
    return [f for f in out if f.relative_to(REPO).as_posix() not in SKIP]


def cmd_rewrite() -> int:
    tree = Tree()
    files = scan_files()
    protected = span_names(files)
    changed = 0
    for f in files:
        text = f.read_text(encoding="utf-8")
        new = text
        if f.suffix in (".py", ".pyi"):
            new = rewrite_imports(f, new, tree)
        new = rewrite_text(new, protected, tree)
        if new != text:
            f.write_text(new, encoding="utf-8")
            changed += 1
    print(f"relayout rewrite: {changed} files changed")
    return 0


# ------------------------------------------------------------------------------------------------ move
def git(*args: str) -> None:
    subprocess.run(["git", *args], cwd=REPO, check=True)


def face_text(face: str, tree: Tree) -> str:
    src, doc, extra = FACES[face]
    names, _ = tree.names(src)
    mod_tree = ast.parse(tree.files[src].read_text(encoding="utf-8"))
    exported: list[str] = []
    for n in mod_tree.body:
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets):
            exported = list(ast.literal_eval(n.value))
    exported += [e for e in extra if e not in exported]
    level, rest = relative(src, face, face.count(".") >= 1 and _face_is_pkg(face))
    import textwrap

    wrapped = textwrap.fill(doc, 99)
    lines = [f'"""{wrapped}\n"""' if "\n" in wrapped else f'"""{wrapped}"""', "", "from __future__ import annotations",
             ""]
    if "__getattr__" in names:
        exported_import = exported + ["__getattr__"]
    else:
        exported_import = exported
    if exported_import:
        lines.append(f"from {'.' * level}{rest} import (")
        lines += [f"    {n}," for n in exported_import]
        lines.append(")")
    for name, mod in FACE_EXTRA.get(face, {}).items():
        lv, r = relative(mod, face, _face_is_pkg(face))
        lines.append(f"from {'.' * lv}{r} import {name}")
        exported.append(name)
    lines += ["", "__all__ = ["] + [f'    "{n}",' for n in exported] + ["]", ""]
    return "\n".join(lines)


def _face_is_pkg(face: str) -> bool:
    return face not in ("memkern.ops", "memkern.graphs")


def face_path(face: str) -> Path:
    parts = face.split(".")[1:]
    return PKG.joinpath(*parts, "__init__.py") if _face_is_pkg(face) else PKG.joinpath(*parts[:-1],
                                                                                       parts[-1] + ".py")


def cmd_move(step: str, take_old: bool) -> int:
    steps = list(MOVES) if step == "all" else [step]
    for s in steps:
        if s not in MOVES:
            print(f"relayout move: unknown step {s!r} (one of {', '.join(MOVES)}, all)", file=sys.stderr)
            return 2
    problems = 0
    for s in steps:
        for old, new in MOVES[s]:
            src = PKG / old
            if new is None:
                if src.exists():
                    git("rm", "-q", "-f", str(src))
                continue
            if old.endswith("/"):
                pairs = [(f, PKG / new / f.relative_to(src)) for f in sorted(src.rglob("*"))
                         if f.is_file() and "__pycache__" not in f.parts] if src.exists() else []
            else:
                pairs = [(src, PKG / new)] if src.exists() and not _is_face(src) else []
            for a, b in pairs:
                if b.exists() and not take_old:
                    print(f"relayout move: both {a.relative_to(REPO)} and {b.relative_to(REPO)} exist; "
                          f"merge them by hand or rerun with --take-old", file=sys.stderr)
                    problems += 1
                    continue
                b.parent.mkdir(parents=True, exist_ok=True)
                git("mv", "-f", str(a), str(b))
            left = src if old.endswith("/") else src.parent
            if left != PKG and left.is_dir() and not any(left.rglob("*.py")):
                subprocess.run(["rm", "-rf", str(left)], check=True)  # only caches were left there
        for folder, doc in FOLDERS.get(s, {}).items():
            init = PKG / folder / "__init__.py"
            if not init.exists():
                init.parent.mkdir(parents=True, exist_ok=True)
                import textwrap

                wrapped = textwrap.fill(doc, 99)
                init.write_text(f'"""{wrapped}\n"""\n' if "\n" in wrapped else f'"""{wrapped}"""\n', encoding="utf-8")
        for rel, content in NEW_FILES.get(s, {}).items():
            if not (PKG / rel).exists():
                (PKG / rel).write_text(content, encoding="utf-8")
        # a package folder needs an __init__ for every level (faces fill the public ones)
        tree = Tree()
        for face, fs in FACE_STEP.items():
            if fs == s and tree.is_module(FACES[face][0]):
                p = face_path(face)
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text(face_text(face, tree), encoding="utf-8")
        git("add", "-A", PKG_REL)
    cmd_rewrite()
    return 1 if problems else 0


def _is_face(path: Path) -> bool:
    """A file at a face's path once the module it re-exports exists (the move already happened)."""
    mod = module_of(path)
    return mod in FACES and path == face_path(mod) and Tree().is_module(FACES[mod][0])


# ------------------------------------------------------------------------------------------------ verify
def cmd_verify() -> int:
    tree = Tree()
    bad = []
    for f in scan_files():
        if f.suffix not in (".py", ".pyi"):
            continue
        try:
            parsed = ast.parse(f.read_text(encoding="utf-8"))
        except SyntaxError as e:
            bad.append(f"{f.relative_to(REPO)}: syntax error {e}")
            continue
        importer = module_of(f)
        is_pkg = f.name == "__init__.py"
        for node in ast.walk(parsed):
            where = f"{f.relative_to(REPO)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("memkern") and not tree.is_module(a.name):
                        bad.append(f"{where}: import {a.name}")
            elif isinstance(node, ast.ImportFrom):
                if node.level and importer is None:
                    continue
                src = resolve(node.module or "", node.level, importer, is_pkg) if node.level else node.module
                if not (src or "").startswith("memkern"):
                    continue
                if not tree.is_module(src):
                    bad.append(f"{where}: from {src} import ...")
                    continue
                for a in node.names:
                    if a.name != "*" and not tree.defines(src, a.name):
                        bad.append(f"{where}: {src} has no {a.name}")
    protected = span_names(scan_files())
    for f in scan_files():
        if f.suffix != ".py":
            continue
        for m in _DOTTED.finditer(f.read_text(encoding="utf-8")):
            s = m.group(0)
            parts = s.split(".")
            heads = [".".join(parts[:i]) for i in range(len(parts), 1, -1)]
            old = next((h for h in heads if h in TEXT_MAP), None)
            if s not in protected and old is not None and not tree.is_module(old):
                bad.append(f"{f.relative_to(REPO)}: names the old module {s}")
    for p in mutant_files():
        if not (REPO / p).exists():
            bad.append(f"bench/mutants.py: no file {p}")
    for line in bad:
        print(line)
    print(f"relayout verify: {len(bad)} problems")
    return 1 if bad else 0


def cmd_resolve() -> int:
    """For each conflicted file: when this side's version is the merge base rewritten (nothing but
    moved paths), take the other side's version (``rewrite`` then redoes the paths); else leave it."""
    out = subprocess.run(["git", "diff", "--name-only", "--diff-filter=U"], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout.split()
    tree = Tree()
    protected = span_names(scan_files())
    left = 0
    for rel in out:
        def stage(n: int) -> str | None:
            r = subprocess.run(["git", "show", f":{n}:{rel}"], cwd=REPO, capture_output=True, text=True)
            return r.stdout if r.returncode == 0 else None
        base, ours, theirs = stage(1), stage(2), stage(3)
        path = REPO / rel
        if base is None or ours is None or theirs is None:
            print(f"relayout resolve: {rel}: added or deleted on one side; resolve by hand")
            left += 1
            continue
        redone = rewrite_imports(path, base, tree) if rel.endswith((".py", ".pyi")) else base
        redone = rewrite_text(redone, protected, tree)
        if redone != ours:
            print(f"relayout resolve: {rel}: changed here beyond the moved paths; resolve by hand")
            left += 1
            continue
        path.write_text(theirs, encoding="utf-8")
        git("add", rel)
        print(f"relayout resolve: {rel}: the other side taken (this side only rewrote paths)")
    print(f"relayout resolve: {len(out) - left} taken, {left} left to resolve by hand")
    return 1 if left else 0


def mutant_files() -> list[str]:
    text = (REPO / "bench" / "mutants.py").read_text(encoding="utf-8")
    return sorted(set(re.findall(r'"((?:python/memkern|kernels|csrc)/[\w/.]+\.(?:py|cpp|h|hpp))"', text)))


def cmd_mutants() -> int:
    f = REPO / "bench" / "mutants.py"
    text = f.read_text(encoding="utf-8")
    new = rewrite_text(text, span_names([f]), Tree())
    if new != text:
        f.write_text(new, encoding="utf-8")
    missing = [p for p in mutant_files() if not (REPO / p).exists()]
    for p in missing:
        print(f"bench/mutants.py: no file {p}")
    print(f"relayout mutants: {'rewritten' if new != text else 'unchanged'}, {len(missing)} missing files")
    return 1 if missing else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="relayout.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    mv = sub.add_parser("move")
    mv.add_argument("step")
    mv.add_argument("--take-old", action="store_true")
    sub.add_parser("rewrite")
    sub.add_parser("verify")
    sub.add_parser("mutants")
    sub.add_parser("resolve")
    sub.add_parser("map")
    args = ap.parse_args(argv)
    if args.cmd == "move":
        return cmd_move(args.step, args.take_old)
    if args.cmd == "rewrite":
        return cmd_rewrite()
    if args.cmd == "verify":
        return cmd_verify()
    if args.cmd == "mutants":
        return cmd_mutants()
    if args.cmd == "resolve":
        return cmd_resolve()
    for k, v in MODULE_MAP.items():
        print(f"{k} -> {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
