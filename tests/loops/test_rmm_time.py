"""RMM and time: the session date reaches the store's event_time (ADD, turn records, the latest
event on MERGE / UPDATE / NOOP), unreadable dates are refused before anything is written, stores
without event_time keep working, and retrieve / respond / aretrieve / arespond pass filter /
time_range / recency to the first-stage search."""
from __future__ import annotations

import asyncio
import datetime as dt

import numpy as np
import pytest

from fakes_rmm import FakeStore, HashEmbedder, ScriptedChat
from memkern.distributed import ShardedStore
from memkern.errors import MemkernTypeError, MemkernValueError
from memkern.store.memory import InMemoryStore
from memkern.protocols import search_keywords, supports_event_time
from memkern.loops.rmm import RMM
from memkern.store import MemoryStore, check_search_filters
from memkern.text.template import event_seconds
from memkern.ingest.apply import Candidate, Decision, apply_decision

DIM = 64
NS = "u"
SUBJECTS = ["marathon race running Boston", "beagle dog Pepper puppy", "nurse hospital night shifts",
            "violin Bach practice evening", "Oslo winter moved city", "pottery class clay wheel"]
DATES = ["1:56 pm on 8 May, 2023", "2023-05-09", "2023-05-10T09:30:00+02:00"]
SECS = [dt.datetime(2023, 5, 8, 13, 56, tzinfo=dt.timezone.utc).timestamp(),
        dt.datetime(2023, 5, 9, tzinfo=dt.timezone.utc).timestamp(),
        dt.datetime(2023, 5, 10, 7, 30, tzinfo=dt.timezone.utc).timestamp()]


class NoChat:
    def generate(self, prompts, max_new_tokens=None, json=False, temperature=0.0, seed=None):
        raise AssertionError("retrieve must not call the chat model")

    def count_tokens(self, text):
        return len(text.split())


def sessions():
    """Three sessions; session s talks about subjects 2s and 2s+1, and session 2 repeats subject 0."""
    out = []
    for s in range(3):
        subjects = (SUBJECTS[2 * s], SUBJECTS[2 * s + 1]) if s < 2 else (SUBJECTS[4], SUBJECTS[0])
        turns = []
        for k, subj in enumerate(subjects):
            for j in range(4):
                turns.append({"role": "user" if j % 2 == 0 else "assistant", "content": f"{subj} part {j} talk {s}",
                              "turn_id": f"D{s + 1}:{4 * k + j + 1}"})
        out.append(turns)
    return out


def make_store(kind, tmp_path):
    if kind == "native":
        return MemoryStore(tmp_path / "s", dim=DIM, metric="cos", fsync="never")
    if kind == "inmemory":
        return InMemoryStore(DIM, "cos")
    return ShardedStore(tmp_path / "sh", dim=DIM, metric="cos", shards=2)


def bank(store, chat=None, dates=DATES, **kw):
    args = dict(chat_model=chat or NoChat(), embedder=HashEmbedder(DIM), namespace=NS, persist=False,
                extractor="embedding", explore=False, top_k=6, top_m=2)
    args.update(kw)
    rmm = RMM(store, **args)
    for i, s in enumerate(sessions()):
        rmm.end_session(s, session_id=f"session_{i + 1}", date=dates[i])
    return rmm


# ----------------------------------------------------------------------------- dates


def test_event_seconds_formats_and_errors():
    assert event_seconds(None) is None
    assert event_seconds("1:56 pm on 8 May, 2023") == SECS[0]
    assert event_seconds("2023-05-09") == event_seconds(dt.date(2023, 5, 9)) == SECS[1]
    assert event_seconds("2023-05-10T09:30:00+02:00") == SECS[2]  # the offset is honoured
    assert event_seconds(dt.datetime(2023, 5, 10, 7, 30)) == SECS[2]  # naive = UTC
    assert event_seconds("2023/05/20 (Sat) 02:21") == dt.datetime(2023, 5, 20, 2, 21, tzinfo=dt.timezone.utc).timestamp()
    assert event_seconds("8 May 2023") == event_seconds("May 8, 2023") == event_seconds("2023-05-08")
    assert event_seconds(1683504000) == 1683504000.0 and event_seconds("1683504000") == 1683504000.0
    with pytest.raises(MemkernValueError, match=r"^when: expected a date string.*got 'last tuesday'"):
        event_seconds("last tuesday", "when")
    with pytest.raises(MemkernTypeError, match="^date: "):
        event_seconds(True)
    with pytest.raises(MemkernValueError, match="^date: "):
        event_seconds(float("nan"))
    with pytest.raises(MemkernValueError, match="^date: "):
        event_seconds(1e13)


