"""Lexical and hybrid search inside the native store (issue 13 item 5): the C++ tokeniser against
the Python reference, BM25 against the float64 reference, fusion, index maintenance on every
write, persistence across reopen and after injected faults. The tests taking ``make_store`` also
run on InMemoryStore (tests/conftest.py)."""
from __future__ import annotations

import random
import shutil

import numpy as np
import pytest

from memkern import MemkernError, MemkernTypeError, MemkernValueError
from memkern.store import reference as lx
from memkern.store import PAD_SCORE, MemoryStore

from store_faults_common import D, _no_fault, emb, native  # noqa: E402,F401  (_no_fault: autouse)

# ---------------------------------------------------------------------------- tokeniser twin


_POOLS = [
    (0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x52F), (0x530, 0x6FF),
    (0x900, 0x97F), (0xE00, 0xE7F), (0x1E00, 0x1FFF), (0x2000, 0x206F), (0x3000, 0x30FF),
    (0x4E00, 0x4E80), (0xAC00, 0xAC80), (0xFF00, 0xFFEF), (0x1F300, 0x1F64F), (0x10000, 0x1007F),
    (0x20000, 0x20080), (0xE000, 0xE010),
]


def _fuzz_string(rng: random.Random) -> str:
    out = []
    for _ in range(rng.randrange(0, 40)):
        r = rng.random()
        if r < 0.15:
            out.append(rng.choice([" ", ",", "'", "-", ".", "\n", "\t"]))
        elif r < 0.25:
            out.append(rng.choice(sorted(lx.STOP_WORDS)).upper() if rng.random() < 0.3 else rng.choice(sorted(lx.STOP_WORDS)))
        elif r < 0.3:
            c = rng.randrange(0x110000)
            out.append(chr(c) if not 0xD800 <= c <= 0xDFFF else "x")
        else:
            lo, hi = rng.choice(_POOLS)
            out.append(chr(rng.randrange(lo, hi + 1)))
    return "".join(out)


def test_cpp_tokenizer_matches_reference_on_fuzzed_unicode():
    tok = native()._tokenize
    rng = random.Random(13)
    for _ in range(3000):
        s = _fuzz_string(rng)
        assert tok(s) == lx.tokenize(s), repr(s)
        assert tok(s, True) == lx.tokenize(s, keep_stop_words=True), repr(s)


@pytest.mark.slow
def test_cpp_tokenizer_matches_reference_on_every_code_point():
    """Each code point between two letters: lowercase map and class table agree everywhere."""
    tok = native()._tokenize
    for lo in range(0, 0x110000, 0x10000):
        cps = [c for c in range(lo, lo + 0x10000) if not 0xD800 <= c <= 0xDFFF]
        s = " ".join("q" + chr(c) + "z" for c in cps)
        assert tok(s, True) == lx.tokenize(s, keep_stop_words=True), hex(lo)


def test_cpp_tokenizer_rejects_invalid_utf8():
    tok = native()._tokenize
    assert tok("Héllo Wörld".encode()) == ["héllo", "wörld"]
    for bad in (b"ab\xffcd", b"\xc0\xaf", b"\xed\xa0\x80", b"abc\xe2\x82", b"\xf4\x90\x80\x80"):
        with pytest.raises(MemkernValueError, match="text"):
            tok(bad)
    with pytest.raises(MemkernValueError, match="text"):
        tok("\ud800")
    with pytest.raises(MemkernValueError, match="text"):
        tok(5)

# ---------------------------------------------------------------------------- BM25 in the store


VOCAB = ["caroline", "melanie", "berlin", "paris", "dog", "cat", "painting", "lake", "support", "group",
         "adopted", "moved", "2023", "may", "camping", "the", "a", "and", "of", "Berlin's", "Ärger", "東京"]


def _texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(VOCAB) for _ in range(rng.randrange(0, 12))) for _ in range(n)]


def _ranked(scores: np.ndarray, k: int) -> tuple[list[int], list[float]]:
    order = sorted((i for i in range(len(scores)) if scores[i] > 0), key=lambda i: (-scores[i], i))[:k]
    return order, [scores[i] for i in order]


