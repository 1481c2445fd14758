"""The docs: README.md and the site under docs/ (mkdocs-material + mkdocstrings).

* ``mkdocs build --strict`` passes (every warning is an error: broken links, unknown API paths,
  docstrings the numpy parser cannot read) and renders the API pages' members;
* every ```` ```python ```` fence of README.md and docs/*.md runs as written, a page's fences in
  order in one namespace, in a fresh folder. A fence may be preceded by a marker comment:

  - ``<!-- test: slow -->``: needs the real offline models; runs in the slow lane (CI runs it);
  - ``<!-- test: by tests/test_x.py::test_name -->``: needs a server process, Ray or the framework
    packages; that test runs the fence against the real thing (checked here: it exists and reads
    this page);
* README.md is short and starts with the two set-up commands; no page names a machine path or the
  project's process history.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
MARKER = re.compile(r"<!--\s*test:\s*(.*?)\s*-->\s*\Z", re.S)
TEST_COMMAND = "./scripts/setup.sh test && .venv/bin/python -m pytest -q"
DEMO_COMMAND = "./scripts/setup.sh && .venv/bin/memkern demo"


def _rel(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


def fences(page: Path) -> list[tuple[int, str, str, str]]:
    """``[(line, language, code, marker)]`` of every fenced block of ``page`` (marker: the text
    of a ``<!-- test: ... -->`` comment right before the fence, ``""`` when none)."""
    text = page.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        before = text[:m.start()].rstrip()
        mk = MARKER.search(before[-300:])
        out.append((text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2), mk.group(1) if mk else ""))
    return out


def _python(page: Path, kinds: set[str]) -> list[tuple[int, str]]:
    return [(ln, code) for ln, lang, code, mk in fences(page) if lang == "python" and
            ("slow" if mk == "slow" else "" if not mk else "by") in kinds]


def _run_page(page: Path, blocks, tmp_path: Path, monkeypatch) -> None:
    assert blocks, f"{_rel(page)}: no python example to run"
    monkeypatch.chdir(tmp_path)
    ns: dict = {"__name__": f"docs_{page.stem.replace('-', '_')}"}
    for line, code in blocks:
        exec(compile(code, f"{_rel(page)}:{line}", "exec"), ns)


FAST = [p for p in PAGES if _python(p, {""})]
SLOW = [p for p in PAGES if _python(p, {"slow"})]


@pytest.mark.parametrize("page", FAST, ids=_rel)
def test_page_examples_run(page, tmp_path, monkeypatch):
    """The page's unmarked python fences, in order, in one namespace."""
    _run_page(page, _python(page, {""}), tmp_path, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("page", SLOW, ids=_rel)
def test_page_examples_run_with_the_real_models(page, tmp_path, monkeypatch):
    """The page's fences, the slow ones (real offline models) included, in order."""
    pytest.importorskip("transformers")
    _run_page(page, _python(page, {"", "slow"}), tmp_path, monkeypatch)


def test_the_pages_have_examples_to_run():
    """The page tests above are parametrized over what the collector finds: it must find them."""
    assert {_rel(p) for p in FAST} >= {"README.md", "docs/store.md", "docs/retrieval.md", "docs/reranker.md",
                                       "docs/rmm.md", "docs/memreread.md", "docs/models.md", "docs/errors.md"}
    assert {_rel(p) for p in SLOW} >= {"docs/rmm.md", "docs/memreread.md", "docs/models.md"}
    assert sum(len(_python(p, {""})) for p in PAGES) >= 12


def test_every_fence_marker_is_known_and_its_test_exists():
    seen = 0
    for page in PAGES:
        for line, lang, _code, mk in fences(page):
            where = f"{_rel(page)}:{line}"
            if not mk:
                continue
            assert lang == "python", f"{where}: a test marker on a {lang or 'plain'} fence"
            if mk == "slow":
                continue
            m = re.fullmatch(r"by (tests/[\w/]+\.py)::(test_\w+)", mk)
            assert m, f"{where}: unknown marker {mk!r} (expected 'slow' or 'by tests/<file>.py::<test>')"
            test_file = ROOT / m.group(1)
            assert test_file.is_file(), f"{where}: {m.group(1)} does not exist"
            src = test_file.read_text(encoding="utf-8")
            assert re.search(rf"^def {m.group(2)}\(", src, re.M), f"{where}: no test {m.group(2)} in {m.group(1)}"
            assert f'"{page.name}"' in src or _rel(page) in src, f"{where}: {m.group(1)} does not read {_rel(page)}"
            seen += 1
    assert seen >= 5  # the servers, MCP, Ray and adapter examples are run by their own tests


def test_readme_is_short_and_starts_with_the_two_commands():
    raw = README.read_bytes()
    assert len(raw) <= 12288, f"README.md is {len(raw)} bytes, more than 12 KiB: move detail to docs/"
    text = raw.decode("utf-8")
    line, lang, code, _ = fences(README)[0]
    assert lang == "bash" and text.index("```") < text.index("\n## "), "the first block comes before any section"
    first, second = code.splitlines()[:2]
    assert first.startswith(DEMO_COMMAND + " ") and second.startswith(TEST_COMMAND + " "), code
    prose = FENCE.sub("", text)
    long = [ln for ln in prose.splitlines() if len(ln) > 120 and not ln.startswith("|")]
    assert not long, long
    for target in re.findall(r"\]\((docs/[^)#]+)", text):  # every docs link names a page that exists
        assert (ROOT / target).is_file(), target


def _report():
    spec = importlib.util.spec_from_file_location("memkern_bench_report_docs", ROOT / "bench" / "report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_no_machine_paths_or_process_history_in_the_docs():
    report = _report()
    problems = []
    for page in PAGES:
        problems += [f"{_rel(page)}: {p}" for p in report.hygiene_problems(page.read_text(encoding="utf-8"))]
    assert not problems, problems
    # the check itself catches what it is for
    assert report.hygiene_problems("see issue 11 on branch w5/x under /work/x")
    assert report.hygiene_problems("/root/.venv/lib/python3.11/site-packages/memkern")


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    """The site builds with every warning an error, and the API pages carry their members."""
    assert importlib.util.find_spec("mkdocs") and importlib.util.find_spec("mkdocstrings_handlers"), (
        "mkdocs / mkdocstrings missing: install the test extra (./scripts/setup.sh test)")
    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    # no -q: mkdocs' quiet mode drops warnings before --strict counts them
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                        "-d", str(site)], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "WARNING" not in r.stderr, r.stderr[-4000:]
    expect = {
        "store/index.html": ["memkern.MemoryStore.search", "memkern.InMemoryStore", "memkern.AsyncMemoryStore"],
        "reranker/index.html": ["memkern.Reranker.select", "memkern.ReinforceTrainer", "memkern.ops.rerank_scores"],
        "rmm/index.html": ["memkern.RMM.respond", "memkern.RMM.retrieve", "memkern.RMM.end_session", "memkern.RMMConfig"],
        "memreread/index.html": ["memkern.MemReread.answer"],
        "formats/index.html": [],
        "benchmarks/results/index.html": [],
    }
    for page, anchors in expect.items():
        html = (site / page).read_text(encoding="utf-8")
        for a in anchors:
            assert f'id="{a}"' in html, f"{page}: no API entry {a}"
    formats = (site / "formats/index.html").read_text(encoding="utf-8")
    assert "MKWAL" in formats and "records.bin" in formats  # generated from the C++ headers' docs
