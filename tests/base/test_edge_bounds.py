"""One set of bounds at the API edge (memkern.base.validate): the checks themselves, and a property test
that writes random *accepted* values through every in-process entry point (both stores, RMM, import,
ingest, the four adapters) and reads them back through every read route with no error.

The random values come from ``bench/attack/values.py`` (shared with the attack campaigns and the
server tests); each seed is a fresh draw, reproducible by its number."""
from __future__ import annotations

import datetime as dt
import json
import math
import random
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from attack import values as AV  # noqa: E402
from attack.common import HashEmbedder, cli, fake_cli_models  # noqa: E402
from memkern import InMemoryStore, MemkernTypeError, MemkernValueError, MemoryStore  # noqa: E402
from memkern.base import validate as V  # noqa: E402
from memkern.text.template import event_seconds  # noqa: E402
from memkern.store.transfer import export_store, import_store  # noqa: E402

D = 16
SEEDS = list(range(6))


# ----------------------------------------------------------------------------------- the checks


def test_the_time_bound_is_years_1_to_9999_and_always_renders():
    assert V.iso_time(V.MIN_TIME) == "0001-01-01T00:00:00+00:00"
    assert V.iso_time(V.MAX_TIME) == "9999-12-31T23:59:59+00:00"
    assert V.check_time("t", V.MAX_TIME) == V.MAX_TIME and V.check_time("t", int(V.MIN_TIME)) == V.MIN_TIME
    for bad in (V.MAX_TIME + 1e-3, V.MIN_TIME - 1, 5e11, math.nan, math.inf, 10 ** 5000, -(10 ** 400)):
        with pytest.raises(MemkernValueError, match=r"^t: expected unix seconds in \[-62135596800, 253402300799\]"):
            V.check_time("t", bad)
    for bad in (True, "1", None, [1.0]):
        with pytest.raises(MemkernTypeError, match="^t: "):
            V.check_time("t", bad)
    assert V.check_time("t", None, none_ok=True) is None
    assert V.check_time("t", np.float32(1.5)) == 1.5 and V.check_time("t", np.int64(7)) == 7.0
    rng = random.Random(7)
    for _ in range(20000):  # every accepted time renders and reads back
        t = rng.uniform(V.MIN_TIME, V.MAX_TIME)
        assert abs(dt.datetime.fromisoformat(V.iso_time(t)).timestamp() - t) < 1e-4
    assert V.iso_time(5e11) is None and V.iso_time(math.nan) is None and V.iso_time("x") is None


def test_dates_outside_years_1_9999_are_refused_everywhere(tmp_path):
    """template.event_seconds (RMM, the server's dates), the store (both kinds), time ranges."""
    for bad in (5e11, -1e11, 1e12, "9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+01:00",
                dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.timezone(dt.timedelta(hours=-1)))):
        with pytest.raises(MemkernValueError, match="^date: "):
            event_seconds(bad)
    assert event_seconds("9999-12-31T23:59:59") == V.MAX_TIME and event_seconds("0001-01-01") == V.MIN_TIME
    for s in (MemoryStore(tmp_path / "s", dim=D), InMemoryStore(D)):
        with s:
            v = np.ones(D, np.float32)
            for bad in (5e11, V.MAX_TIME + 1, 10 ** 50):
                with pytest.raises(MemkernValueError, match="event_time: expected unix seconds in"):
                    s.add("a", "x", v, event_time=bad)
                with pytest.raises(MemkernValueError, match="time_range: expected unix seconds in"):
                    s.search("a", v, k=1, time_range=(0, bad))
            rid = s.add("a", "x", v, event_time=V.MAX_TIME)
            with pytest.raises(MemkernValueError, match="event_time"):
                s.update(rid, event_time=V.MIN_TIME - 1)
            assert s.get(rid).event_time == V.MAX_TIME


def test_the_native_store_checks_the_same_time_bound(tmp_path):
    """Below the Python checks: the native layer refuses a time past the bound on its own."""
    with MemoryStore(tmp_path / "s", dim=D) as s:
        n = s.native
        v = np.ones((1, D), np.float32)
        with pytest.raises(ValueError, match=r"years 1-9999"):
            n.add("a", ["x"], ["[]"], ["{}"], v, np.zeros(1, np.uint8), np.full(1, -1, np.int64),
                  np.array([V.MAX_TIME + 1.0]))
        ok = n.add("a", ["x"], ["[]"], ["{}"], v, np.zeros(1, np.uint8), np.full(1, -1, np.int64),
                   np.array([V.MAX_TIME]))
        assert s.get(int(ok[0])).event_time == V.MAX_TIME


