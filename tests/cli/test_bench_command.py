"""``memkern bench``: argument errors are one line, a tiny real run writes the report + chart +
RESULTS.md, and the committed ``bench/RESULTS.md`` is exactly what ``--assemble`` generates."""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

from memkern import cli

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_bench_bad_arguments(capsys, tmp_path):
    assert cli.main(["bench", "--parts", "peers,gpu"]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "--parts" in out[0] and "gpu" in out[0]
    assert cli.main(["bench", "--n", "0"]) == 2
    assert "--n" in capsys.readouterr().out
    assert cli.main(["bench", "--bench-dir", str(tmp_path)]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "not found" in out[0] and str(tmp_path) in out[0]


@pytest.mark.slow
def test_bench_tiny_run_writes_report_and_chart(tmp_path, monkeypatch, capsys):
    pytest.importorskip("hnswlib")
    pytest.importorskip("matplotlib")
    monkeypatch.setenv("MEMKERN_BENCH_PEERS", "hnswlib")
    monkeypatch.setattr(sys, "path", list(sys.path))
    out = tmp_path / "REPORT.md"
    rc = cli.main(["bench", "--parts", "peers,namespaces", "--n", "300", "--queries", "20", "--namespaces", "12",
                   "--out", str(out)])
    assert rc == 0, capsys.readouterr().out
    text = out.read_text()
    assert "memkern bench --parts peers,namespaces --n 300 --queries 20 --namespaces 12" in text  # the command
    # many small namespaces: one store vs one hnswlib index per namespace, exactness asserted and shown
    assert "12 namespaces x 20 records" in text and "one hnswlib.Index per namespace" in text
    assert "| recall@10 vs an exact scan of the namespace (same ids and order) | 1.0000 (1.0000) |" in text
    # batch search at all threads: every side at the same thread count, stated
    assert "memkern (its store reopened with `num_threads=" in text
    if (os.cpu_count() or 1) > 1:
        assert f"| ... threads of that batch search | {os.cpu_count()} | {os.cpu_count()} |" in text
    results = (tmp_path / "RESULTS.md").read_text()  # reassembled beside the report
    assert results.startswith("# Measured results") and "## Areas" in results
    assert "## Many tenants: an exact index per small namespace" in results  # the fragments' areas
    assert "[REPORT.md](REPORT.md)" in results  # this run's report: its area, command, date, machine
    assert "- Command: `memkern bench --parts peers,namespaces --n 300 --queries 20 --namespaces 12`" in results
    assert "cores" in text and "hnswlib 0.8" in text  # machine and versions are stated
    assert "| batched add, fsync=always" in text and "hnswlib:" in text
    assert "recall@10 vs exact" in text and "skipped" in text  # faiss/chromadb skipped, said so
    png = tmp_path / "report-peers.png"
    assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "results" / "report.json").is_file()



def test_bench_part_without_peers_is_skipped_not_failed(tmp_path, monkeypatch, capsys):
    """No peer installed (here: none allowed): the comparison parts are skipped with the extra that
    installs the peers, the command succeeds and the report says so."""
    monkeypatch.setenv("MEMKERN_BENCH_PEERS", "no-such-peer")
    monkeypatch.setattr(sys, "path", list(sys.path))
    out = tmp_path / "REPORT.md"
    rc = cli.main(["bench", "--parts", "peers,namespaces", "--n", "300", "--queries", "20", "--namespaces", "12",
                   "--out", str(out)])
    log = capsys.readouterr().out
    assert rc == 0, log
    assert "namespaces: no peer installed to compare with (pip install 'memkern[bench]'" in log
    text = out.read_text()
    assert "## Many small namespaces vs peers (`bench/bench_namespaces.py`): skipped" in text
    assert "not measured" not in text

def test_bench_runs_from_an_installed_copy_of_the_suite(tmp_path, monkeypatch, capsys):
    """The wheel carries the suite's scripts as ``memkern/bench/`` (no sections): it is found there,
    its report goes to ``./memkern-bench/`` (not into the package) and ``--assemble`` is refused."""
    from memkern.cli import bench as B

    site = tmp_path / "site" / "memkern"
    (site / "cli").mkdir(parents=True)
    shutil.copytree(BENCH, site / "bench", ignore=shutil.ignore_patterns("*.md", "results", "__pycache__"))
    user = tmp_path / "user"
    user.mkdir()
    monkeypatch.chdir(user)
    monkeypatch.setattr(B, "__file__", str(site / "cli" / "bench.py"))
    assert B.find_bench_dir(None) == site / "bench" and B.is_installed_suite(site / "bench")
    assert not B.is_installed_suite(BENCH)
    monkeypatch.setenv("MEMKERN_BENCH_PEERS", "no-such-peer")
    monkeypatch.setattr(sys, "path", list(sys.path))
    rc = cli.main(["bench", "--parts", "namespaces", "--namespaces", "12"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert (user / "memkern-bench" / "REPORT.md").is_file() and "RESULTS.md" not in out
    assert not list((site / "bench").glob("*.md")) and not (site / "bench" / "results").exists()
    assert cli.main(["bench", "--assemble"]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "--assemble: expected a source checkout" in out[0], out


def _report_module():
    return _bench_module("report")


def test_committed_results_md_is_what_assemble_generates(capsys):
    """RESULTS.md is generated: a hand edit (or a fragment changed without reassembling) fails CI."""
    rc = cli.main(["bench", "--assemble", "--check"])
    out = capsys.readouterr().out
    assert rc == 0, out + "\nrun `memkern bench --assemble` and commit bench/RESULTS.md"
    assert "up to date" in out
    text = (BENCH / "RESULTS.md").read_text()
    # a summary: one area per fragment, in SECTIONS order, then the report, each linked
    report = _report_module()
    names = [n for n in report.SECTIONS if (BENCH / "sections" / f"{n}.md").is_file()]
    assert set(report.SECTIONS) - set(names) <= report.OPTIONAL_SECTIONS
    pos = [text.index(f"- Full text: [sections/{n}.md](sections/{n}.md)") for n in names]
    assert pos == sorted(pos) and text.count("- Full text: [sections/") == len(names)
    assert "## memkern benchmark report (generated)" in text and "[REPORT.md](REPORT.md)" in text
    assert text.count("\n- Command: `") == text.count("\n- Measured: ") == len(names) + 1
    assert text.count("| what | memkern | versus | ratio |") >= len(names) - 2  # nearly every area has figures
    assert len(text) < 40_000 and not report.hygiene_problems(text)


def _bench_copy(tmp_path: Path) -> Path:
    b = tmp_path / "bench"
    b.mkdir()
    for f in ("report.py", "harness.py", "REPORT.md", "RESULTS.md"):
        shutil.copy(BENCH / f, b / f)
    shutil.copytree(BENCH / "sections", b / "sections")
    return b


def test_assemble_check_rejects_hand_edits_and_regenerates(tmp_path, capsys):
    b = _bench_copy(tmp_path)
    orig = (b / "RESULTS.md").read_text()
    assert cli.main(["bench", "--bench-dir", str(b), "--assemble", "--check"]) == 0
    capsys.readouterr()
    (b / "RESULTS.md").write_text(orig.replace("Measured", "Measured (edited)", 1))
    assert cli.main(["bench", "--bench-dir", str(b), "--assemble", "--check"]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "differs" in out[0] and "--assemble" in out[0]
    assert cli.main(["bench", "--bench-dir", str(b), "--assemble"]) == 0  # regenerate
    assert (b / "RESULTS.md").read_text() == orig
    # a fragment's front matter edit shows up in RESULTS.md only through --assemble
    frag = b / "sections" / "crash.md"
    frag.write_text(frag.read_text().replace("area: Crash campaign", "area: Crash campaign, renamed", 1))
    assert cli.main(["bench", "--bench-dir", str(b), "--assemble", "--check"]) == 1
    assert cli.main(["bench", "--bench-dir", str(b), "--assemble"]) == 0
    assert "## Crash campaign, renamed" in (b / "RESULTS.md").read_text()
    assert cli.main(["bench", "--check"]) == 2  # --check only with --assemble
    capsys.readouterr()


def test_assemble_refuses_unknown_missing_or_headless_fragments(tmp_path, capsys):
    b = _bench_copy(tmp_path)
    (b / "sections" / "mine.md").write_text("## Mine\n")
    assert cli.main(["bench", "--bench-dir", str(b), "--assemble"]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "mine" in out[0] and "SECTIONS" in out[0]
    (b / "sections" / "mine.md").unlink()
    (b / "sections" / "crash.md").unlink()
    assert cli.main(["bench", "--bench-dir", str(b), "--assemble"]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "missing ['crash']" in out[0]
    (b / "sections" / "crash.md").write_text("no heading\n")
    assert cli.main(["bench", "--bench-dir", str(b), "--assemble"]) == 2
    assert "crash.md" in capsys.readouterr().out
    good = (BENCH / "sections" / "crash.md").read_text()
    for bad, why in [(good.replace("---\n## ", "---\n", 1), "heading"),
                     (good.replace("\ndate: ", "\nwhen: ", 1), "when"),
                     (good.replace('"0", "94,046', '"0", "94,047', 1), "94047"),      # a figure not in the section
                     (good.replace("ext4", "ext4 under /work/x", 1), "machine path"),
                     (good + "\nMeasured on branch x.\n", "process history")]:
        (b / "sections" / "crash.md").write_text(bad)
        assert cli.main(["bench", "--bench-dir", str(b), "--assemble"]) == 2, why
        out = capsys.readouterr().out.strip().splitlines()
        assert len(out) == 1 and "crash.md" in out[0] and why.replace(",", "") in out[0].replace(",", ""), out
    (b / "REPORT.md").unlink()
    (b / "sections" / "crash.md").write_text("## Crash\n")
    assert cli.main(["bench", "--bench-dir", str(b), "--assemble"]) == 2
    assert "REPORT.md" in capsys.readouterr().out


def test_write_section_states_command_date_machine(tmp_path):
    report = _report_module()
    sys.path.insert(0, str(BENCH))
    try:
        p = report.write_section("namespaces", "Title", "| a | b |", "python bench/x.py --n 3", sections_dir=tmp_path,
                                 raw_json="bench/results/x.json")
    finally:
        sys.path.remove(str(BENCH))
    text = p.read_text()
    assert p.name == "namespaces.md" and text.startswith("---\narea: Title\n") and "\n---\n## Title\n" in text
    meta, body = report.parse_front_matter("namespaces", text)
    assert meta["command"] == "python bench/x.py --n 3" and "UTC" in meta["date"] and "cores" in meta["machine"]
    assert meta["headline"] == [] and body.startswith("## Title")
    assert "Command: `python bench/x.py --n 3`" in text and "UTC" in text and "cores" in text
    assert "`bench/results/x.json`, not kept in git" in text and text.rstrip().endswith("| a | b |")
    sys.path.insert(0, str(BENCH))
    try:
        p = report.write_section("peers", "T", "| add | 5,275 records/s | 0.97 |", "cmd", sections_dir=tmp_path,
                                 headline=[["add", "5,275 records/s", "faiss", "0.97"]])
        assert report.parse_front_matter("peers", p.read_text())[0]["headline"] == [["add", "5,275 records/s",
                                                                                     "faiss", "0.97"]]
        with pytest.raises(report.SectionError, match="not in the section"):  # figures are quoted, never typed
            report.write_section("peers", "T", "| add | 5,275 records/s |", "cmd", sections_dir=tmp_path,
                                 headline=[["add", "5,300 records/s", "faiss", "0.97"]])
    finally:
        sys.path.remove(str(BENCH))
    with pytest.raises(report.SectionError, match="name: expected one of"):
        report.write_section("nope", "T", "", "cmd", sections_dir=tmp_path)
    with pytest.raises(report.SectionError, match="title"):
        report.write_section("peers", "two\nlines", "", "cmd", sections_dir=tmp_path)


def _bench_module(name: str):
    spec = importlib.util.spec_from_file_location(f"memkern_{name}_t", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCH))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(BENCH))
    return mod


def test_namespaces_bench_exact_reference_and_failing_check(tmp_path, monkeypatch):
    """The many-namespaces comparison's reference is an exact per-namespace scan, and a side that
    answers from the wrong namespace fails the run instead of being timed."""
    pytest.importorskip("hnswlib")
    NS = _bench_module("bench_namespaces")
    x = NS.make_data(5, 20)
    q = NS.make_data(4, 1, seed=2)
    ns = NS.np.array([3, 0, 3, 4])
    got = NS.exact_in_ns(x, 20, ns, q)
    for j in range(4):
        sc = x @ q[j]
        sc[NS.np.arange(100) // 20 != ns[j]] = -NS.np.inf
        assert got[j].tolist() == NS.np.argsort(-sc, kind="stable")[:10].tolist()
    monkeypatch.setenv("MEMKERN_BENCH_PEERS", "hnswlib")
    orig = NS.Memkern.search
    monkeypatch.setattr(NS.Memkern, "search", lambda self, i, qq: orig(self, (i + 1) % 12, qq))
    with pytest.raises(AssertionError, match=r"memkern\[always\]: recall@10 vs an exact scan"):
        NS.run(n_ns=12, per=20, n_queries=10, log=lambda m: None, tmp=tmp_path)
