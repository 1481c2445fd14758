"""memkern.store.reference: the tokeniser specification, BM25 reference and fusion (issue 13 item 5)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from memkern import MemkernTypeError, MemkernValueError
from memkern.store import reference as lx

# ---------------------------------------------------------------------------- tokeniser reference


def test_tokenize_basic_lowercase_split_and_stop_words():
    assert lx.tokenize("Caroline moved to BERLIN on 2023-05-08.") == ["caroline", "moved", "berlin", "2023", "05", "08"]
    assert lx.tokenize("Caroline's dog") == ["caroline", "dog"]          # 's' is a stop word
    assert lx.tokenize("Caroline's dog", keep_stop_words=True) == ["caroline", "s", "dog"]
    assert lx.tokenize("") == []
    assert lx.tokenize("   ,,;; ") == []
    assert lx.tokenize("the and of") == []


def test_tokenize_unicode_scripts():
    assert lx.tokenize("Ärger MÜNCHEN Łódź") == ["ärger", "münchen", "łódź"]
    assert lx.tokenize("ΟΔΥΣΣΕΥΣ Άθήνα") == ["οδυσσευσ", "άθήνα"]        # final sigma folded
    assert lx.tokenize("Ἀθῆναι") == ["Ἀθῆναι"]                         # Greek Extended: not lowercased (spec)
    assert lx.tokenize("Москва ЁЛКА") == ["москва", "ёлка"]
    assert lx.tokenize("東京タワー") == ["東", "京", "タ", "ワ", "ー"]      # one token per ideograph / kana
    assert lx.tokenize("한국어 텍스트") == ["한국어", "텍스트"]
    assert lx.tokenize("ＡＢＣ１２") == ["ａｂｃ１２"]
    assert lx.tokenize("café") == ["café"]                         # combining acute stays inside
    assert lx.tokenize("İstanbul") == ["istanbul"]
    assert lx.tokenize("a😀b—c") == ["b", "c"]                          # emoji and dash separate ('a' is a stop word)


def test_lowercase_table_agrees_with_str_lower_on_its_ranges():
    ranges = [(0x41, 0x5A), (0xC0, 0xDE), (0x100, 0x17F), (0x386, 0x3AB), (0x400, 0x4FF), (0xFF21, 0xFF3A)]
    checked = 0
    for lo, hi in ranges:
        for c in range(lo, hi + 1):
            if c in (0x130,):
                continue
            expect = chr(c).lower()
            assert len(expect) == 1, hex(c)
            assert lx.lower_code_point(c) == ord(expect), hex(c)
            checked += 1
    assert checked == 504
    assert lx.lower_code_point(0x130) == ord("i")
    assert lx.lower_code_point(0x3C2) == 0x3C3
    # outside the table: identity, even where str.lower would map (Armenian, Georgian, Latin Ext-B)
    for c in (0x531, 0x10A0, 0x1E00, 0x180, 0x3CF, 0x500):
        assert lx.lower_code_point(c) == c


def test_char_classes_table_is_sorted_and_disjoint():
    prev = -1
    for lo, hi, cls in lx.CHAR_CLASSES:
        assert lo > prev and hi >= lo and cls in (lx.WORD, lx.IDEO)
        prev = hi
    assert lx.char_class(ord("a")) == lx.WORD and lx.char_class(ord("-")) == 0
    assert lx.char_class(0x4E2D) == lx.IDEO and lx.char_class(0x1F600) == 0


def test_tokenize_rejects_non_str():
    with pytest.raises(MemkernTypeError, match="text"):
        lx.tokenize(b"bytes")


def test_stop_words_fixed_and_lowercase():
    assert isinstance(lx.STOP_WORDS, frozenset)
    assert all(w == w.lower() and lx.tokenize(w, keep_stop_words=True) == [w] for w in lx.STOP_WORDS)
    for content in ("caroline", "berlin", "2023", "dog", "moved"):
        assert content not in lx.STOP_WORDS

# ---------------------------------------------------------------------------- BM25 reference


def _bm25_by_hand(q, docs, k1=1.2, b=0.75):
    n = len(docs)
    avgdl = sum(len(d) for d in docs) / n
    out = []
    for d in docs:
        s = 0.0
        for t in set(q):
            df = sum(t in x for x in docs)
            tf = d.count(t)
            if tf:
                idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
                s += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(d) / avgdl))
        out.append(s)
    return out


def test_bm25_matches_formula_and_ranks_rare_terms_higher():
    docs = ["Caroline adopted a dog in Berlin", "Melanie painted a lake", "dog dog dog walk",
            "Caroline went to a support group", ""]
    got = lx.bm25_scores("Caroline dog", docs)
    want = _bm25_by_hand(lx.tokenize("Caroline dog"), [lx.tokenize(d) for d in docs])
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert got.dtype == np.float64 and got[1] == 0.0 and got[4] == 0.0
    assert got[0] > got[3] > 0 and got[0] > got[2] > 0
    # repeated query terms count once
    np.testing.assert_allclose(lx.bm25_scores("dog dog Caroline", docs), got, rtol=1e-12)
    assert lx.bm25_scores("x", []).shape == (0,)
    assert np.all(lx.bm25_scores("dog", ["", ""]) == 0)


def test_bm25_length_normalisation():
    s = lx.bm25_scores(["x"], [["x"], ["x", "y", "z", "w"]])
    assert s[0] > s[1] > 0
    s_nob = lx.bm25_scores(["x"], [["x"], ["x", "y", "z", "w"]], b=0.0)
    assert s_nob[0] == pytest.approx(s_nob[1])

# ---------------------------------------------------------------------------- fusion


def test_rrf():
    ids, sc = lx.rrf([[5, 3, -1], [3, 7]], weights=[0.5, 0.5])
    assert ids.tolist() == [3, 5, 7]
    np.testing.assert_allclose(sc, [0.5 / 62 + 0.5 / 61, 0.5 / 61, 0.5 / 62])
    ids, sc = lx.rrf([[1, 2], [2, 1]])  # tie: id ascending
    assert ids.tolist() == [1, 2] and sc[0] == sc[1]
    with pytest.raises(MemkernValueError, match="weights"):
        lx.rrf([[1]], weights=[1, 2])


def test_weighted_fusion():
    ids, sc = lx.weighted_fusion([([1, 2, 3], [0.9, 0.5, 0.1]), ([3, 4], [10.0, 10.0])], weights=[0.3, 0.7])
    got = dict(zip(ids.tolist(), sc.tolist()))
    assert got == pytest.approx({1: 0.3, 2: 0.3 * 0.5, 3: 0.7, 4: 0.7})
    assert ids.tolist() == [3, 4, 1, 2]
    ids, sc = lx.weighted_fusion([([-1, -1], [0.0, 0.0])])
    assert ids.size == 0



# ---------------------------------------------------------------------------- coverage


def test_coverage_scores_by_hand():
    docs = ["nadia booked what", "kwame moving flat", "nadia moving lisbon", "weather"]
    sc = lx.coverage_scores("Nadia moving moving city", docs)
    N = 4
    idf = {t: math.log(1 + (N - df + 0.5) / (df + 0.5)) for t, df in (("nadia", 2), ("moving", 2), ("city", 0))}
    total = idf["nadia"] + idf["moving"] + idf["city"]  # "moving" once; "city" (df 0) only here
    np.testing.assert_allclose(sc, [idf["nadia"] / total, idf["moving"] / total,
                                    (idf["nadia"] + idf["moving"]) / total, 0.0], rtol=1e-15)
    # no length normalisation, no term frequency: a longer text holding the same terms scores the same
    sc2 = lx.coverage_scores("nadia", ["nadia nadia", "nadia talks about a very long list of other things"])
    assert sc2[0] == sc2[1] == 1.0
    assert lx.coverage_scores("", docs).tolist() == [0.0] * 4
    assert lx.coverage_scores("x", []).shape == (0,)


def test_coverage_fusion_by_hand():
    ids, sc = lx.coverage_fusion(([5, 6, 7, -1], [0.9, 0.5, 0.1, 0.0]), ([7, 8, -1], [0.5, 0.25, 0.0]), 0.4)
    want = {5: 0.6 * 1.0, 6: 0.6 * 0.5, 7: 0.6 * 0.0 + 0.4 * 1.0, 8: 0.4 * 0.5}  # coverage / its best (0.5)
    assert ids.tolist() == sorted(want, key=lambda i: (-want[i], i))
    np.testing.assert_allclose(sc, sorted(want.values(), reverse=True), rtol=1e-15)
    ids, sc = lx.coverage_fusion(([3, 4], [0.2, 0.2]), ([], []), 0.5)  # equal dense scores normalise to 1
    assert ids.tolist() == [3, 4] and sc.tolist() == [0.5, 0.5]


def test_hybrid_defaults_are_the_measured_ones():
    """The store's hybrid defaults are the setting bench/bench_lexical.py chose on tuning seeds."""
    import inspect

    from memkern.store import MemoryStore

    p = inspect.signature(MemoryStore.search).parameters
    assert p["fusion"].default == lx.DEFAULT_FUSION == "coverage"
    assert p["lexical_weight"].default == lx.DEFAULT_LEXICAL_WEIGHT == 0.35
    assert lx.FUSIONS == {"rrf": 0, "weighted": 1, "coverage": 2}