def test_sizes_utf8_and_json_bounds():
    big = {f"k{i}": i for i in range(V.MAX_OBJECT_KEYS)}
    V.json_text(big, "meta")
    with pytest.raises(MemkernValueError, match=r"meta: expected an object of at most 1024 keys"):
        V.json_text(dict(big, extra=1), "meta")
    with pytest.raises(MemkernValueError, match="key: expected a key of at most 256 characters"):
        V.check_json({"k" * 257: 1}, "meta")
    with pytest.raises(MemkernValueError, match=r"meta\['n'\]: expected an int within int64 .*, got 'an int of about"):
        V.check_json({"n": 10 ** 5000}, "meta")
    V.check_json({"n": V.MAX_JSON_INT, "m": -V.MAX_JSON_INT}, "meta")
    with pytest.raises(MemkernValueError, match=r"no lone surrogates"):
        V.check_json({"a": ["ok", "\udc00"]}, "meta")
    with pytest.raises(MemkernValueError, match=r"at most 1048576 characters"):
        V.check_text("summary", "x" * (V.MAX_TEXT_CHARS + 1))
    with pytest.raises(MemkernValueError, match=r"\['role'\]: expected a str of at most 256 characters"):
        V.check_turn({"role": "r" * 257, "content": "x"}, "turns[0]")
    with pytest.raises(MemkernValueError, match=r"\['speaker'\]"):
        V.check_turn({"role": "user", "content": "x", "speaker": "s" * 257}, "turns[0]")
    with pytest.raises(MemkernValueError, match=r"namespace: expected a str of at most 1024"):
        V.check_namespace_str("n" * 1025)


@pytest.mark.parametrize("text, match", [
    ("9" * 5000, "ints of at most 40 digits, got an int of 5000 digits"),
    ("[" * 100_000 + "]" * 100_000, "nested at most 64 levels deep"),
    ("[" * 70 + "]" * 70, "nested at most 64 levels deep"),
    ("[NaN]", r"finite JSON numbers\), got NaN"), ("-Infinity", "got -Infinity"),
    ('{"a": ', "got invalid JSON"),
])
def test_parse_json_bounds(text, match):
    with pytest.raises(MemkernValueError, match=r"^where: expected valid JSON.*" + match):
        V.parse_json(text, "where")


def test_huge_ints_never_reach_repr_or_float():
    """``repr`` of a 5,000-digit int raises in Python, ``float`` of one overflows: every check names
    it by size instead."""
    h = 10 ** 5000
    with pytest.raises(MemkernValueError, match="an int of about 5001 digits"):
        V.check_int("n", h, 0, 10)
    with pytest.raises(MemkernValueError, match="an int of about 5001 digits"):
        V.check_float("x", h, 0, 1)
    with InMemoryStore(D) as s:
        from memkern import MemkernKeyError

        with pytest.raises(MemkernKeyError, match="about 5001 digits"):
            s.get(h)


# ----------------------------------------------------------------------------------- the property test


def _labels(rng: random.Random) -> tuple:
    return tuple(rng.choice(["users", "alice", "ñ", "🙂", "a" * rng.randint(1, 20)]) for _ in range(rng.randint(1, 3)))