def test_lexical_search_matches_float64_bm25(make_store):
    texts = _texts(300, 1)
    with make_store(D) as s:
        ids = s.add_batch("u", texts, np.stack([emb(i) for i in range(len(texts))]))
        s.add("other", "caroline dog caroline", emb(999))  # another namespace: never counted or returned
        queries = ["Caroline dog", "berlin paris 2023", "東京 lake", "the and", "zebra"]
        got_ids, got_sc = s.search("u", None, k=40, mode="lexical", texts=queries)
        assert got_ids.shape == (5, 40) and got_sc.dtype == np.float32
        for b, q in enumerate(queries):
            ref = lx.bm25_scores(q, texts)
            order, sc = _ranked(ref, 40)
            assert [int(ids[i]) for i in order] == got_ids[b, :len(order)].tolist(), q
            np.testing.assert_allclose(got_sc[b, :len(order)], sc, rtol=1e-6)
            assert (got_ids[b, len(order):] == -1).all() and (got_sc[b, len(order):] == PAD_SCORE).all()
        # stop-word-only and unknown queries hit nothing
        assert (got_ids[3] == -1).all() and (got_ids[4] == -1).all()


def test_lexical_turn_level_uses_turn_text(make_store):
    with make_store(D) as s:
        s.add("u", "summary about painting", emb(0), [{"role": "user", "content": "I adopted a dog"},
                                                      {"role": "user", "content": "Caroline went camping"}],
              turn_embeddings=np.stack([emb(1), emb(2)]))
        ids, _ = s.search("u", None, k=3, mode="lexical", texts=["camping"], level="turn")
        r = s.get(int(ids[0, 0]))
        assert r.level == "turn" and r.summary == "Caroline went camping" and ids[0, 1] == -1
        ids, _ = s.search("u", None, k=3, mode="lexical", texts=["camping"], level="topic")
        assert (ids == -1).all()
        ids, _ = s.search("u", None, k=3, mode="lexical", texts=["painting"], level="topic")
        assert ids[0, 0] == 0


def test_index_follows_every_write(make_store):
    """add / merge / update / invalidate / delete each change what lexical search sees."""
    def hit(s, text, **kw):
        ids, _ = s.search("u", None, k=10, mode="lexical", texts=[text], **kw)
        return sorted(int(i) for i in ids[0] if i >= 0)

    with make_store(D) as s:
        a = s.add("u", "Caroline adopted a dog", emb(0))
        b = s.add("u", "Melanie painted a lake", emb(1))
        assert hit(s, "dog") == [a] and hit(s, "lake") == [b]
        s.update(a, summary="Caroline adopted a cat")
        assert hit(s, "dog") == [] and hit(s, "cat") == [a]
        s.merge(b, "Melanie painted a lake and a dog", emb(2))
        assert hit(s, "dog") == [b]
        s.update(b, meta={"x": 1})  # no summary change: still indexed
        assert hit(s, "dog") == [b]
        s.invalidate(b, "stale")
        assert hit(s, "dog") == [] and hit(s, "dog", include_invalidated=True) == [b]
        s.delete(a)
        assert hit(s, "cat") == [] and hit(s, "cat", include_invalidated=True) == []
        s.compact()
        assert hit(s, "lake", include_invalidated=True) == [b]


def _all_lexical(s: MemoryStore) -> list:
    out = []
    for ns in s.namespaces():
        for level in ("topic", "turn"):
            ids, sc = s.search(ns, None, k=50, mode="lexical", level=level, include_invalidated=True,
                               texts=["caroline dog berlin", "lake painting 2023", "東京 support"])
            out.append((ns, level, ids.tolist(), np.round(sc.astype(np.float64), 4).tolist()))
    return out


def _fill(s: MemoryStore) -> None:
    texts = _texts(40, 2)
    t = s.add_batch("u", texts[:30], np.stack([emb(i) for i in range(30)]),
                    turns=[[{"role": "user", "content": t}] for t in texts[:30]],
                    turn_embeddings=[emb(100 + i)[None, :] for i in range(30)])
    s.add_batch("v", texts[30:], np.stack([emb(i) for i in range(30, 40)]))
    assert t.tolist() == list(range(0, 60, 2))  # topic 2i, its turn record 2i + 1
    s.update(2, summary="caroline dog berlin")
    s.merge(4, "lake painting", emb(500))
    s.invalidate(6, "x")
    s.delete(8)


def test_lexical_index_survives_reopen_log_and_snapshot(tmp_path):
    p = tmp_path / "s"
    with MemoryStore(p, dim=D, snapshot_every=0) as s:
        _fill(s)
        before = _all_lexical(s)
        shutil.copytree(p, tmp_path / "crash")  # as if killed now: log replay only
    with MemoryStore(tmp_path / "crash") as s:
        assert s._native.replayed_entries > 0
        assert _all_lexical(s) == before
    with MemoryStore(p) as s:  # closed cleanly: snapshot
        assert s._native.replayed_entries == 0
        assert _all_lexical(s) == before
        s.compact()
    with MemoryStore(p) as s:
        assert _all_lexical(s) == before


