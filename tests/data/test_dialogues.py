"""memkern.data.generate_dialogues: LoCoMo-shaped multi-party dialogues with paraphrased questions."""
from __future__ import annotations

import re

import numpy as np
import pytest

from memkern.data import Dataset, generate_dialogues, generate_history
from memkern.data.dialogues import (DIALOGUE_CATEGORIES, content_overlap, content_words, format_session_date,
                                    parse_session_date)
from memkern.errors import MemkernValueError


@pytest.fixture(scope="module")
def ds():
    return generate_dialogues(6, 12, seed=1)


def _mean_overlap(d: Dataset) -> float:
    vals = []
    for c, q in d.questions():
        tm = c.turn_map()
        if q.evidence_turn_ids:
            vals.append(content_overlap(q.question, [tm[e].content for e in q.evidence_turn_ids]))
    return float(np.mean(vals))


def test_deterministic_per_seed():
    a, b = generate_dialogues(3, 8, seed=5), generate_dialogues(3, 8, seed=5)
    assert a.to_dict() == b.to_dict()
    assert a.content_hash() != generate_dialogues(3, 8, seed=6).content_hash()


def test_schema_valid_and_round_trips(ds):
    ds.validate()
    assert Dataset.from_dict(ds.to_dict()).content_hash() == ds.content_hash()
    for c in ds.conversations:
        assert [s.session_id for s in c.sessions] == [f"session_{i + 1}" for i in range(12)]
        speakers = {t.speaker for t in c.turns()}
        assert 2 <= len(speakers) <= 3 and all(isinstance(s, str) and s[0].isupper() for s in speakers)
        for s in c.sessions:
            for k, t in enumerate(s.turns):
                assert t.turn_id == f"D{s.session_id.split('_')[1]}:{k + 1}" and t.turn_index == k
                assert t.session_id == s.session_id and t.date == s.date


def test_evidence_ids_exist_and_categories(ds):
    cats = set()
    for c, q in ds.questions():
        tm = c.turn_map()
        assert q.evidence_turn_ids, q
        assert q.question_type in DIALOGUE_CATEGORIES
        cats.add(q.question_type)
        assert q.evidence_session_ids == list(dict.fromkeys(tm[e].session_id for e in q.evidence_turn_ids))
        if q.question_type == "adversarial":
            assert q.answer == "not mentioned"
            # asks about someone who is not the speaker of the evidence
            assert not any(tm[e].speaker in q.question for e in q.evidence_turn_ids)
        elif q.question_type != "temporal":
            # the answer is stated in the evidence (temporal answers are computed from dates)
            assert any(q.answer.split()[-1].lower() in tm[e].content.lower() for e in q.evidence_turn_ids), q
    assert cats == set(DIALOGUE_CATEGORIES)


# Lexical overlap of questions with their evidence on LoCoMo's development split (conv-26, conv-30,
# conv-41; 383 questions of categories 1-4): share of questions with a content word in common with
# their evidence, and the mean share of a question's content words found in its evidence.
LOCOMO_DEV_SHARE, LOCOMO_DEV_MEAN = 0.789, 0.320


def _overlaps(ds):
    out = []
    for c, q in ds.questions():
        if q.question_type == "adversarial":
            continue
        tm = c.turn_map()
        out.append(content_overlap(q.question, [tm[e].content for e in q.evidence_turn_ids]))
    return np.asarray(out)


def test_questions_overlap_their_evidence_like_real_ones():
    # default: about as many questions share words with their evidence as on LoCoMo (which is why
    # BM25 over the turns helps there); echo=0: paraphrases only, lexically disjoint
    ov = np.concatenate([_overlaps(generate_dialogues(6, 12, seed=s)) for s in range(3)])
    assert abs(np.mean(ov > 0) - LOCOMO_DEV_SHARE) < 0.15, np.mean(ov > 0)
    assert abs(ov.mean() - LOCOMO_DEV_MEAN) < 0.1, ov.mean()
    para = np.concatenate([_overlaps(generate_dialogues(6, 12, seed=s, echo=0.0)) for s in range(3)])
    assert para.mean() < 0.08, para.mean()
    old = np.mean([_mean_overlap(generate_history(6, 30, seed=s)) for s in range(3)])
    assert para.mean() < 0.5 * old, (para.mean(), old)
    # every question names the person it asks about (97% do on LoCoMo)
    for c, q in generate_dialogues(2, 8, seed=4).questions():
        assert any(t.speaker in q.question for t in c.turns()), q.question
    assert content_overlap("Where is Lisbon?", ["Lisbon!"]) == 1.0
    assert content_words("What is Nadia's dog called?") == {"nadia", "dog", "called"}
    with pytest.raises(MemkernValueError, match="echo"):
        generate_dialogues(1, 6, echo=1.5)


# Mean words per turn and turns per session on LoCoMo's development split.
LOCOMO_DEV_WORDS, LOCOMO_DEV_TURNS_PER_SESSION = 27.3, 20.8