# ----------------------------------------------------------------------------- writes


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["native", "inmemory", "sharded"])
def test_session_date_reaches_event_time_of_topics_and_turns(tmp_path, kind):
    store = make_store(kind, tmp_path)
    try:
        assert supports_event_time(store) and {"filter", "time_range", "recency"} <= search_keywords(store)
        bank(store)
        topics = [store.get(int(i)) for i in store.ids(NS)]
        turns = [store.get(int(i)) for i in store.ids(NS, level="turn")]
        assert len(topics) == 6 and len(turns) == 24
        for r in topics + turns:
            sid = (r.turn or {}).get("session_id") if r.level == "turn" else r.meta["session_id"]
            assert r.event_time == SECS[int(sid[-1]) - 1], (r.id, sid, r.event_time)
        # the date as given stays in meta
        assert sorted({r.meta["date"] for r in topics}) == sorted(DATES)
    finally:
        store.close()


def test_unreadable_date_is_refused_before_anything_is_written(tmp_path):
    store = make_store("native", tmp_path)
    rmm = RMM(store, chat_model=NoChat(), embedder=HashEmbedder(DIM), namespace=NS, persist=False,
              extractor="embedding")
    s = sessions()
    with pytest.raises(MemkernValueError, match=r"^date: expected a date string.*got 'yesterday-ish'"):
        rmm.end_session(s[0], "a", date="yesterday-ish")
    with pytest.raises(MemkernValueError, match=r"^dates\[1\]: "):
        rmm.end_sessions(s[:2], ["a", "b"], dates=["2023-05-08", "the day after"])
    with pytest.raises(MemkernTypeError, match=r"^dates\[0\]: "):
        rmm.end_sessions(s[:2], ["a", "b"], dates=[[2023], "2023-05-09"])
    assert store.count(NS, include_invalidated=True) == 0 and store.namespaces() == []
    # the legacy free-text timestamp stays free text: kept, no event time
    rmm.end_session(s[0], "a", timestamp="t-1")
    r = store.get(int(store.ids(NS)[0]))
    assert r.meta["timestamp"] == "t-1" and r.event_time is None
    store.close()


def _two(store):
    e = np.zeros(DIM, np.float32)
    e[0] = 1
    rid = store.add(NS, "old", e, turns=[{"role": "user", "content": "a"}], event_time=100.0)
    return rid, e, [Candidate(rid, "old", 0.9)]


@pytest.mark.parametrize("action", ["MERGE", "UPDATE", "NOOP"])
def test_merge_update_noop_keep_the_latest_event(tmp_path, action):
    store = make_store("native", tmp_path)
    emb = HashEmbedder(DIM)
    rid, e, cands = _two(store)
    for i, (t, want) in enumerate(((50.0, 100.0), (200.0, 200.0))):
        apply_decision(store, NS, "old", e, [{"role": "user", "content": f"new {i}"}],
                       Decision(action, 0, "old" if action != "NOOP" else None), cands,
                       embed=lambda x: emb.encode(x), event_time=t)
        assert store.get(rid).event_time == want, (action, t)
    # ADD and INVALIDATE date the new record with the session's own date
    r = apply_decision(store, NS, "x", e, [], Decision("INVALIDATE", 0), cands, embed=emb.encode, event_time=7.0)
    assert store.get(r.id).event_time == 7.0
    store.close()


def test_store_without_event_time_keeps_working(tmp_path):
    store = FakeStore(DIM)
    assert not supports_event_time(store) and search_keywords(store) == frozenset()
    rmm = RMM(store, chat_model=NoChat(), embedder=HashEmbedder(DIM), namespace=NS, persist=False,
              extractor="embedding", retrieval="topic", top_k=6, top_m=2)
    rmm.end_session(sessions()[0], "a", date="2023-05-08")
    recs = [store.get(int(i)) for i in store.ids(NS)]
    assert recs and all(r.meta["date"] == "2023-05-08" for r in recs)
    assert rmm.retrieve("beagle dog").memory_ids
    with pytest.raises(MemkernTypeError, match=r"^time_range: expected a store whose search takes time_range="):
        rmm.retrieve("beagle dog", time_range=(0, None))
    with pytest.raises(MemkernTypeError, match=r"^filter: "):
        rmm.retrieve("beagle dog", filter={"session_id": "a"})


# ----------------------------------------------------------------------------- retrieval


def _sessions_of(rmm, ret):
    return {rmm.store.get(i).meta["session_id"] for i in ret.memory_ids}