def _derived_view(s: MemoryStore) -> list:
    """Everything the derived indexes answer: BM25, a metadata filter, a time range."""
    out = _all_lexical(s)
    for ns in s.namespaces():
        ids, _ = s.search(ns, emb(3), k=50, filter={"tag": {"$in": ["a", "b"]}}, include_invalidated=True)
        out.append((ns, "filter", sorted(ids[0][ids[0] >= 0].tolist())))
        ids, _ = s.search(ns, emb(3), k=50, time_range=(0, 2e9), time_field="created", include_invalidated=True)
        out.append((ns, "time", sorted(ids[0][ids[0] >= 0].tolist())))
    return out


def _writes_after_open(s: MemoryStore) -> None:
    s.add("u", "caroline dog berlin again", emb(700), meta={"tag": "a"})
    s.add_batch("v", ["lake painting 2023 once more", "東京 support"], np.stack([emb(701), emb(702)]),
                metas=[{"tag": "b"}, {"tag": "c"}])
    s.update(12, summary="caroline lake", meta={"tag": "b"})
    s.invalidate(14, "stale")
    s.delete(16)


def test_a_reopened_store_builds_its_derived_indexes_on_first_use(tmp_path):
    """Opened from a snapshot, a store builds its BM25 / meta / time indexes on the first call that
    reads them: log replay and writes before that call are in them, deletes are not, exactly as
    in a copy of the store that built them first and wrote after."""
    p = tmp_path / "s"
    with MemoryStore(p, dim=D, snapshot_every=0) as s:
        _fill(s)
        s.update(10, meta={"tag": "a"})
    with MemoryStore(p, snapshot_every=0) as s:    # a snapshot, then log entries after it
        s.update(20, meta={"tag": "b"})
        for name in ("first-use-now", "first-use-later"):
            shutil.copytree(p, tmp_path / name)      # as if killed now: the log is replayed
    with MemoryStore(tmp_path / "first-use-now", snapshot_every=0) as a:
        _derived_view(a)                             # built now, before the writes
        _writes_after_open(a)
        want = _derived_view(a)
    with MemoryStore(tmp_path / "first-use-later", snapshot_every=0) as b:
        assert b._native.replayed_entries > 0
        _writes_after_open(b)                        # before anything reads the derived state
        assert _derived_view(b) == want
    assert any(x[2] for x in want if x[1] == "filter") and any(x[2] for x in want if x[1] == "time")


@pytest.mark.parametrize("spec", ["write:1", "short:1", "fsync:1"])
@pytest.mark.parametrize("op", ["add", "update", "merge", "delete"])
def test_failed_write_leaves_the_lexical_index_unchanged(tmp_path, op, spec):
    p = tmp_path / "s"
    with MemoryStore(p, dim=D, snapshot_every=0) as s:
        _fill(s)
    s = MemoryStore(p, snapshot_every=0)
    before = _all_lexical(s)
    ops = {
        "add": lambda: s.add("u", "caroline dog berlin lake", emb(900)),
        "update": lambda: s.update(0, summary="caroline dog dog dog"),
        "merge": lambda: s.merge(10, "東京 support group", emb(901)),
        "delete": lambda: s.delete(2),
    }
    native()._test_set_fault(spec)
    with pytest.raises(MemkernError):
        ops[op]()
    native()._test_set_fault("")
    assert _all_lexical(s) == before
    if not s._native.poisoned:
        ops[op]()  # the same write now lands
        after = _all_lexical(s)
        assert after != before
    else:
        after = before
    s.close()
    with MemoryStore(p) as s2:
        assert _all_lexical(s2) == after

# ---------------------------------------------------------------------------- fusion


