"""scripts/relayout.py: the import rewrite that code written against the old module paths goes
through (after a merge: ``relayout.py rewrite && relayout.py verify``). Checked on the real tree,
with sources as a file merged from before the move would hold them."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def R():
    spec = importlib.util.spec_from_file_location("relayout", REPO / "scripts" / "relayout.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tree(R):
    return R.Tree()


def test_a_file_merged_into_a_moved_folder_gets_its_relative_imports_from_its_old_place(R, tree):
    # written as python/memkern/rmm/new.py, merged into loops/rmm/ by the folder rename
    src = ("from ..validate import check_int\n"
           "from ..store import MemoryStore, _check_namespace\n"
           "from ..inmemory import InMemoryStore\n"
           "from .core import RMM\n"
           "from .. import _store\n")
    got = R.rewrite_imports(R.PKG / "loops" / "rmm" / "new.py", src, tree)
    assert got.splitlines() == [
        "from ...base.validate import check_int",
        "from ...store.engine import MemoryStore, _check_namespace",
        "from ...store.memory import InMemoryStore",
        "from .core import RMM",
        "from ... import _store",
    ]
    assert R.rewrite_imports(R.PKG / "loops" / "rmm" / "new.py", got, tree) == got  # idempotent


def test_absolute_imports_outside_the_package_keep_the_public_faces(R, tree):
    src = ("from memkern.inmemory import InMemoryStore\n"
           "from memkern import rmm, errors\n"
           "from memkern.store import MemoryStore, _check_namespace\n"
           "import memkern.reranker as rr\n"
           "from memkern.ops import rerank_scores\n")
    got = R.rewrite_imports(REPO / "tests" / "test_x.py", src, tree)
    assert got.splitlines() == [
        "from memkern.store.memory import InMemoryStore",
        "from memkern.loops import rmm",
        "from memkern import errors",
        "from memkern.store import MemoryStore",
        "from memkern.store.engine import _check_namespace",
        "import memkern.score.reranker as rr",
        "from memkern.ops import rerank_scores",
    ]
    assert R.rewrite_imports(REPO / "tests" / "test_x.py", got, tree) == got


def test_inside_the_package_faces_are_bypassed_and_moved_names_follow_name_map(R, tree):
    src = "from ..ops import rerank_scores\nfrom ..models.lookup import list_models, model_cache_dir\n"
    got = R.rewrite_imports(R.PKG / "eval" / "new.py", src, tree)
    assert got.splitlines() == [
        "from ..score.ops.functional import rerank_scores",
        "from ..models.setup import list_models",
        "from ..models.paths import model_cache_dir",
    ]


def test_dotted_names_follow_except_span_names_and_code_strings_are_rewritten(R, tree):
    text = 'see memkern.timeexpr.parse_time, memkern.rmm.RMM and "memkern.reranker.select"; memkern.store.MemoryStore'
    got = R.rewrite_text(text, {"memkern.reranker.select"}, tree)
    assert got == ('see memkern.text.time.parse_time, memkern.loops.rmm.RMM and "memkern.reranker.select"; '
                   'memkern.store.MemoryStore')
    assert R.rewrite_text(got, {"memkern.reranker.select"}, tree) == got
    code = 'CODE = "import sys\\nfrom memkern import telemetry, store\\nprint(1)\\n"\n'
    out = R.rewrite_imports(REPO / "tests" / "test_x.py", code, tree)
    assert out == 'CODE = "import sys\\nfrom memkern.base import telemetry; from memkern.store import engine as store\\nprint(1)\\n"\n'
    assert R.rewrite_text("python/memkern/rmm/feedback.py python/memkern/inmemory.py", set(), tree) == \
        "python/memkern/loops/rmm/feedback.py python/memkern/store/memory.py"


@pytest.mark.slow
def test_the_tree_as_committed_verifies(R, capsys):
    assert R.cmd_verify() == 0, capsys.readouterr().out
