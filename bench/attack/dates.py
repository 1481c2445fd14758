"""Attack class ``dates``: hostile and edge dates through every route that takes a time.

Values: numbers just past years 1-9999 and far past them, huge ints, NaN / inf, bools, numpy
numbers, numeric strings, 5-digit years, impossible calendar dates, offsets that push year 9999
past the bound, lone surrogates, long strings; and accepted dates from
:func:`attack.values.accepted_date` (control). Routes: ``template.event_seconds`` /
``time_range_seconds``, the store's ``add`` / ``add_batch`` / ``update`` / ``merge`` event times and
``search(time_range=, now=, recency=)`` on both store kinds, ``RMM.end_session(date=)`` and
``RMM.retrieve(time_range=)``, the adapters' time arguments, and an import line's ``event_time``.

Outcomes: a refusal must be a memkern error; an accepted time must read back through ``get``,
``search`` and ``export`` and render as ISO 8601 (:func:`memkern.base.validate.iso_time`), else the
write counts as ``lost`` (the poisoned-read failure: an accepted date that breaks later reads).
"""
from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path

import numpy as np

from memkern.errors import shown

from .common import HashEmbedder, Tally, run_case
from . import values as AV

CLASS = "dates"
D = 16


def _value(rng: random.Random):
    from memkern.base import validate as V

    r = rng.random()
    if r < 0.3:
        return AV.accepted_date(rng), True
    if r < 0.5:
        return AV.hostile_time(rng), False
    if r < 0.7:
        return AV.hostile_date_string(rng), False
    edge = [V.MAX_TIME, V.MIN_TIME, V.MAX_TIME + 0.001, V.MIN_TIME - 0.001, np.float32(1.7e9), np.int64(10 ** 12),
            np.float64("nan"), dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=dt.timezone(dt.timedelta(hours=-5))),
            dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5))), dt.date(9999, 12, 31), dt.date.min,
            dt.datetime.max, np.bool_(True), 10 ** 400, "253402300799", "253402300800"]
    return edge[rng.randrange(len(edge))], None


def _readable(tally: Tally, label: str, store, rid: int) -> None:
    from memkern.base import validate as V

    try:
        r = store.get(rid)
        AV.assert_renders(r)
        if r.event_time is not None and V.iso_time(r.event_time) is None:
            raise AssertionError(f"event_time {r.event_time!r} does not render")
        q = np.ones((1, D), np.float32)
        store.search(r.namespace, q, k=3, time_range=(V.MIN_TIME, None))
        store.search(r.namespace, q, k=3, recency=V.MAX_TIME, now=r.event_time if r.event_time is not None else None)
        store.history(rid)
    except Exception as e:  # noqa: BLE001
        tally.fail("lost", f"{label}: accepted, then unreadable: {type(e).__name__}: {e}")


