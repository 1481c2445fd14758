"""The turn template (memkern.text.template): rendering, graceful degradation, dates, validation."""
from __future__ import annotations

import datetime as dt

import pytest

from memkern.errors import MemkernTypeError, MemkernValueError
from memkern.text.template import DEFAULT_TEMPLATE, PLAIN, TurnTemplate, default_template, parse_date, turn_date


def test_default_template_renders_date_and_speaker():
    t = TurnTemplate()
    assert t.template == DEFAULT_TEMPLATE == "[{date}] {speaker}: {content}"
    assert t.render("I'm moving to Lisbon!", "Caroline", "1:56 pm on 8 May, 2023") == \
        "[2023-05-08] Caroline: I'm moving to Lisbon!"
    assert t.render_turn({"role": "user", "content": "hi  there", "speaker": "Mel", "timestamp": "2023/05/20 (Sat) 02:21"}) \
        == "[2023-05-20] Mel: hi there"


@pytest.mark.parametrize("speaker, date, want", [
    ("Caroline", None, "Caroline: x"),
    (None, "2023-05-08", "[2023-05-08] x"),
    (None, None, "x"),
    ("  ", "", "x"),
])
def test_missing_fields_degrade_gracefully(speaker, date, want):
    assert TurnTemplate().render("x", speaker, date) == want


def test_custom_templates_and_dates():
    t = TurnTemplate("{speaker} ({role}) said: {content}", date_format=None)
    assert t.render("hello", "Ann", role="user") == "Ann (user) said: hello"
    assert t.render("hello", None, role="user") == "(user) said: hello"
    raw = TurnTemplate("[{date}] {content}", date_format=None)
    assert raw.render("x", date="8 May, 2023") == "[8 May, 2023] x"  # kept as given
    assert TurnTemplate().render("x", date="sometime last spring") == "[sometime last spring] x"  # unrecognised: as given
    assert TurnTemplate(date_format="%d %b %Y").render("x", date=1683504000) == "[08 May 2023] x"  # unix seconds
    assert PLAIN.render("x", "Ann", "2023-05-08") == "x"


def test_session_date_is_the_fallback_and_blocks_show_it_once():
    t = TurnTemplate()
    turns = [{"role": "user", "content": "a", "speaker": "Ann"}, {"role": "assistant", "content": "b", "speaker": "Bo"},
             {"role": "user", "content": "c", "speaker": "Ann", "date": "2023-06-01"}]
    assert t.render_turns(turns, date="2023-05-08") == ["[2023-05-08] Ann: a", "[2023-05-08] Bo: b",
                                                       "[2023-06-01] Ann: c"]
    assert t.render_block(turns, date="2023-05-08") == "[2023-05-08] Ann: a\nBo: b\n[2023-06-01] Ann: c"
    assert turn_date({"date": " ", "timestamp": "t"}) == "t" and turn_date({}, "d") == "d"


def test_parse_date_formats():
    want = dt.datetime(2023, 5, 8, 13, 56)
    assert parse_date("1:56 pm on 8 May, 2023") == want
    assert parse_date("2023/05/08 (Mon) 13:56") == want
    assert parse_date("2023-05-08T13:56:00") == want
    assert parse_date(dt.date(2023, 5, 8)) == dt.datetime(2023, 5, 8)
    assert parse_date("not a date") is None and parse_date(None) is None and parse_date(True) is None


def test_template_validation_names_the_argument():
    for bad in ("{speaker}: no content", "{content} {user}", "{content!r}", "{content:>10}", "{content"):
        with pytest.raises(MemkernValueError, match="template"):
            TurnTemplate(bad)
    with pytest.raises(MemkernTypeError, match="template"):
        TurnTemplate(3)
    with pytest.raises(MemkernTypeError, match="template"):
        default_template(3.5)
    assert default_template("{content}") == PLAIN and default_template(None) == TurnTemplate()


def test_answer_prompt_shows_dates_of_remembered_turns():
    from memkern.ingest import prompts

    mem = [{"summary": "Caroline moved.", "turns": [
        {"role": "user", "speaker": "Caroline", "content": "Guess where I'm moving? Lisbon!", "date": "1:56 pm on 8 May, 2023"},
        {"role": "assistant", "content": "Wow.", "timestamp": "2023/05/09 (Tue) 10:00"}]}]
    text = prompts.answer_messages("When did Caroline move?", mem, max_turns_per_memory=2,
                                   selected_turns=True)[-1]["content"]
    assert "[2023-05-08] Caroline: Guess where I'm moving? Lisbon!" in text
    assert "[2023-05-09] assistant: Wow." in text  # no speaker: the role
