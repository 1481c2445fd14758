"""Topic extraction: the llm extractor's parsing / retry / fallback, the embedding extractor's
segmentation, coverage completion; real MiniLM and SmolLM2 runs on the bundled sample."""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from fakes_rmm import HashEmbedder, ScriptedChat
from memkern.errors import MemkernTypeError, MemkernValueError
from memkern.ingest.extract import (
    EmbeddingExtractor,
    LLMExtractor,
    SentenceExtractor,
    TextTilingExtractor,
    WindowExtractor,
    depth_scores,
    gap_similarities,
    tile_boundaries,
    Topic,
    complete_coverage,
    fallback_topic,
    make_extractor,
    parse_topics,
    validate_turns,
)

S1 = [
    {"role": "user", "content": "Hi! I work as a nurse at the city hospital."},
    {"role": "assistant", "content": "Nursing is hard work."},
    {"role": "user", "content": "My dog Pepper is a beagle. Pepper loves the beach."},
    {"role": "assistant", "content": "Beagles are lovely."},
]


@pytest.mark.parametrize(
    "value, want",
    [
        ({"topics": [{"summary": "A", "turns": [0, 2]}]}, [("A", [0, 2])]),
        ([{"summary": "A", "turns": [1]}], [("A", [1])]),  # bare list
        ({"summary": "A", "turns": [3]}, [("A", [3])]),  # single topic object
        ({"topics": [{"topic": "A", "turn_ids": ["1", "[2]"]}]}, [("A", [1, 2])]),  # key aliases, string indices
        ({"topics": [{"summary": "A", "turns": [9, -1, 1.0, True]}]}, [("A", [1])]),  # out of range, float, bool
        ({"topics": [{"summary": "A", "turns": 2}]}, [("A", [2])]),  # scalar turns
        ({"topics": [{"summary": "A", "turns": []}]}, [("A", [0, 1, 2, 3])]),  # no index: whole session
        ({"topics": ["A plain string topic"]}, [("A plain string topic", [0, 1, 2, 3])]),
        ({"topics": [{"summary": "  "}, {"summary": "B", "turns": [0]}, 5]}, [("B", [0])]),  # junk dropped
    ],
)
def test_parse_topics(value, want):
    got = parse_topics(value, 4)
    assert [(t.summary, t.turns) for t in got] == want


@pytest.mark.parametrize("value", [{"topics": []}, {"foo": 1}, [], {"topics": [{"turns": [0]}]}, "str"])
def test_parse_topics_rejects(value):
    with pytest.raises(MemkernValueError):
        parse_topics(value, 4)


def test_llm_extractor_batches_and_retries_only_failures(caplog):
    good = json.dumps({"topics": [{"summary": "The user is a nurse.", "turns": [0]}]})
    chat = ScriptedChat([good, "```json\n{'topics': [{'summary': 'The user has a dog.', 'turns': [2],}]}\n```",
                         "nonsense", "still nonsense"])
    ex = LLMExtractor(chat, max_new_tokens=50)
    with caplog.at_level(logging.WARNING, logger="memkern"):
        out = ex.extract_batch([S1, S1, S1])
    assert len(chat.calls) == 2
    assert len(chat.calls[0]["prompts"]) == 3 and len(chat.calls[1]["prompts"]) == 1  # only the failure retried
    assert chat.calls[0]["json"] is True and chat.calls[0]["max_new_tokens"] == 50
    assert out[0][0].summary == "The user is a nurse." and out[0][0].source == "llm"
    assert out[1][0].summary == "The user has a dog."
    assert [t.source for t in out[2]] == ["fallback"] and out[2][0].turns == [0, 1, 2, 3]
    # uncovered user turn 2 was attached to the nearest topic
    assert 2 in out[0][0].turns
    assert ex.last_stats == {"calls": 2, "retries": 1, "fallbacks": 1, "seconds": ex.last_stats["seconds"]}
    assert "fallback topic" in caplog.text


def test_llm_extractor_empty_session():
    chat = ScriptedChat([])
    assert LLMExtractor(chat).extract_batch([[]]) == [[]]
    assert chat.calls == []


def test_fallback_topic_keeps_user_statements():
    t = fallback_topic(S1)
    assert t.source == "fallback" and t.turns == [0, 1, 2, 3]
    assert "nurse" in t.summary and "Pepper" in t.summary and "Beagles are lovely" not in t.summary


