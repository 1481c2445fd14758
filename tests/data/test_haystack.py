"""Generated long-context QA over the Paul Graham essays, and the long-context QA file loader."""
from __future__ import annotations

import json
import re

import pytest

from memkern.data.haystack import TASKS, LongQAItem, generate_haystack_qa, load_essays, make_haystack_item
from memkern.data.longqa import load_longqa, save_longqa
from memkern.data.schema import DatasetFormatError
from memkern.errors import MemkernValueError


@pytest.fixture(scope="module")
def tok():
    from memkern.models import tiny_chat_model

    return tiny_chat_model().tokenizer


def test_essays_are_real_text():
    essays = load_essays()
    assert len(essays) >= 40
    assert sum(len(t) for _, t in essays) > 500_000


@pytest.mark.parametrize("task", TASKS)
def test_item_evidence_answer_and_length(task, tok):
    it = make_haystack_item(task, 8192, seed=3, tokenizer=tok)
    assert isinstance(it, LongQAItem) and it.task == task
    # measured length close to the target
    assert abs(it.n_tokens - 8192) < 200
    assert it.n_tokens == len(tok(it.context, add_special_tokens=False)["input_ids"])
    n_facts = {"single": 1, "multihop2": 2, "multihop3": 3}.get(task)
    if n_facts:
        assert len(it.evidence) == n_facts
    for e in it.evidence:
        assert it.context[e["char_start"]:e["char_end"]] == e["text"]
        assert it.context.count(e["text"]) == 1
        assert abs(e["depth"] - e["char_start"] / len(it.context)) < 1e-3
        # token_start points at the token holding the evidence's first character
        prefix = it.context[:e["char_start"]]
        assert abs(len(tok(prefix, add_special_tokens=False)["input_ids"]) - e["token_start"]) <= 1
    ev = " ".join(e["text"] for e in it.evidence)
    if task == "single":
        assert it.answers[0] in ev
    elif task.startswith("multihop"):
        # the chain: the question names the first person; the answer sits in the last fact only
        (first,) = re.findall(r"[A-Z][a-z]+ [A-Z][a-z]+", it.question)
        assert sum(first in e["text"] for e in it.evidence) == 1
        assert sum(it.answers[0] in e["text"] for e in it.evidence) == 1
        assert it.answers[0] not in it.question
    elif task == "count":
        assert int(it.answers[0]) == len(it.evidence) and 2 <= len(it.evidence) <= 6
        depot = re.search(r"the (\w+) depot\?", it.question).group(1)
        assert it.context.count(f"the {depot} depot.") == len(it.evidence)
    else:
        total = sum(int(re.search(r"measured (\d+) millimetres", e["text"]).group(1)) for e in it.evidence)
        assert int(it.answers[0]) == total


def test_pieces_sit_far_apart_and_seeded(tok):
    it = make_haystack_item("multihop3", 16384, seed=1, tokenizer=tok)
    depths = sorted(e["depth"] for e in it.evidence)
    assert min(b - a for a, b in zip(depths, depths[1:])) > 0.05
    again = make_haystack_item("multihop3", 16384, seed=1, tokenizer=tok)
    assert again == it
    other = make_haystack_item("multihop3", 16384, seed=2, tokenizer=tok)
    assert other.context != it.context and other.question != it.question


def test_grid_and_validation(tok):
    items = generate_haystack_qa(n_per_cell=2, lengths=(2048, 4096), tasks=("single", "sum"), seed=5, tokenizer=tok)
    assert [(i.length, i.task) for i in items] == [(2048, "single")] * 2 + [(2048, "sum")] * 2 + \
        [(4096, "single")] * 2 + [(4096, "sum")] * 2
    assert len({i.item_id for i in items}) == len(items)
    with pytest.raises(MemkernValueError, match="task"):
        make_haystack_item("trivia", 8192, tokenizer=tok)
    with pytest.raises(MemkernValueError, match="length"):
        make_haystack_item("single", 10_000_000, tokenizer=tok)
    with pytest.raises(MemkernValueError, match="length"):
        make_haystack_item("single", 100, tokenizer=tok)


def test_longqa_roundtrip_and_formats(tmp_path, tok):
    items = generate_haystack_qa(lengths=(2048,), tasks=("single", "count"), tokenizer=tok)
    p = save_longqa(items, tmp_path / "gen.jsonl")
    back = load_longqa(p)
    assert [b.to_dict() for b in back] == [i.to_dict() for i in items]
    # published list format, single-string answers, extra fields kept in meta
    recs = [{"input": "Who?", "context": "Ann met Bob.", "answers": ["Ann"], "length": 3, "dataset": "hotpotqa",
             "language": "en", "all_classes": None, "_id": "x1"},
            {"input": "Where?", "context": "In Rome.", "answers": "Rome", "dataset": "2wikimqa", "_id": "x2"}]
    (tmp_path / "lb.json").write_text(json.dumps(recs))
    got = load_longqa(tmp_path / "lb.json")
    assert [(g.item_id, g.question, g.answers, g.task, g.length) for g in got] == [
        ("x1", "Who?", ["Ann"], "hotpotqa", 3), ("x2", "Where?", ["Rome"], "2wikimqa", -1)]
    assert got[0].meta == {"language": "en", "all_classes": None}
    assert [g.item_id for g in load_longqa(tmp_path / "lb.json", dataset="2wikimqa")] == ["x2"]
    assert len(load_longqa(tmp_path / "lb.json", limit=1)) == 1


@pytest.mark.parametrize("content,match", [
    ('[{"input": "q", "answers": ["a"]}]', r"record 0: field 'context'"),
    ('[{"input": "q", "context": "c", "answers": []}]', r"record 0: field 'answers'"),
    ('[{"input": 3, "context": "c", "answers": ["a"]}]', r"record 0: field 'input'"),
    ('{"input": "q", "context": "c", "answers": ["a"]}\nnot json\n', r"line 2"),
    ('[1, 2]', r"record 0: expected an object"),
])
def test_longqa_bad_files(tmp_path, content, match):
    p = tmp_path / "bad.jsonl"
    p.write_text(content)
    with pytest.raises(DatasetFormatError, match=match):
        load_longqa(p)
    with pytest.raises(DatasetFormatError, match="path"):
        load_longqa(tmp_path / "missing.json")