def campaign(rng: random.Random, n: int, workdir: Path) -> dict:
    from memkern import RMM, InMemoryStore, MemoryStore
    from memkern.base import validate as V
    from memkern.integrations import mem0 as M0
    from memkern.integrations.langchain import MemkernVectorStore as LC
    from memkern.text.template import event_seconds, time_range_seconds
    from memkern.store.transfer import export_store, import_store

    tally = Tally()
    emb = HashEmbedder(D)
    native = MemoryStore(workdir / "store", dim=D)
    inmem = InMemoryStore(D)
    rmm = RMM(native, embedder=emb, namespace="rmm", extractor="embedding", persist=False)
    lc = LC(workdir / "lc", embedding=emb)
    lc.add_texts(["tea in Lisbon", "cats"], metadatas=[{"date": "2023-05-08"}, {}])
    m0 = M0.MemkernVectorStore(collection_name="c", path=str(workdir / "m0"), embedding_model_dims=D)
    m0.insert(emb.encode(["tea"]).tolist(), payloads=[{"data": "tea"}], ids=["a"])
    vec = emb.encode(["a memory"])[0]
    try:
        for i in range(n):
            value, _ = _value(rng)
            label = f"case {i}: {type(value).__name__} {shown(value)[:120]}"
            route = rng.randrange(11)
            store = native if rng.random() < 0.6 else inmem
            rid_box: list = []
            if route == 0:
                def go():
                    t = event_seconds(value)
                    assert t is None or V.iso_time(t) is not None, f"accepted {t!r} does not render"
                    return t
            elif route == 1:
                def go():
                    return time_range_seconds((value, None)), time_range_seconds((None, value))
            elif route == 2:  # add with the raw number (the store takes numbers only)
                def go():
                    rid_box.append(store.add("ns", "x", vec, event_time=value))
            elif route == 3:
                def go():
                    ids = store.add_batch("ns", ["a", "b"], np.stack([vec, vec]), event_times=[value, None])
                    rid_box.append(int(ids[0]))
            elif route == 4:
                def go():
                    rid = store.add("ns", "y", vec)
                    rid_box.append(rid)
                    store.update(rid, event_time=value)
            elif route == 5:
                def go():
                    rid = store.add("ns", "z", vec)
                    rid_box.append(rid)
                    store.merge(rid, "z2", vec, event_time=value)
            elif route == 6:
                def go():
                    return store.search("ns", vec, k=3, time_range=(value, None), recency=3600.0, now=value)
            elif route == 7:  # RMM: a session date (strings, datetimes, numbers)
                def go():
                    before = {int(x) for x in native.ids("rmm", include_invalidated=True)}
                    rmm.end_session([{"role": "user", "content": f"I drank tea in Lisbon {i}"}], date=value)
                    rid_box.extend(sorted({int(x) for x in native.ids("rmm", include_invalidated=True)} - before))
                    rmm.retrieve("tea", time_range=(value, None))
            elif route == 8:  # adapters' time arguments
                def go():
                    lc.similarity_search("tea", k=2, time_range=(value, None))
                    m0.search("tea", emb.encode(["tea"])[0].tolist(), top_k=2, time_range=(None, value))
            elif route == 9:  # an import line's event_time
                def go():
                    f = workdir / f"imp{i}.jsonl"
                    src = InMemoryStore(D)
                    src.add("ns", "x", vec, event_time=1.0)
                    export_store(src, f)
                    lines = f.read_text().splitlines()
                    rec = json.loads(lines[1])
                    rec["event_time"] = "__T__"
                    raw = json.dumps(rec).replace('"__T__"', json.dumps(value) if isinstance(value, (int, float, str))
                                                  and not isinstance(value, bool) and (not isinstance(value, int)
                                                                                       or abs(value) < 10 ** 30)
                                                  else "1e999")
                    f.write_text("\n".join([lines[0], raw, lines[2]]) + "\n")
                    dst = InMemoryStore(D)
                    import_store(dst, f)
                    for r in dst.get_batch(dst.ids("ns", include_invalidated=True)):
                        AV.assert_renders(r)
            else:  # the server's date parsing of a request (time ranges given as dates)
                def go():
                    lo, hi = time_range_seconds([value, value]) or (None, None)
                    if lo is not None:
                        store.search("ns", vec, k=1, time_range=(lo, None))
            status, _ = run_case(tally, label, go)
            if status == "accepted":
                for rid in rid_box:
                    _readable(tally, label, store if route != 7 else native, rid)
        try:  # everything accepted survives a reopen and an export
            native.close()
            with MemoryStore(workdir / "store") as s:
                export_store(s, workdir / "all.jsonl")
                for ns in s.namespaces():
                    for r in s.get_batch([int(x) for lv in ("topic", "turn")
                                          for x in s.ids(ns, include_invalidated=True, level=lv)]):
                        AV.assert_renders(r)
            import_store(workdir / "reimported", workdir / "all.jsonl")
        except Exception as e:  # noqa: BLE001
            tally.fail("lost", f"reopen / export / import of the accepted dates: {type(e).__name__}: {e}")
    finally:
        native.close()
        lc.close()
    return tally.result()
