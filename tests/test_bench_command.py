"""``memkern bench``: argument errors are one line, and a tiny real run writes the report + chart."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from memkern import cli

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_bench_bad_arguments(capsys, tmp_path):
    assert cli.main(["bench", "--parts", "peers,gpu"]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "--parts" in out[0] and "gpu" in out[0]
    assert cli.main(["bench", "--n", "0"]) == 2
    assert "--n" in capsys.readouterr().out
    assert cli.main(["bench", "--bench-dir", str(tmp_path)]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "not found" in out[0] and str(tmp_path) in out[0]


def test_bench_tiny_run_writes_report_and_chart(tmp_path, monkeypatch, capsys):
    pytest.importorskip("hnswlib")
    pytest.importorskip("matplotlib")
    monkeypatch.setenv("MEMKERN_BENCH_PEERS", "hnswlib")
    monkeypatch.setattr(sys, "path", list(sys.path))
    out = tmp_path / "REPORT.md"
    rc = cli.main(["bench", "--parts", "peers", "--n", "300", "--queries", "20", "--out", str(out)])
    assert rc == 0, capsys.readouterr().out
    text = out.read_text()
    assert "memkern bench --parts peers --n 300 --queries 20" in text  # the command is stated
    assert "cores" in text and "hnswlib 0.8" in text  # machine and versions are stated
    assert "| batched add, fsync=always" in text and "hnswlib:" in text
    assert "recall@10 vs exact" in text and "skipped" in text  # faiss/chromadb skipped, said so
    png = tmp_path / "report-peers.png"
    assert png.is_file() and png.read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "results" / "report.json").is_file()