def _vec(rng: random.Random, n: int) -> np.ndarray:
    x = np.asarray([[rng.gauss(0, 1) for _ in range(D)] for _ in range(n)], np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _scalar_filter(meta: dict) -> dict | None:
    for k, v in meta.items():
        if k and isinstance(v, (str, int, float, bool)) and not (isinstance(v, str) and len(v) > 4096):
            if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 2 ** 53:
                continue
            return {k: v}
    return None


def _read_everything(s, written: dict, rng: random.Random) -> None:
    """Every read route of a store over what was written: get, get_batch, history, ids, count,
    namespaces, embeddings, dense / lexical / hybrid search with filters, time ranges and recency,
    each record rendered (JSON, ISO 8601 times); contents equal what was written."""
    ns_all = s.namespaces()
    for ns, recs in written.items():
        assert ns in ns_all
        ids = [int(i) for level in ("topic", "turn") for i in s.ids(ns, include_invalidated=True, level=level)]
        assert sorted(recs) == sorted(ids)
        assert s.count(ns, True) + s.count(ns, True, level="turn") == len(ids)
        got = s.get_batch(ids)
        for r in got:
            want = recs[r.id]
            assert r.summary == want["summary"] and r.meta == want["meta"] and list(r.turns or []) == want["turns"]
            assert r.event_time == want["event_time"]
            assert r.status == ("invalidated" if want["reason"] is not None else "active")
            if want["reason"] is not None:
                assert r.invalidated_reason == want["reason"]
            AV.assert_renders(r)
            for h in s.history(r.id):
                AV.assert_renders(h)
        s.embeddings(ids)
        q = _vec(rng, 1)
        text = AV.accepted_query(rng)
        for kw in ({}, {"mode": "lexical", "texts": [text]}, {"mode": "hybrid", "texts": [text]},
                   {"include_invalidated": True}, {"level": "turn"},
                   {"time_range": (AV.accepted_time(rng), None)},
                   {"time_range": (V.MIN_TIME, V.MAX_TIME), "time_field": "created"},
                   {"recency": V.MAX_TIME, "now": AV.accepted_time(rng)}):
            s.search(ns, q, k=5, **kw)
        topics = {int(i) for i in s.ids(ns, include_invalidated=True)}
        for want in [w for w in recs.values() if w["id"] in topics][:4]:
            flt = _scalar_filter(want["meta"])
            if flt is not None:
                hit, _ = s.search(ns, q, k=len(ids) + 1, filter=flt, include_invalidated=True)
                assert want["id"] in hit[0].tolist()
            if want["event_time"] is not None:
                t = want["event_time"]
                end = None if t + 1 > V.MAX_TIME else t + 1  # start <= t < end
                hit, _ = s.search(ns, q, k=len(ids) + 1, include_invalidated=True, time_range=(t, end))
                assert want["id"] in hit[0].tolist()


def _write_random(s, rng: random.Random, n: int) -> dict:
    """``n`` random accepted writes through add / add_batch / merge / update / invalidate; returns
    namespace -> id -> the expected fields."""
    written: dict = {}

    def note(ns, rid):
        r = s.get(rid)
        written.setdefault(ns, {})[rid] = {"id": rid, "summary": r.summary, "meta": r.meta,
                                           "turns": list(r.turns or []), "event_time": r.event_time, "reason": None}
        for c in r.turn_ids:
            t = s.get(c)
            written[ns][c] = {"id": c, "summary": t.summary, "meta": t.meta, "turns": list(t.turns or []),
                              "event_time": t.event_time, "reason": None}

    namespaces = [AV.accepted_namespace(rng) for _ in range(2)]
    for _ in range(n):
        ns = rng.choice(namespaces)
        m = AV.accepted_memory(rng)
        et = m["event_time"] if rng.random() < 0.7 else None
        op = rng.random()
        mine = list(written.get(ns, {}))
        if op < 0.35 or not mine:
            turns = m["turns"]
            te = _vec(rng, len(turns)) if turns and rng.random() < 0.5 else None
            rid = s.add(ns, m["text"], _vec(rng, 1)[0], turns, m["meta"], turn_embeddings=te, event_time=et)
            want_summary, want_meta, want_turns = m["text"], m["meta"], turns
            note(ns, rid)
            assert (written[ns][rid]["summary"], written[ns][rid]["meta"], written[ns][rid]["turns"],
                    written[ns][rid]["event_time"]) == (want_summary, want_meta, want_turns, et)
        elif op < 0.55:
            k = rng.randint(1, 3)
            ms = [AV.accepted_memory(rng) for _ in range(k)]
            ids = s.add_batch(ns, [x["text"] for x in ms], _vec(rng, k), [x["turns"] for x in ms],
                              [x["meta"] for x in ms], event_times=[x["event_time"] for x in ms])
            for x, rid in zip(ms, ids):
                note(ns, int(rid))
                assert written[ns][int(rid)]["event_time"] == x["event_time"]
        elif op < 0.7:
            tops = [i for i in mine if s.get(i).level == "topic" and s.get(i).status == "active"]
            if tops:
                rid = rng.choice(tops)
                new = m["turns"][:1]
                te = _vec(rng, len(new)) if new and s.get(rid).turn_ids else None
                s.merge(rid, m["text"], _vec(rng, 1)[0], new, turn_embeddings=te, event_time=et)
                note(ns, rid)
        elif op < 0.85:
            rid = rng.choice(mine)
            if s.get(rid).level == "topic":
                s.update(rid, summary=m["text"], meta=m["meta"], event_time=et)
                note(ns, rid)
        else:
            rid = rng.choice(mine)
            if s.get(rid).status == "active":
                s.invalidate(rid, m["reason"])
                note(ns, rid)
                r = s.get(rid)
                written[ns][rid]["reason"] = r.invalidated_reason
                for c in r.turn_ids:
                    written[ns][c]["reason"] = s.get(c).invalidated_reason
    # refresh statuses once more (an invalidated topic invalidates its turns)
    for ns, recs in written.items():
        for rid, want in recs.items():
            r = s.get(rid)
            want["reason"] = r.invalidated_reason if r.status == "invalidated" else None
    return written


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", ["native", "inmemory"])
def test_accepted_values_read_back_through_every_route_and_round_trip(tmp_path, seed, kind):
    rng = random.Random(f"store-{seed}")
    s = MemoryStore(tmp_path / "s", dim=D) if kind == "native" else InMemoryStore(D)
    with s:
        written = _write_random(s, rng, 40)
        _read_everything(s, written, rng)
        export_store(s, tmp_path / "x.jsonl")
    if kind == "native":  # reopened from its files
        with MemoryStore(tmp_path / "s") as s2:
            _read_everything(s2, written, rng)
    res = import_store(tmp_path / "imported", tmp_path / "x.jsonl")  # import: the export of accepted values
    with MemoryStore(tmp_path / "imported") as s3:
        remap = {ns: {res.id_map[i]: dict(w, id=res.id_map[i]) for i, w in recs.items()} for ns, recs in written.items()}
        _read_everything(s3, remap, rng)
    target = InMemoryStore(D)
    import_store(target, tmp_path / "x.jsonl")
    _read_everything(target, remap, rng)


@pytest.mark.parametrize("seed", SEEDS)
def test_accepted_values_through_rmm_and_ingest(tmp_path, seed):
    from memkern import RMM

    rng = random.Random(f"rmm-{seed}")
    emb = HashEmbedder(D)
    sessions = []
    for i in range(4):
        turns = [AV.accepted_turn(rng) for _ in range(rng.randint(1, 4))]
        for t in turns:
            t["content"] = t["content"] or "x"
        sessions.append({"session_id": AV.accepted_id(rng)[: V.MAX_ID_CHARS - 4] + f"-{i}", "date": AV.accepted_date(rng),
                         "turns": turns})
    with MemoryStore(tmp_path / "s", dim=D) as s:
        rmm = RMM(s, embedder=emb, namespace="u", extractor="embedding", persist=False)
        for sess in sessions:
            rmm.end_session(sess["turns"], session_id=sess["session_id"], date=sess["date"])
        for r in s.get_batch(s.ids("u", include_invalidated=True)):
            AV.assert_renders(r)
            assert r.event_time is not None and V.iso_time(r.event_time) is not None
        rmm.retrieve(AV.accepted_query(rng))
        rmm.inspect()
    # ingest: the same sessions from a file (a session file's dates are strings)
    for sess in sessions:
        if not isinstance(sess["date"], str):
            sess["date"] = V.iso_time(event_seconds(sess["date"]))
    f = tmp_path / "in.json"
    f.write_text(json.dumps({"sessions": sessions}, ensure_ascii=False), encoding="utf-8")
    with fake_cli_models(D):
        code, err = cli(["ingest", str(f), "--store", str(tmp_path / "ing"), "-n", "u", "--no-progress"])
    assert code == 0, err
    with MemoryStore(tmp_path / "ing") as s:
        recs = s.get_batch(s.ids("u", include_invalidated=True))
        assert recs
        for r in recs:
            AV.assert_renders(r)
            assert r.event_time is not None


def test_rmm_queries_are_bounded_and_utf8(tmp_path):
    """retrieve / respond refuse a lone surrogate and an over-long query by name, before any
    embedding, and the bank stays readable."""
    from memkern import RMM

    with MemoryStore(tmp_path / "s", dim=D) as s:
        rmm = RMM(s, embedder=HashEmbedder(D), namespace="u", extractor="embedding", persist=False)
        rmm.end_session([{"role": "user", "content": "I live in Lyon"}], session_id="s1", date="2024-05-01")
        bad = ["\ud800 where?", "x" * (V.MAX_QUERY_CHARS + 1)]
        for q in bad:
            for call in (rmm.retrieve, rmm.respond):
                with pytest.raises(MemkernValueError, match="query"):
                    call(q)
        ok = "y" * V.MAX_QUERY_CHARS
        assert rmm.retrieve(ok).memories is not None
        assert rmm.retrieve("where do I live?").memories


@pytest.mark.parametrize("seed", SEEDS)
def test_accepted_values_through_the_adapters(tmp_path, seed):
    from memkern.integrations.langchain import MemkernVectorStore as LCStore
    from memkern.integrations.langgraph import MemkernStore as LGStore
    from memkern.integrations.mem0 import MemkernVectorStore as M0Store

    rng = random.Random(f"adapters-{seed}")
    emb = HashEmbedder(D)
    mems = [AV.accepted_memory(rng) for _ in range(6)]
    # LangGraph: value dicts (meta) under label tuples, string keys
    with LGStore(tmp_path / "lg", embedder=emb) as lg:
        put = []
        for i, m in enumerate(mems):
            ns, key = _labels(rng), m["id"][: V.MAX_ID_CHARS - 4] + f"-{i}"
            value = {"text": m["text"], **{k: v for k, v in m["meta"].items() if not k.startswith("__")}}
            lg.put(ns, key, value)
            put.append((ns, key, value))
        for ns, key, value in put:
            item = lg.get(ns, key)
            assert item is not None and item.value == value
            json.dumps(item.dict() if hasattr(item, "dict") else {"value": item.value}, default=str)
            lg.search(ns, query=AV.accepted_query(rng), limit=3)
            lg.search(ns[:1], limit=3)
        lg.list_namespaces()
    # LangChain: texts, metadatas, ids
    lc = LCStore(tmp_path / "lc", embedding=emb)
    ids = lc.add_texts([m["text"] for m in mems], metadatas=[{k: v for k, v in m["meta"].items() if k != "_id"}
                                                            for m in mems],
                       ids=[m["id"][: V.MAX_ID_CHARS - 4] + f"-{i}" for i, m in enumerate(mems)])
    for d, m in zip(lc.get_by_ids(ids), mems):
        assert d.page_content == m["text"]
    lc.similarity_search(AV.accepted_query(rng), k=3)
    lc.close()
    # mem0: vectors with payloads, ids
    m0 = M0Store(collection_name=AV.accepted_namespace(rng)[:100] or "c", path=str(tmp_path / "m0"),
                 embedding_model_dims=D)
    vids = [m["id"][: V.MAX_ID_CHARS - 4] + f"-{i}" for i, m in enumerate(mems)]
    m0.insert(_vec(rng, len(mems)).tolist(), payloads=[dict(m["meta"], data=m["text"]) for m in mems], ids=vids)
    for vid, m in zip(vids, mems):
        got = m0.get(vid)
        assert got is not None and got.payload["data"] == m["text"]
        json.dumps(got.payload, allow_nan=False)
    m0.search(AV.accepted_query(rng), _vec(rng, 1)[0].tolist(), top_k=3)
    m0.list(top_k=10)


@pytest.mark.parametrize("seed", SEEDS)
def test_accepted_values_through_llamaindex(tmp_path, seed):
    pytest.importorskip("llama_index.core")
    from llama_index.core.schema import TextNode
    from llama_index.core.vector_stores.types import VectorStoreQuery

    from memkern.integrations.llamaindex import MemkernVectorStore

    rng = random.Random(f"llamaindex-{seed}")
    v = MemkernVectorStore(tmp_path / "s", dim=D)
    mems = [AV.accepted_memory(rng) for _ in range(5)]
    nodes = [TextNode(id_=m["id"][: V.MAX_ID_CHARS - 4] + f"-{i}", text=m["text"],
                      metadata={k: val for k, val in m["meta"].items() if isinstance(val, (str, int, float, type(None)))},
                      embedding=_vec(rng, 1)[0].tolist()) for i, m in enumerate(mems)]
    ids = v.add(nodes)
    got = {n.node_id: n for n in v.get_nodes(ids)}
    for n in nodes:
        assert got[n.node_id].get_content() == n.get_content() and got[n.node_id].metadata == n.metadata
    v.query(VectorStoreQuery(query_embedding=_vec(rng, 1)[0].tolist(), similarity_top_k=3))
