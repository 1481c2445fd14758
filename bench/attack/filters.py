"""Attack class ``filters``: hostile metadata filters through the store and every adapter.

Filters nested thousands deep (``$not`` / ``$and`` / ``$or``, mem0 ``AND`` / ``OR`` / ``NOT``,
LlamaIndex ``MetadataFilters``), very wide ones, huge ints, NaN / inf, lone surrogates in keys and
values, strings past the native limit, unknown operators, operands of the wrong type (a str for
``$in``, a dict for ``$and``), non-JSON objects; and random valid filters (control).

Outcomes: a refusal must be a memkern error; an accepted filter must return only records that
match it (checked against :func:`memkern.integrations.filters.matches` on every record, a record
outside the filter counts as ``cross_scope``: adapters scope users with filters).
"""
from __future__ import annotations

import math
import random
from pathlib import Path


from memkern.errors import shown

from .common import HashEmbedder, Tally, run_case
from . import values as AV

CLASS = "filters"
D = 16
_KEYS = ["user", "n", "x", "ok", "tags", "d", "name", "none", "ключ"]


def _meta(rng: random.Random, i: int) -> dict:
    return {"user": rng.choice(["alice", "bob", "carol"]), "n": rng.randint(0, 5), "x": rng.uniform(-1, 1),
            "ok": rng.random() < 0.5, "tags": rng.sample(["a", "b", "c"], rng.randint(0, 3)),
            "d": {"p": rng.randint(0, 2)}, "name": rng.choice(["Green Tea", "tea", "Coffee"]), "i": i,
            **({"none": None} if rng.random() < 0.3 else {})}


def _valid(rng: random.Random, depth: int = 0):
    """A random valid filter of the shared dict grammar."""
    r = rng.random()
    if depth < 3 and r < 0.3:
        op = rng.choice(["$and", "$or"])
        return {op: [_valid(rng, depth + 1) for _ in range(rng.randint(1, 3))]}
    if depth < 3 and r < 0.4:
        return {"$not": _valid(rng, depth + 1)}
    key = rng.choice(_KEYS)
    val = {"user": rng.choice(["alice", "bob"]), "n": rng.randint(0, 5), "x": 0.0, "ok": True, "tags": "a",
           "d": {"p": 1}, "name": "tea", "none": None, "ключ": 1}[key]
    op = rng.choice(["eq", "$eq", "$ne", "$in", "$nin", "$gt", "$lte", "$exists", "$contains"])
    if op == "eq":
        return {key: val}
    if op in ("$in", "$nin"):
        return {key: {op: [val, "zzz"]}}
    if op == "$exists":
        return {key: {op: rng.random() < 0.5}}
    if op in ("$gt", "$lte") and not isinstance(val, (int, float, str)) or isinstance(val, bool):
        return {key: {"$eq": val}}
    return {key: {op: val}}


def _nested(kind: str, depth: int, leaf: dict) -> dict:
    f = leaf
    for _ in range(depth):
        f = {kind: f} if kind in ("$not", "NOT") else {kind: [f]}
    return f


def _hostile(rng: random.Random):
    k = rng.randrange(12)
    if k == 0:
        return _nested(rng.choice(["$not", "$and", "$or"]), rng.choice([33, 100, 1000, 3000, 5000]), {"user": "alice"})
    if k == 1:
        return {"$and": [{"n": {"$gte": i % 6}} for i in range(rng.choice([1000, 5000]))]}
    if k == 2:
        return {"n": rng.choice([AV.huge_int(rng), 2 ** 63, -(2 ** 64)])}
    if k == 3:
        return {"x": rng.choice([math.nan, math.inf, -math.inf])}
    if k == 4:
        return rng.choice([{"user" + AV.surrogate(rng): "a"}, {"user": "a" + AV.surrogate(rng)}])
    if k == 5:
        return {"name": "t" * rng.choice([4097, 100_000])}
    if k == 6:
        return {"n": {rng.choice(["$regex", "$where", "$gt$", "", "$IN"]): 1}}
    if k == 7:
        return rng.choice([{"user": {"$in": "alice"}}, {"$and": {"user": "alice"}}, {"$or": "x"}, {"$not": [1]},
                           {"n": {"$gt": [1]}}, {"n": {"$exists": "yes"}}, {"$and": [1, 2]}])
    if k == 8:
        return rng.choice([{"user": object()}, {"user": b"alice"}, {"user": {1, 2}}, {3: "int key"},
                           {"user": AV.deep_value(50)}, ["not", "a", "dict"], "user=alice", 7])
    if k == 9:
        return {f"k{i}": i for i in range(rng.choice([65, 5000]))}
    if k == 10:
        return {"tags": {"$in": list(range(rng.choice([4097, 10000])))}}
    return _valid(rng)