def test_sentence_extractor_segments_and_is_deterministic():
    emb = HashEmbedder(64)
    ex = SentenceExtractor(emb, threshold=0.3)
    a = ex.extract(S1)
    b = SentenceExtractor(HashEmbedder(64), threshold=0.3).extract(S1)
    assert [(t.summary, t.turns) for t in a] == [(t.summary, t.turns) for t in b]
    assert all(t.source == "sentences" and t.summary.startswith("User said: ") for t in a)
    # every user turn is referenced, assistant replies follow their user turn
    assert {i for t in a for i in t.turns} == {0, 1, 2, 3}
    assert "Hi!" not in " ".join(t.summary for t in a)  # greeting dropped


def test_sentence_extractor_thresholds_bound_the_number_of_topics():
    emb = HashEmbedder(64)
    one = SentenceExtractor(emb, threshold=0.0, min_words=1).extract(S1)
    many = SentenceExtractor(emb, threshold=1.0, min_words=1).extract(S1)
    assert len(one) == 1 and one[0].turns == [0, 1, 2, 3]
    assert len(many) == 3  # one per salient sentence
    # one turn (2) feeds two topics
    assert sum(2 in t.turns for t in many) == 2


def test_sentence_extractor_skips_questions_and_short_filler():
    turns = [{"role": "user", "content": "Thanks! What do you think?"},
             {"role": "user", "content": "I moved to Berlin in March."}]
    out = SentenceExtractor(HashEmbedder(32)).extract(turns)
    assert [t.summary for t in out] == ["User said: I moved to Berlin in March."]
    assert out[0].turns == [0, 1]  # the filler turn is attached, not lost


def test_complete_coverage_adds_uncovered_statements():
    emb = HashEmbedder(64)
    topics = [Topic("The user works as a nurse at the city hospital.", [0, 1, 2, 3])]
    out = complete_coverage(topics, S1, emb.encode, threshold=0.45)
    assert out[0] is topics[0] and len(out) == 2
    assert out[1].source == "uncovered" and out[1].turns == [2] and "Pepper" in out[1].summary
    assert complete_coverage(topics, S1, emb.encode, threshold=-1.0) == topics


def test_validation_errors():
    with pytest.raises(MemkernTypeError, match="turns"):
        validate_turns("hello")
    with pytest.raises(MemkernTypeError, match=r"turns\[0\]\['role'\]"):
        validate_turns([{"role": 3, "content": "x"}])
    with pytest.raises(MemkernValueError, match="threshold"):
        SentenceExtractor(HashEmbedder(8), threshold=1.5)
    with pytest.raises(MemkernValueError, match="extractor"):
        make_extractor("rules")


# ------------------------------------------------------------------------------------ TextTiling / windows
class TopicEmbedder:
    """One fixed unit vector per topic word found in the text (a turn with no topic word: its own
    random direction), so that similarity drops exactly where the topic changes."""

    dim = 16

    def encode(self, texts, kind="passage"):
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            for k, w in enumerate(("cat", "job", "trip", "piano")):
                if w in t:
                    out[i, k] += 1.0
            if not out[i].any():
                out[i] = np.random.default_rng(len(t)).standard_normal(self.dim)
        return out


def _session(words):
    return [{"role": "user" if i % 2 == 0 else "assistant", "speaker": "Ann" if i % 2 == 0 else "Bo",
             "content": f"talking about my {w} again", "date": "1:56 pm on 8 May, 2023"} for i, w in enumerate(words)]


def test_gap_similarity_and_depth_hand_computed():
    e = np.array([[1, 0], [1, 0], [0, 1], [0, 1]], np.float32)
    sim = gap_similarities(e, window=1)
    assert np.allclose(sim, [1.0, 0.0, 1.0])
    # window 2 at the middle gap: mean([1,0],[1,0]) vs mean([0,1],[0,1])
    assert np.allclose(gap_similarities(e, window=2), [np.sqrt(0.5), 0.0, np.sqrt(0.5)], atol=1e-6)
    d = depth_scores(np.array([0.9, 0.2, 0.8, 0.7, 0.9], np.float32))
    # gap 1: peaks 0.9 (left) and 0.8 (right climbing stops at 0.8) -> 0.7 + 0.6
    assert d[1] == pytest.approx(1.3) and d[3] == pytest.approx(0.1 + 0.2) and d[0] == pytest.approx(0.0)


def test_tile_boundaries_deepest_gaps_with_size_bounds():
    depth = np.array([0.0, 0.1, 0.9, 0.0, 0.5, 0.0, 0.0], np.float32)  # 8 turns, gaps before turns 1..7
    assert tile_boundaries(depth, 8, 4, 2, 8) == [0, 3]  # one cut, the deepest gap
    assert tile_boundaries(depth, 8, 8 / 3, 2, 8) == [0, 3, 5]  # two cuts
    # a cut too close to another is skipped for the next deepest admissible one
    assert tile_boundaries(np.array([0.1, 0.9, 0.8, 0.0, 0.0], np.float32), 6, 2, 2, 6) == [0, 2, 4]
    # the maximum size forces a cut even without depth
    assert tile_boundaries(np.zeros(9, np.float32), 10, 10, 1, 4) == [0, 2, 5, 7]
    assert tile_boundaries(np.zeros(0, np.float32), 1, 4, 2, 8) == [0]