@pytest.mark.parametrize("retrieval", ["turn+topic", "topic"])
def test_retrieve_time_range_and_filter_reach_the_first_stage(tmp_path, retrieval):
    rmm = bank(make_store("native", tmp_path), retrieval=retrieval)
    q = "marathon race running Boston"
    assert _sessions_of(rmm, rmm.retrieve(q)) == {"session_1", "session_3"}
    # only the third session's date: the marathon memory from session 3, never session 1's
    got = rmm.retrieve(q, time_range=(SECS[2], None))
    assert got.memory_ids and _sessions_of(rmm, got) == {"session_3"}
    assert all(t.startswith("D3:") for t in got.all_turn_ids)
    got = rmm.retrieve(q, time_range=(None, SECS[1]), turns=3)
    assert _sessions_of(rmm, got) == {"session_1"} and got.n_turns == 3
    got = rmm.retrieve(q, filter={"session_id": {"$in": ["session_2"]}})
    assert _sessions_of(rmm, got) == {"session_2"}
    # created_at: every record was written just now
    assert rmm.retrieve(q, time_range=(0, 1e9), time_field="created").memory_ids == []
    # a recency prior with a heavy weight puts the newest session first
    got = rmm.retrieve(q, recency=3600.0, recency_weight=10.0, now=SECS[2] + 60)
    assert rmm.store.get(got.memory_ids[0]).meta["session_id"] == "session_3"
    rmm.store.close()


def test_retrieve_filters_are_checked_up_front(tmp_path):
    store = make_store("native", tmp_path)
    rmm = RMM(store, chat_model=NoChat(), embedder=HashEmbedder(DIM), namespace=NS, persist=False, extractor="llm")
    # an empty bank never searches: the arguments are still checked
    with pytest.raises(MemkernValueError, match=r"^time_range: expected start <= end"):
        rmm.retrieve("q", time_range=(5, 1))
    with pytest.raises(MemkernValueError, match=r"^time_field: "):
        rmm.retrieve("q", time_field="event_time")
    with pytest.raises(MemkernValueError, match=r"^recency: "):
        rmm.retrieve("q", recency=0)
    with pytest.raises(MemkernTypeError, match=r"^filter: "):
        rmm.retrieve("q", filter=["session_id"])
    with pytest.raises(MemkernValueError, match=r"^filter\['k'\]: "):
        rmm.respond("q", filter={"k": {"$gt": 1}})
    assert check_search_filters() == {}
    assert check_search_filters(time_range=[1, 2]) == {"time_range": (1, 2), "time_field": "event"}
    store.close()


def test_respond_and_async_calls_pass_the_filters(tmp_path):
    chat = ScriptedChat(['{"answer": "ok", "citations": [0]}'] * 4)
    rmm = bank(make_store("native", tmp_path), chat=chat)
    q = "marathon race running Boston"
    resp = rmm.respond(q, time_range=(SECS[2], None))
    assert resp.memory_ids and _sessions_of(rmm, resp) == {"session_3"}

    async def main():
        a = await rmm.aretrieve(q, time_range=(None, SECS[1]))
        b = await rmm.arespond(q, filter={"session_id": "session_2"})
        return a, b

    a, b = asyncio.run(main())
    assert _sessions_of(rmm, a) == {"session_1"} and _sessions_of(rmm, b) == {"session_2"}
    rmm.store.close()


def test_memkern_ingest_keeps_session_dates_through_its_stage(tmp_path, monkeypatch):
    """`memkern ingest` folds sessions in a scratch store and copies the result: the session
    dates' event times come along, and a second ingest keeps the first one's."""
    import json

    from memkern.cli import main
    from memkern.cli import common as C

    monkeypatch.setattr(C, "build_models", lambda args, need_chat=True: (NoChat(), HashEmbedder(384)))
    s = sessions()
    files = []
    for k, (sid, date) in enumerate((("a", "2023-05-08"), ("b", "2023-05-09"))):
        f = tmp_path / f"s{k}.json"
        f.write_text(json.dumps({"sessions": [{"session_id": sid, "date": date, "turns": s[k]}]}))
        files.append(f)
    common = ["--store", str(tmp_path / "st"), "-n", NS, "--extractor", "embedding", "--no-progress"]
    assert main(["ingest", str(files[0]), *common]) == 0
    assert main(["ingest", str(files[1]), *common]) == 0
    with MemoryStore(tmp_path / "st") as st:
        recs = [st.get(int(i)) for i in st.ids(NS)] + [st.get(int(i)) for i in st.ids(NS, level="turn")]
        assert len(recs) == 4 + 16
        want = {"a": SECS[0] - (13 * 3600 + 56 * 60), "b": SECS[1]}
        for r in recs:
            sid = r.turn["session_id"] if r.level == "turn" else r.meta["session_id"]
            assert r.event_time == want[sid], (r.id, r.level, sid, r.event_time)
