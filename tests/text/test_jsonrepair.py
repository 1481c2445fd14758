"""Robust JSON parsing of small-model output (cases copied from real SmolLM2-135M / small-model answers)."""
from __future__ import annotations

import pytest

from memkern.errors import MemkernValueError
from memkern.text.jsonrepair import JSONRepairError, extract_json_span, parse_json


@pytest.mark.parametrize(
    "text, expected",
    [
        # plain
        ('{"answer": "Paris", "citations": [0]}', {"answer": "Paris", "citations": [0]}),
        # code fence with prose around it
        ('Sure! Here is the JSON:\n```json\n{"topics": [{"summary": "x", "turns": [0, 1]}]}\n```\nHope this helps!',
         {"topics": [{"summary": "x", "turns": [0, 1]}]}),
        # fence without language tag
        ('```\n{"a": 1}\n```', {"a": 1}),
        # keeps generating after the object (SmolLM2 does this without a JSON stop)
        ('{"answer": "Lisbon", "citations": [1]} {"answer": "Porto"}\nuser: thanks', {"answer": "Lisbon", "citations": [1]}),
        # trailing commas
        ('{"topics": [{"summary": "x", "turns": [0, 1,],},]}', {"topics": [{"summary": "x", "turns": [0, 1]}]}),
        # Python literals / single quotes
        ("{'action': 'MERGE', 'index': 0, 'ok': True, 'x': None}", {"action": "MERGE", "index": 0, "ok": True, "x": None}),
        # apostrophe inside a double-quoted string stays
        ('{"summary": "The user\'s dog is called Pepper."}', {"summary": "The user's dog is called Pepper."}),
        # unquoted keys
        ('{answer: "x", citations: [2]}', {"answer": "x", "citations": [2]}),
        # smart quotes
        ("{\u201canswer\u201d: \u201cyes\u201d}", {"answer": "yes"}),
        # truncated by max_new_tokens inside a string
        ('{"topics": [{"summary": "The user likes', {"topics": [{"summary": "The user likes"}]}),
        # truncated after a key
        ('{"answer": "x", "citations":', {"answer": "x"}),  # dangling key dropped
        # real SmolLM2-135M output: a list closed by '}' instead of ']}'
        ('{"topics": [{"summary": "The user hurt their knee.", "turns": [0, 1, 2]}, {"summary": "B", "turns": [2]}}',
         {"topics": [{"summary": "The user hurt their knee.", "turns": [0, 1, 2]}, {"summary": "B", "turns": [2]}]}),
        # line comments
        ('{\n  // the action\n  "action": "ADD"\n}', {"action": "ADD"}),
    ],
)
def test_parse_json_repairs(text, expected):
    assert parse_json(text) == expected


def test_expect_type_skips_wrong_kind():
    # the list before the object is not what was asked for; the object is found
    assert parse_json('[1, 2] then {"a": 1}', dict) == {"a": 1}
    assert parse_json("[1, 2,]", list) == [1, 2]


@pytest.mark.parametrize("text", ["", "no json here", "{{{{", "I cannot answer that.", "{'a': }"])
def test_unrecoverable_raises_with_text(text):
    with pytest.raises(JSONRepairError) as ei:
        parse_json(text, dict)
    assert ei.value.text == text
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, MemkernValueError)
    assert "expected a JSON value" in str(ei.value)


def test_non_string_input():
    with pytest.raises(JSONRepairError, match="expected str"):
        parse_json(None)  # type: ignore[arg-type]


def test_never_evaluates_code():
    # literal_eval refuses calls: this must raise, not run anything
    with pytest.raises(JSONRepairError):
        parse_json("{'a': __import__('os').getcwd()}")


def test_extract_span():
    assert extract_json_span('xx {"a": "}"} yy') == ('{"a": "}"}', True)
    assert extract_json_span('{"a": [1, 2') == ('{"a": [1, 2', False)
    assert extract_json_span("none") == ("", False)


def test_coerce_int_reads_what_models_write_and_keeps_signs():
    from memkern.text.jsonrepair import coerce_int

    assert [coerce_int(x) for x in (3, 3.0, "3", "[3]", "turn 12", "-1")] == [3, 3, 3, 3, 12, -1]
    assert coerce_int(True) is None and coerce_int(2.5) is None and coerce_int("none") is None
