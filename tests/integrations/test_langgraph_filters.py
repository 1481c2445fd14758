"""MemkernStore's ``search(filter=...)`` against LangGraph's own ``InMemoryStore`` on the same data.

Random items (ints, floats, bools, numeric and other strings, None, lists, nested dicts, missing
keys) and random filters with BaseStore's operators (``$eq $ne $gt $gte $lt $lte``, plain values,
sub-dicts with operators inside, lists). The reference is InMemoryStore itself, asked once per item
(one store per item): where it raises for an item (``float()`` of a value it cannot convert), that
item counts as not matching. The whole-namespace InMemoryStore search, where it does not raise,
must give the same keys in the same order.
"""
from __future__ import annotations

import random

import pytest

pytest.importorskip("langgraph")

from langgraph.store.memory import InMemoryStore  # noqa: E402

from fakes_embed import HashEmbedder  # noqa: E402
from memkern.integrations.langgraph import MemkernStore  # noqa: E402

KEYS = ["a", "b", "c", "n"]
SCALARS = [0, 1, 2, -1, 3, 0.5, 1.0, 2.5, True, False, "x", "y", "1", "2.5", "abc", "", None]
COMPOSITES = [[1, 2], ["x"], [True], [], {"p": 1, "q": "x"}, {"p": 2}, {"p": {"r": 1}}, {"q": "y"}]
ORDER_OPERANDS = [0, 1, 2, 0.5, 2.5, -1, "1", "2.5", "0"]


def _value(rng: random.Random):
    return rng.choice(SCALARS) if rng.random() < 0.75 else rng.choice(COMPOSITES)


def _item(rng: random.Random, j: int) -> dict:
    v = {k: _value(rng) for k in KEYS if rng.random() < 0.8}
    v["text"] = f"item {j} " + rng.choice(["apple", "car", "tea", "dog"])
    return v


def _ops(rng: random.Random) -> dict:
    out = {}
    for op in rng.sample(["$eq", "$ne", "$gt", "$gte", "$lt", "$lte"], rng.choice([1, 1, 2])):
        out[op] = rng.choice(ORDER_OPERANDS) if op not in ("$eq", "$ne") else _value(rng)
    return out


def _filter(rng: random.Random) -> dict:
    f = {}
    for key in rng.sample(KEYS, rng.choice([1, 1, 2, 3])):
        r = rng.random()
        if r < 0.35:
            f[key] = _value(rng)                                   # plain value (equality / sub-dict / list)
        elif r < 0.85:
            f[key] = _ops(rng)                                     # operators
        elif r < 0.95:
            f[key] = {rng.choice(["p", "q", "r"]): _ops(rng) if rng.random() < 0.6 else rng.choice(SCALARS)}
        else:
            f[key] = [_ops(rng), rng.choice(SCALARS)]              # a list with an operator element
    return f


def _reference(stores: list[InMemoryStore], flt: dict) -> list[int]:
    hits = []
    for j, s in enumerate(stores):
        try:
            if s.search(("d",), filter=flt):
                hits.append(j)
        except (TypeError, ValueError):       # InMemoryStore's float() of what it cannot convert
            pass
    return hits


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_filters_match_inmemorystore_on_random_items(tmp_path, seed):
    rng = random.Random(seed)
    items = [_item(rng, j) for j in range(60)]
    singles = []
    for j, v in enumerate(items):
        s = InMemoryStore()
        s.put(("d",), f"k{j:02d}", v)
        singles.append(s)
    whole = InMemoryStore()
    for j, v in enumerate(items):
        whole.put(("d",), f"k{j:02d}", v)
    checked_whole = nonempty = 0
    with MemkernStore(tmp_path / "s", embedder=HashEmbedder()) as lg:
        for j, v in enumerate(items):
            lg.put(("d",), f"k{j:02d}", v)
        for _ in range(150):
            flt = _filter(rng)
            want = [f"k{j:02d}" for j in _reference(singles, flt)]
            got = [i.key for i in lg.search(("d",), filter=flt, limit=100)]
            assert got == want, flt
            nonempty += bool(want)
            try:
                ref = [i.key for i in whole.search(("d",), filter=flt, limit=100)]
            except (TypeError, ValueError):
                ref = None
            if ref is not None:
                assert got == ref, flt
                checked_whole += 1
            # similarity search: the filter pushed into / evaluated after the store's search
            hits = lg.search(("d",), query="apple tea", filter=flt, limit=100)
            assert sorted(i.key for i in hits) == want, flt
    assert nonempty >= 40 and checked_whole >= 40        # the filters are neither all empty nor all raising


def test_extension_operators_keep_memkern_semantics(tmp_path):
    with MemkernStore(tmp_path / "s", embedder=HashEmbedder()) as lg:
        lg.put(("d",), "a", {"tags": ["x", "y"], "n": 1})
        lg.put(("d",), "b", {"tags": ["z"], "n": 2})
        lg.put(("d",), "c", {"n": 3})
        keys = lambda f: [i.key for i in lg.search(("d",), filter=f)]  # noqa: E731
        assert keys({"tags": {"$contains": "x"}}) == ["a"]
        assert keys({"n": {"$in": [1, 3]}}) == ["a", "c"]
        assert keys({"tags": {"$exists": False}}) == ["c"]
        assert keys({"$or": [{"n": {"$gt": 2}}, {"tags": ["z"]}]}) == ["b", "c"]
        assert keys({"$not": {"n": {"$lte": 1}}}) == ["b", "c"]
        assert keys({"n": {"$gte": 2, "$in": [1, 2]}}) == ["b"]