def _check_results(tally: Tally, label: str, tree, records) -> None:
    from memkern.integrations import filters as F

    for r in records:
        meta = r.meta if hasattr(r, "meta") else r
        if not F.matches(tree, meta):
            tally.fail("cross_scope", f"{label}: returned a record outside the filter: {meta}")
            return


def campaign(rng: random.Random, n: int, workdir: Path) -> dict:
    from memkern import MemoryStore
    from memkern.integrations import filters as F
    from memkern.integrations import mem0 as M0
    from memkern.integrations.langchain import MemkernVectorStore as LC
    from memkern.integrations.langgraph import MemkernStore as LG

    tally = Tally()
    emb = HashEmbedder(D)
    metas = [_meta(rng, i) for i in range(60)]
    texts = [f"memory {i} about {m['name']} and {m['user']}" for i, m in enumerate(metas)]
    store = MemoryStore(workdir / "store", dim=D)
    store.add_batch("ns", texts, emb.encode(texts), metas=metas)
    lg = LG(workdir / "lg", embedder=emb)
    for i, (t, m) in enumerate(zip(texts, metas)):
        lg.put(("u",), f"k{i}", {"text": t, **m})
    lc = LC(workdir / "lc", embedding=emb)
    lc.add_texts(texts, metadatas=metas)
    m0 = M0.MemkernVectorStore(collection_name="c", path=str(workdir / "m0"), embedding_model_dims=D)
    m0.insert(emb.encode(texts).tolist(), payloads=[dict(m, data=t) for t, m in zip(texts, metas)],
              ids=[f"id{i}" for i in range(len(texts))])
    q = emb.encode(["tea alice"])[0]
    try:
        for i in range(n):
            flt = _hostile(rng)
            label = f"case {i}: {shown(flt)[:160]}"
            route = rng.randrange(6)
            if route == 0:  # parse + the filtered search on the store
                def go():
                    tree = F.parse(flt)
                    return tree, F.search(store, "ns", q, 5, tree)[2]
            elif route == 1:  # the store's native filter
                def go():
                    ids, _ = store.search("ns", q, k=5, filter=flt)
                    return None, store.get_batch([int(x) for x in ids[0] if x >= 0])
            elif route == 2:
                def go():
                    tree = F.parse(flt)
                    items = lg.search(("u",), query="tea", filter=flt, limit=5)
                    return tree, [it.value for it in items]
            elif route == 3:
                def go():
                    tree = F.parse(flt)
                    return tree, [d.metadata for d in lc.similarity_search("tea", k=5, filter=flt)]
            elif route == 4:  # mem0 syntax (AND / OR / NOT spelled its way)
                m0f = flt
                if isinstance(flt, dict) and len(flt) == 1 and next(iter(flt)) in ("$and", "$or", "$not"):
                    m0f = _nested({"$and": "AND", "$or": "OR", "$not": "NOT"}[next(iter(flt))],
                                  rng.choice([40, 3000]), {"user": "alice"})

                def go():
                    tree = M0.to_filter(m0f)
                    return tree, [r.payload for r in m0.search("tea", q.tolist(), top_k=5, filters=m0f)]
            else:  # LlamaIndex MetadataFilters nested deep
                def go():
                    from llama_index.core.vector_stores.types import MetadataFilter, MetadataFilters

                    from memkern.integrations.llamaindex import to_filter

                    f = MetadataFilters(filters=[MetadataFilter(key="user", value="alice")])
                    for _ in range(rng.choice([10, 40, 500])):
                        f = MetadataFilters(filters=[f])
                    return None, [to_filter(f)] and []
            status, value = run_case(tally, label, go)
            if status == "accepted" and value is not None:
                tree, records = value
                if tree is not None:
                    _check_results(tally, label, tree, records)
                elif route == 1 and isinstance(flt, dict):
                    try:
                        _check_results(tally, label, F.parse(flt), records)
                    except Exception:  # noqa: BLE001 - a native-only form the shared grammar reads differently
                        pass
    finally:
        store.close()
        lg.close()
        lc.close()
    return tally.result()