def test_hybrid_fusion_matches_reference(make_store):
    texts = _texts(200, 3)
    with make_store(D, "cos") as s:
        s.add_batch("u", texts, np.stack([emb(i) for i in range(len(texts))]))
        q = np.stack([emb(1000 + b) for b in range(4)])
        qt = ["caroline dog", "berlin lake", "painting 2023 may", "zebra"]
        C = 30
        dids, dsc = s.search("u", q, k=C)
        lids, lsc = s.search("u", q, k=C, mode="lexical", texts=qt)
        for w in (0.0, 0.3, 1.0):
            hids, hsc = s.search("u", q, k=10, mode="hybrid", texts=qt, lexical_weight=w, candidates=C,
                                 fusion="rrf")
            wids, wsc = s.search("u", q, k=10, mode="hybrid", texts=qt, lexical_weight=w, candidates=C,
                                 fusion="weighted")
            for b in range(4):
                rid, rsc = lx.rrf([dids[b], lids[b]], weights=[1 - w, w])
                keep = rsc > 0 if w in (0.0, 1.0) else np.ones(len(rid), bool)
                rid, rsc = rid[keep][:10], rsc[keep][:10]
                assert hids[b, :len(rid)].tolist() == rid.tolist(), (w, b)
                np.testing.assert_allclose(hsc[b, :len(rid)], rsc, rtol=1e-5)
                rid, rsc = lx.weighted_fusion([(dids[b], dsc[b]), (lids[b], lsc[b])], weights=[1 - w, w])
                got = dict(zip(wids[b].tolist(), wsc[b].tolist()))
                for i, sc in zip(rid[:10].tolist(), rsc[:10].tolist()):
                    if sc > rsc[min(9, len(rsc) - 1)] + 1e-5:  # clear of ties at the cut
                        assert got[i] == pytest.approx(sc, rel=1e-5, abs=1e-6), (w, b, i)
        # hybrid finds a record only the lexical list ranks
        target = s.add("u", "zebra crossing", -emb(1003))
        hids, _ = s.search("u", q[3:4], k=5, mode="hybrid", texts=["zebra"], fusion="rrf", lexical_weight=0.5)
        dids, _ = s.search("u", q[3:4], k=5)
        assert target in hids[0] and target not in dids[0]



def test_hybrid_coverage_fusion_matches_reference(make_store):
    """fusion="coverage": the lexical list is the idf-weighted query-term coverage (float64
    reference lx.coverage_scores over every record's text) and the fused score is
    lx.coverage_fusion of the dense list and that list; the store's default fusion."""
    texts = _texts(200, 4)
    with make_store(D, "cos") as s:
        s.add_batch("u", texts, np.stack([emb(i) for i in range(len(texts))]))
        q = np.stack([emb(2000 + b) for b in range(4)])
        qt = ["caroline dog", "berlin lake lake", "painting 2023 may unknownword", "zebra"]
        C = 30
        dids, dsc = s.search("u", q, k=C)
        toks = [lx.tokenize(t) for t in texts]
        for w in (0.0, 0.35, 1.0):
            for kw in (dict(fusion="coverage", lexical_weight=w), dict(lexical_weight=w)):  # coverage is the default
                hids, hsc = s.search("u", q, k=10, mode="hybrid", texts=qt, candidates=C, **kw)
                for b in range(4):
                    cov = lx.coverage_scores(qt[b], toks)
                    lids, lsc = _ranked(cov, C)
                    rid, rsc = lx.coverage_fusion((dids[b], dsc[b].astype(np.float64)), (lids, lsc), w)
                    n = min(10, len(rid))
                    np.testing.assert_allclose(hsc[b, :n], rsc[:n], rtol=1e-5, atol=1e-6)
                    for j in range(n):  # ids equal where the fused scores are not tied
                        if np.isclose(rsc, rsc[j], rtol=1e-6, atol=1e-9).sum() == 1:
                            assert hids[b, j] == rid[j], (w, b, j)
        # invalidated records leave the coverage list too (the dense list never had them)
        lex_only = s.add("u", "zebra zebra crossing", -emb(2003))
        hit, _ = s.search("u", q[3:4], k=5, mode="hybrid", texts=["zebra crossing"], lexical_weight=1.0)
        assert hit[0, 0] == lex_only
        s.invalidate(lex_only, "test")
        hit, _ = s.search("u", q[3:4], k=50, mode="hybrid", texts=["zebra crossing"], lexical_weight=1.0)
        assert lex_only not in hit[0]


def _unit_with_sim(sim: float, j: int, d: int) -> np.ndarray:
    v = np.zeros(d, np.float32)
    v[0], v[j] = sim, np.sqrt(1.0 - sim * sim)
    return v