def test_turns_and_sessions_have_real_lengths():
    # chatty turns of about LoCoMo's length: in 7-word turns the template's speaker name and date
    # dominate a turn's embedding (and content-only vectors look better than they are on real data)
    ds = generate_dialogues(4, 10, seed=2)
    words = [len(t.content.split()) for c in ds.conversations for t in c.turns()]
    per_session = [len(s.turns) for c in ds.conversations for s in c.sessions]
    assert abs(np.mean(words) - LOCOMO_DEV_WORDS) < 8, np.mean(words)
    assert abs(np.mean(per_session) - LOCOMO_DEV_TURNS_PER_SESSION) < 6, np.mean(per_session)
    bare = generate_dialogues(4, 10, seed=2, chat=False, filler_per_session=(1, 3))
    assert np.mean([len(t.content.split()) for c in bare.conversations for t in c.turns()]) < 10


def test_evidence_needs_neighbouring_turn():
    # teaser / other speaker's question / answer: the answer turn alone shares nothing with the
    # (paraphrased) question and does not say what it answers; the evidence holds the teaser too.
    ds = generate_dialogues(4, 12, seed=0, echo=0.0)
    found = 0
    for c, q in ds.questions():
        if q.question_type != "single-hop" or len(q.evidence_turn_ids) != 2:
            continue
        tm = c.turn_map()
        t0, t1 = (tm[e] for e in q.evidence_turn_ids)
        sess = next(s for s in c.sessions if s.session_id == t0.session_id)
        if t1.session_id != t0.session_id or t1.turn_index != t0.turn_index + 2:
            continue
        mid = sess.turns[t0.turn_index + 1]
        assert mid.speaker != t0.speaker == t1.speaker and mid.content.endswith("?")
        assert q.answer.split()[-1].lower() not in t0.content.lower()
        assert content_overlap(q.question, [t1.content]) == 0.0
        found += 1
    assert found >= len(ds.conversations) * 2, found


def test_distractors_about_same_entities(ds):
    for c in ds.conversations:
        ev = {e for q in c.questions for e in q.evidence_turn_ids}
        people = {t.speaker for t in c.turns()}
        for q in c.questions:
            p = next(x for x in people if x in q.question)
            # the same person talks about other things in turns that are not evidence
            assert sum(1 for t in c.turns() if t.speaker == p and t.turn_id not in ev) >= 3
            if q.question_type == "single-hop" and q.answer[:1].isupper() and " " not in q.answer:
                # pet names: mentioned again outside the evidence
                if "called" in q.question or "name" in q.question:
                    assert any(q.answer in t.content for t in c.turns() if t.turn_id not in ev), q
        # each speaker's first home city is mentioned by another person in a non-evidence turn
        homes = re.findall(r"how long have you been in (\w+) now", " ".join(t.content for t in c.turns()))
        assert homes
        for city in homes:
            assert sum(1 for t in c.turns() if city in t.content and t.turn_id not in ev) >= 2


def test_dates_parse(ds):
    for c in ds.conversations:
        ds_dates = [parse_session_date(s.date) for s in c.sessions]
        assert all(a < b for a, b in zip(ds_dates, ds_dates[1:]))
        for q in c.questions:
            assert parse_session_date(q.question_date) > ds_dates[-1]
            m = re.fullmatch(r"the (\w+) before (\d+ \w+, \d+) \((\d+ \w+, \d+)\)", q.answer)
            if m:  # relative answers name a real weekday before the session date
                ref, d = (parse_session_date("12:00 pm on " + x) for x in m.group(2, 3))
                assert d.strftime("%A") == m.group(1) and 0 < (ref - d).days <= 7
    import datetime as dt

    d = dt.datetime(2023, 5, 8, 13, 56)
    assert format_session_date(d) == "1:56 pm on 8 May, 2023" and parse_session_date(format_session_date(d)) == d


@pytest.mark.parametrize("kw, arg", [(dict(n_conversations=0), "n_conversations"), (dict(sessions=3), "sessions"),
                                     (dict(seed=-1), "seed"), (dict(speakers=(1, 3)), "speakers"),
                                     (dict(filler_per_session=(2, 1)), "filler_per_session"),
                                     (dict(start_date="May 8"), "start_date")])
def test_bad_arguments(kw, arg):
    with pytest.raises(MemkernValueError, match=arg):
        generate_dialogues(**kw)


@pytest.mark.slow
def test_eval_loads_dialogues_and_cli_option(tmp_path, capsys):
    import json

    from memkern.cli import main
    from memkern.eval import data

    d = data.load_dataset("dialogues", users=2, sessions=6, seed=4)
    assert d.content_hash() == generate_dialogues(2, 6, seed=4).content_hash()
    with pytest.raises(MemkernValueError, match="source"):
        data.load_dataset("dialogs")
    rc = main(["eval", "memory", "granularity", "--data", "dialogues", "--users", "1", "--sessions", "6", "--seeds",
               "0", "--granularities", "turn", "chunk4", "--out", str(tmp_path), "--quiet",
               "--cache-dir", str(tmp_path / "cache")])
    assert rc == 0
    assert "dialogues-1x6-seed0" in capsys.readouterr().out
    (p,) = tmp_path.glob("granularity-*.json")
    res = json.loads(p.read_text())
    assert res["dataset"][0]["name"] == "dialogues-1x6-seed0"
    assert set(res["metrics_mean"]["turn"]["by_type"]) <= set(DIALOGUE_CATEGORIES)
