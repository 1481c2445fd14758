"""``memkern eval reread``: answer scoring, the evaluation loop on a fake backend, and the CLI with
the tiny model on generated data and on a long-context QA file."""
from __future__ import annotations

import json
import os

import pytest

from memkern.data.haystack import LongQAItem
from memkern.eval.reread import contains_match, evaluate_reread, exact_match, f1_score, format_report, \
    normalize_answer, plot_report
from fakes_memreread import DOC, FakeChat


def test_answer_metrics():
    assert normalize_answer("The  Blue, Falcon!") == "blue falcon"
    assert exact_match("the blue falcon.", ["Blue Falcon"]) == 1.0
    assert exact_match("blue falcons", ["Blue Falcon"]) == 0.0
    assert f1_score("blue falcon", ["Falcon"]) == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert f1_score("red", ["x", "red"]) == 1.0 and f1_score("", ["red"]) == 0.0
    assert contains_match("It is 4417 I think", ["4417"]) == 1.0
    assert contains_match("44170", ["4417"]) == 0.0


def test_evaluate_reread_fake_backend(tmp_path):
    def dec(q, notes, asked, n):
        return {"enough": True} if "(none)" not in asked else {"enough": False, "sub_question": "Where does the Quix river flow?"}

    items = [LongQAItem("a", DOC, "What is the Zorblat code?", ["The Zorblat code is 4417"], "single", 1000),
             LongQAItem("b", DOC, "What is the Zorblat code?", ["4417"], "single", 2000)]
    rep = evaluate_reread(items, FakeChat(decompose=dec), max_rereads=2, batch_size=1, progress=False,
                          chunk_tokens=14, memory_tokens=80)
    rows = {(r["method"], r["item_id"]): r for r in rep["rows"]}
    base, mr = rows[("MemAgent(max_rereads=0)", "a")], rows[("MemReread(max_rereads=2)", "a")]
    assert base["answer"] == "The Zorblat code is 4417." and base["em"] == 1.0 and base["rereads"] == 0
    # the fake integrates the sub-answer last, so MemReread answers with the river fact here
    assert mr["rereads"] == 1 and mr["answer"] == "The Quix river flows north." and mr["em"] == 0.0
    b = rows[("MemAgent(max_rereads=0)", "b")]
    assert (b["contains"], b["em"]) == (1.0, 0.0)
    by_len = {(a["method"], a["length"]): a for a in rep["by_length"]}
    assert by_len[("MemReread(max_rereads=2)", 1000)]["rereads"] == 1.0
    assert by_len[("MemAgent(max_rereads=0)", 1000)]["em"] == 1.0
    text = format_report(rep)
    assert "MemAgent(max_rereads=0)" in text and "rereads" in text
    png = plot_report(rep, str(tmp_path / "p.png"))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_cli_generated_and_file(tmp_path, capsys):
    from memkern.cli import main

    png, js = tmp_path / "r.png", tmp_path / "r.json"
    rc = main(["eval", "reread", "--model", "tiny", "--lengths", "1k", "--tasks", "single,multihop2",
               "--chunk-tokens", "400", "--memory-tokens", "32", "--max-new-tokens", "8", "--answer-tokens", "4",
               "--decompose-tokens", "8", "--max-rereads", "1", "--plot", str(png), "--json", str(js), "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0 and "MemReread(max_rereads=1)" in out and "MemAgent(max_rereads=0)" in out
    assert os.path.getsize(png) > 1000
    rep = json.loads(js.read_text())
    assert len(rep["rows"]) == 4 and {r["task"] for r in rep["rows"]} == {"single", "multihop2"}
    data = tmp_path / "qa.jsonl"
    data.write_text(json.dumps({"input": "Who met Bob?", "context": "Ann met Bob in Rome. " * 30,
                                "answers": ["Ann"], "dataset": "toy", "_id": "t1"}) + "\n")
    rc = main(["eval", "reread", "--model", "tiny", "--data", str(data), "--chunk-tokens", "100",
               "--memory-tokens", "16", "--max-new-tokens", "4", "--answer-tokens", "4", "--decompose-tokens", "4",
               "--max-rereads", "1", "--no-baseline", "--plot", "", "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0 and "toy" in out and "MemAgent" not in out
    rc = main(["eval", "reread", "--model", "tiny", "--data", str(tmp_path / "none.json"), "--quiet"])
    assert rc == 2