def test_texttiling_cuts_where_the_topic_changes():
    words = ["cat"] * 4 + ["job"] * 4 + ["trip"] * 4
    ex = TextTilingExtractor(TopicEmbedder(), target_turns=4, min_turns=2, max_turns=6, window=2)
    (topics,) = ex.extract_batch([_session(words)])
    assert [t.turns for t in topics] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert all(t.source == "embedding" for t in topics)
    # a topic's text is its turns through the template: the date once, then speaker-prefixed lines
    lines = topics[0].summary.split("\n")
    assert lines[0] == "[2023-05-08] Ann: talking about my cat again" and lines[1] == "Bo: talking about my cat again"
    # the shift moves with the content, where fixed windows would not
    words = ["cat"] * 3 + ["job"] * 5 + ["trip"] * 4
    (topics,) = ex.extract_batch([_session(words)])
    assert [t.turns[0] for t in topics] == [0, 3, 8]
    assert EmbeddingExtractor is TextTilingExtractor and make_extractor("embedding", embedder=TopicEmbedder()).name == "embedding"


def test_texttiling_bounds_and_validation():
    ex = TextTilingExtractor(TopicEmbedder(), target_turns=3, min_turns=2, max_turns=4)
    (topics,) = ex.extract_batch([_session(["cat"] * 11)])
    sizes = [len(t.turns) for t in topics]
    assert sum(sizes) == 11 and min(sizes) >= 2 and max(sizes) <= 4
    assert [i for t in topics for i in t.turns] == list(range(11))  # contiguous cover, in order
    assert ex.extract([]) == [] and len(ex.extract(_session(["cat"]))) == 1
    for kw, name in ((dict(min_turns=0), "min_turns"), (dict(min_turns=3, max_turns=4), "max_turns"),
                     (dict(target_turns=20), "target_turns"), (dict(window=0), "window")):
        with pytest.raises(MemkernValueError, match=name):
            TextTilingExtractor(TopicEmbedder(), **kw)


def test_window_extractor_sizes_and_overlap():
    s = _session(["cat"] * 10)
    w = WindowExtractor(size=4)
    assert [t.turns for t in w.extract(s)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    o = make_extractor("window", size=4, overlap=2)
    assert [t.turns for t in o.extract(s)] == [[0, 1, 2, 3], [2, 3, 4, 5], [4, 5, 6, 7], [6, 7, 8, 9]]
    assert o.extract(s)[0].summary.startswith("[2023-05-08] Ann: ") and o.extract([]) == []
    with pytest.raises(MemkernValueError, match="overlap"):
        WindowExtractor(size=4, overlap=4)
    with pytest.raises(MemkernValueError, match="size"):
        WindowExtractor(size=0)


# ------------------------------------------------------------------------------------ real models
@pytest.fixture(scope="module")
def sample():
    from memkern.cli.common import load_sessions, sample_conversation_path

    return load_sessions(sample_conversation_path())


@pytest.mark.slow
def test_sentence_extractor_real_minilm(sample):
    from memkern.models import Embedder

    ex = SentenceExtractor(Embedder())
    topics = ex.extract_batch([s["turns"] for s in sample])
    assert len(topics) == 8 and all(topics)
    s1 = [t.summary for t in topics[0]]
    nurse = [s for s in s1 if "nurse" in s]
    dog = [s for s in s1 if "Pepper" in s]
    assert nurse and dog and nurse[0] != dog[0]  # two subjects, two topics
    again = ex.extract_batch([s["turns"] for s in sample])
    assert [[t.summary for t in ts] for ts in again] == [[t.summary for t in ts] for ts in topics]


@pytest.mark.slow
def test_llm_extractor_real_smollm2(sample):
    from memkern.models import ChatModel

    ex = LLMExtractor(ChatModel(), max_new_tokens=96)
    out = ex.extract_batch([sample[0]["turns"], sample[3]["turns"]])
    assert len(out) == 2 and all(out)
    for topics, s in zip(out, (sample[0], sample[3])):
        for t in topics:
            assert t.summary and all(0 <= i < len(s["turns"]) for i in t.turns)
    assert ex.last_stats["calls"] >= 1