def test_hybrid_default_finds_name_centred_evidence_that_dense_misses(make_store):
    """The dialogue failure bench/bench_lexical.py measured, in miniature: vectors embed each
    turn's content, texts carry the speaker's name. For "Which city is Nadia relocating to?" the
    dense list puts other speakers' moving talk first; the default hybrid (coverage fusion,
    w = 0.35) ranks Nadia's own teaser first. BM25 fusions do not: BM25's length
    normalisation ranks Nadia's shortest turns ("Booked what?") first for the name alone, so the
    former default (rrf, w = 0.5) and weighted fusion return those instead."""
    turns = [("Kwame: We are moving the sofa to the new flat this weekend.", 1.0),
             ("Aisha: My cousin is moving to Denver next spring.", 0.97),
             ("Kwame: Moving house is exhausting, boxes everywhere.", 0.94),
             ("Nadia: Okay, guess where I'm moving at the end of the month?", 0.9),
             ("Nadia: Booked what?", 0.2),
             ("Nadia: No idea, where?", 0.3),
             ("Nadia: Find anything interesting?", 0.1),
             ("Kwame: The neighbours are renovating, drilling from 7 am.", 0.05),
             ("Aisha: That sounds like torture.", 0.0),
             ("Kwame: Reading anything good lately?", 0.02),
             ("Aisha: Traffic was insane this morning.", 0.01),
             ("Kwame: My phone screen cracked again.", 0.03)]
    d = len(turns) + 1
    with make_store(d, "cos") as s:
        ids = s.add_batch("u", [t for t, _ in turns], np.stack([_unit_with_sim(x, j + 1, d) for j, (_, x) in
                                                               enumerate(turns)]))
        evidence = int(ids[3])
        q = _unit_with_sim(1.0, 0, d)
        text = ["Which city is Nadia relocating to?"]
        dense, _ = s.search("u", q, k=2)
        hybrid, _ = s.search("u", q, k=2, mode="hybrid", texts=text)
        assert evidence not in dense[0]
        assert hybrid[0, 0] == evidence
        for kw in (dict(fusion="rrf", lexical_weight=0.5), dict(fusion="weighted", lexical_weight=0.5)):
            got, _ = s.search("u", q, k=2, mode="hybrid", texts=text, **kw)
            assert evidence not in got[0], kw

def test_search_mode_arguments_are_checked(make_store):
    with make_store(D) as s:
        s.add("u", "caroline", emb(0))
        q = emb(1)
        bad = [
            (dict(mode="fuzzy"), "mode"),
            (dict(mode="lexical"), "texts"),
            (dict(mode="hybrid", texts=["a", "b"]), "texts"),
            (dict(mode="hybrid", texts="abc"), "texts"),
            (dict(mode="hybrid", texts=[5]), "texts"),
            (dict(mode="hybrid", texts=["x" * 70000]), "texts"),
            (dict(mode="hybrid", texts=["\ud800"]), "texts"),
            (dict(mode="hybrid", texts=["a"], fusion="max"), "fusion"),
            (dict(mode="hybrid", texts=["a"], fusion=2), "fusion"),
            (dict(mode="hybrid", texts=["a"], fusion="coverage", lexical_weight=-0.1), "lexical_weight"),
            (dict(mode="hybrid", texts=["a"], fusion="coverage", lexical_weight="0.3"), "lexical_weight"),
            (dict(mode="hybrid", texts=["a"], lexical_weight=1.5), "lexical_weight"),
            (dict(mode="hybrid", texts=["a"], lexical_weight=float("nan")), "lexical_weight"),
            (dict(neighbour_weight=0.3), "neighbour_weight"),  # context terms are for level="turn+topic"
            (dict(mode="hybrid", texts=["a"], group_key="session_id"), "group_key"),
            (dict(level="turn+topic", neighbour_weight=float("nan")), "neighbour_weight"),
            (dict(level="turn+topic", group_weight=101.0), "group_weight"),
            (dict(level="turn+topic", mode="hybrid", texts=["a"], alpha=1e9), "alpha"),
            (dict(level="turn+topic", group_key=""), "group_key"),
            (dict(level="turn+topic", group_key=5), "group_key"),
            (dict(level="turn+topic", mode="hybrid", texts=["a", "b"]), "texts"),
            (dict(recency=0.0), "recency"),
            (dict(recency=-5), "recency"),
            (dict(recency=10.0, recency_weight=float("inf")), "recency_weight"),
        ]
        for kw, name in bad:
            with pytest.raises((MemkernValueError, MemkernTypeError), match=name):
                s.search("u", q, k=3, **kw)
        with pytest.raises(MemkernValueError, match="queries"):
            s.search("u", None, k=3, mode="hybrid", texts=["a"])
        ids, _ = s.search("u", None, k=3, mode="lexical", texts=["Caroline"])
        assert ids.tolist() == [[0, -1, -1]]
