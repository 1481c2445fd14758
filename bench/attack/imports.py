"""Attack class ``imports``: hostile ``memkern import`` files and ``memkern export`` paths.

Each case takes the export of a small real store (topics with turn records, several versions, an
invalidated record, event times, a real reranker state and reward buffer) and breaks it one way:
huge ints, deep nesting, NaN / Infinity, lone surrogates, invalid UTF-8, out-of-range times, wrong
types, duplicate / out-of-order ids, a turn before its topic, broken links, wrong counts, a
truncated file, hostile reranker payloads (garbage, a pickle that would run code, another dim);
or points ``export --out`` into a store (its own files, case variants, symbolic and hard links,
another store). Some cases are valid edits (control: they must import and read back).

Outcomes: a refusal must be a memkern error (CLI: exit 2, one line) that leaves the target (and
the exported store) byte-for-byte as it was; an accepted file must read back through every read
route, else it counts as ``lost``.
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import pickle
import random
import shutil
from pathlib import Path

import numpy as np

from .common import Tally, check_cli_error, cli, run_case, tree_state
from . import values as AV

CLASS = "imports"
D = 8


def _build_source(root: Path) -> tuple[Path, list[str]]:
    """A real store and the lines of its export."""
    import torch

    from memkern import MemoryStore, Reranker
    from memkern.base.paths import reranker_file
    from memkern.loops.rmm.feedback import _selection_to_dict
    from memkern.store.transfer import export_store

    rng = np.random.default_rng(0)
    v = lambda n: rng.standard_normal((n, D)).astype(np.float32)  # noqa: E731
    src = root / "source"
    with MemoryStore(src, dim=D) as s:
        conv = [{"role": "user", "content": "I moved to Lisbon", "speaker": "Ann"},
                {"role": "assistant", "content": "Nice!"}]
        a = s.add_batch("alice", ["moved", "cats", "job"], v(3), turns=[conv, None, None],
                        metas=[{"k": 1, "tags": ["a"]}, {}, {"d": {"x": 1.5}}], turn_embeddings=[v(2), None, None],
                        event_times=[1.7e9, None, -5.0])
        s.merge(int(a[0]), "moved, Porto", v(1)[0], [{"role": "user", "content": "now Porto"}], turn_embeddings=v(1))
        s.update(int(a[1]), summary="cats!", meta={"m": 2})
        s.invalidate(int(a[2]), "outdated")
        s.add("bob", "bob's", v(1)[0], event_time=0.0)
        rr = Reranker(D, top_m=2)
        sel = rr.select(torch.randn(1, D), torch.randn(1, 4, D))
        rr.update(sel, torch.tensor([[1.0, -1.0]]))
        rr.save(reranker_file(src, "alice"))
        torch.save([(_selection_to_dict(sel), torch.tensor([1.0, -1.0]))], reranker_file(src, "alice", ".buffer.pt"))
        export_store(s, root / "base.jsonl")
    return src, (root / "base.jsonl").read_text(encoding="utf-8").splitlines()


def _sha_line(ns: str, kind: str, data: bytes) -> str:
    return json.dumps({"kind": "reranker", "namespace": ns, "file": kind, "sha256": hashlib.sha256(data).hexdigest(),
                       "data": base64.b64encode(data).decode()})


def _torch_bytes(obj) -> bytes:
    import torch

    b = io.BytesIO()
    torch.save(obj, b)
    return b.getvalue()


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /tmp/memkern-attack-pwned",))


_PLACE = "\u2063PLACEHOLDER\u2063"


def _set_raw(line: str, path: list, raw: str) -> str:
    """``line`` (a JSON object) with the value at ``path`` replaced by the raw JSON text ``raw``."""
    obj = json.loads(line)
    cur = obj
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = _PLACE
    return json.dumps(obj, ensure_ascii=False).replace(json.dumps(_PLACE, ensure_ascii=False), raw)


def _paths(obj: dict) -> list[list]:
    """Every value path in a record line (keys of the record and of each version, list items)."""
    out = []
    stack = [([], obj)]
    while stack:
        p, o = stack.pop()
        if isinstance(o, dict):
            for k, v in o.items():
                stack.append((p + [k], v))
        elif isinstance(o, list):
            for i, v in enumerate(o):
                stack.append((p + [i], v))
        if p:
            out.append(p)
    return out


def _hostile_raw(rng: random.Random) -> tuple[str, str]:
    """(raw JSON text of a hostile value, label)."""
    k = rng.randrange(12)
    if k == 0:
        return AV.huge_int_literal(rng), "huge int"
    if k == 1:
        d = rng.choice([65, 200, 1000, 100_000])
        return AV.deep_json(d, rng.choice(["list", "dict"])), f"nested {d}"
    if k == 2:
        return rng.choice(["NaN", "Infinity", "-Infinity"]), "non-finite"
    if k == 3:
        return json.dumps("x" + AV.surrogate(rng)), "lone surrogate"
    if k == 4:
        return json.dumps(AV.hostile_time(rng) if False else rng.choice([5e11, 1e300, -1e13, 253402300800.0])), "bad time"
    if k == 5:
        return rng.choice(["true", "null", "[]", "{}", '"text"', "-1", "0", "1.5", "[1, 2]"]), "wrong type"
    if k == 6:
        return str(rng.choice([2 ** 63, -(2 ** 63) - 1, 10 ** 39, -(10 ** 39)])), "int past int64"
    if k == 7:
        return json.dumps("r" * rng.choice([257, 1025, 5000])), "long str"
    if k == 8:
        return json.dumps({f"k{i}": i for i in range(1025)}), "wide object"
    if k == 9:
        return json.dumps([{"role": "user"}] * 2), "bad turns"
    if k == 10:
        return json.dumps(base64.b64encode(np.full(D, 1e30, "<f4").tobytes()).decode()), "huge vector"
    return json.dumps(rng.choice(["", "add", "merge", "invalidated", "turn", "ip"])), "enum string"


def _mutate(rng: random.Random, lines: list[str], dim: int) -> tuple[list[str] | bytes, str, bool]:
    """(the file's lines or raw bytes, label, whether it is a valid edit)."""
    header, end = lines[0], lines[-1]
    recs = [i for i, ln in enumerate(lines) if '"kind": "record"' in ln]
    rrs = [i for i, ln in enumerate(lines) if '"kind": "reranker"' in ln]
    k = rng.randrange(16)
    out = list(lines)
    if k <= 3:  # a hostile value anywhere in a record
        i = rng.choice(recs)
        path = rng.choice(_paths(json.loads(lines[i])))
        raw, what = _hostile_raw(rng)
        out[i] = _set_raw(lines[i], path, raw)
        return out, f"record line {i + 1} {path}: {what}", False
    if k == 4:  # a hostile value in the header
        key = rng.choice(["dim", "metric", "format_version", "embeddings", "namespaces", "format", "kind"])
        raw, what = _hostile_raw(rng)
        out[0] = _set_raw(header, [key], raw)
        return out, f"header {key}: {what}", False
    if k == 5:  # the end line
        raw, what = _hostile_raw(rng)
        out[-1] = _set_raw(end, [rng.choice(["records", "rerankers", "kind"])], raw)
        return out, f"end line: {what}", False
    if k == 6:  # ids: duplicate, out of order, a turn before its topic, far gaps (valid: renumbered)
        objs = [json.loads(lines[i]) for i in recs]
        how = rng.choice(["duplicate", "swap", "turn-first", "gap"])
        if how == "duplicate":
            j = rng.randrange(len(recs))
            out.insert(recs[j] + 1, lines[recs[j]])
            out[-1] = _set_raw(end, ["records"], str(len(recs) + 1))
            return out, "duplicate record line", False
        if how == "swap" and len(recs) > 1:
            a, b = sorted(rng.sample(range(len(recs)), 2))
            out[recs[a]], out[recs[b]] = out[recs[b]], out[recs[a]]
            return out, "records out of order", False
        if how == "turn-first":
            topic = next(o for o in objs if o["turn_ids"])
            turn = next(o for o in objs if o["id"] == topic["turn_ids"][0])
            big = max(o["id"] for o in objs) + 10
            topic2 = dict(topic, id=big + 1, turn_ids=[big] + topic["turn_ids"][1:])
            turn2 = dict(turn, id=big, topic_id=big + 1)
            rest = [o for o in objs if o["id"] not in (topic["id"], turn["id"])]
            rest = [dict(o, topic_id=big + 1) if o.get("topic_id") == topic["id"] else o for o in rest]
            new = sorted(rest + [topic2, turn2], key=lambda o: o["id"])
            return [header, *(json.dumps(o) for o in new), *[lines[i] for i in rrs], end], "turn id below its topic's", False
        gap = rng.choice([10 ** 6, 2 ** 40, 2 ** 62])  # valid: ids far apart are renumbered
        new = [dict(o, id=o["id"] + gap, topic_id=None if o["topic_id"] is None else o["topic_id"] + gap,
                    turn_ids=[c + gap for c in o["turn_ids"]]) for o in objs]
        return [header, *(json.dumps(o) for o in new), *[lines[i] for i in rrs], end], f"id gap {gap}", True
    if k == 7:  # links
        objs = [json.loads(lines[i]) for i in recs]
        o = rng.choice(objs)
        if o["level"] == "turn":
            o["topic_id"] = rng.choice([o["id"] + 1, 10 ** 12, -1, o["id"]])
        else:
            o["turn_ids"] = rng.choice([[o["id"]], [10 ** 12], [-5], o["turn_ids"][::-1] + [o["id"] + 1]])
        return [header, *(json.dumps(x) for x in objs), *[lines[i] for i in rrs], end], "broken links", False
    if k == 8:  # truncation / missing pieces
        how = rng.choice(["cut", "no-end", "after-end", "empty", "only-header", "dropped-record"])
        text = "\n".join(lines) + "\n"
        if how == "cut":
            return text.encode("utf-8")[: rng.randrange(1, len(text.encode("utf-8")) - 2)], "truncated at a byte", False
        if how == "no-end":
            return out[:-1], "no end line", False
        if how == "after-end":
            return out + [rng.choice([lines[1], "{}", '{"kind": "end", "records": 0, "rerankers": 0}'])], "a line after the end", False
        if how == "empty":
            return rng.choice([b"", b"\n", b"\n\n\n"]), "empty file", False
        if how == "only-header":
            return [header], "header only", False
        del out[rng.choice(recs)]
        return out, "a record line dropped", False
    if k == 9:  # bytes that are not UTF-8
        raw = ("\n".join(lines) + "\n").encode("utf-8")
        pos = rng.randrange(len(raw))
        bad = rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80", b"\xf4\x90\x80\x80"])
        return raw[:pos] + bad + raw[pos:], "invalid UTF-8", False
    if k == 10:  # reranker payloads
        how = rng.choice(["garbage", "evil", "dim", "nan", "buffer-garbage", "sha", "duplicate", "dict"])
        from memkern import Reranker

        if how == "sha" and rrs:
            o = json.loads(lines[rrs[0]])
            o["sha256"] = "0" * 64
            out[rrs[0]] = json.dumps(o)
            return out, "reranker sha mismatch", False
        if how == "duplicate" and rrs:
            out.insert(rrs[0], lines[rrs[0]])
            out[-1] = _set_raw(end, ["rerankers"], str(len(rrs) + 1))
            return out, "two reranker files of one kind", False
        kind = "buffer" if how == "buffer-garbage" else "state"
        data = {"garbage": b"\x80\x04\x95junk" + bytes(rng.randrange(256) for _ in range(40)),
                "evil": pickle.dumps(_Evil()), "dim": _torch_bytes(Reranker(D + 1).state_dict()),
                "buffer-garbage": _torch_bytes([({"indices": 1}, rng.random())]),
                "dict": _torch_bytes({"Wq": 1, "Wm": 2, "_extra_state": 3})}.get(how)
        if how == "nan":
            sd = Reranker(D).state_dict()
            sd["Wq"][0, 0] = float("nan")
            data = _torch_bytes(sd)
        keep = [lines[i] for i in rrs if f'"file": "{kind}"' not in lines[i]]
        body = [ln for ln in lines[1:-1] if '"kind": "reranker"' not in ln] + keep + [_sha_line("alice", kind, data)]
        e = json.loads(end)
        return [header, *body, json.dumps(dict(e, rerankers=len(keep) + 1))], f"reranker {how}", False
    if k == 11:  # unknown kinds / lines that are not objects
        i = rng.randrange(1, len(lines))
        out.insert(i, rng.choice(['{"kind": "mystery"}', "[1, 2]", '"text"', "null", "{}", '{"kind": 5}']))
        return out, "a foreign line", False
    # valid edits (control): accepted texts, meta and times in place of the record's own
    objs = [json.loads(lines[i]) for i in recs]
    o = rng.choice(objs)
    ver = rng.choice(o["versions"])
    what = rng.choice(["summary", "meta", "event_time", "reason"])
    if what == "summary":
        ver["summary"] = AV.accepted_text(rng, 5000, long=0.0)
    elif what == "meta":
        ver["meta"] = AV.accepted_meta(rng)
    elif what == "event_time":
        o["event_time"] = AV.accepted_time(rng)
    elif o["status"] == "invalidated":
        o["reason"] = AV.accepted_text(rng, 500, long=0.0)
    return [header, *(json.dumps(x, ensure_ascii=rng.random() < 0.5) for x in objs), *[lines[i] for i in rrs],
            end], f"valid edit: {what}", True


def _write(path: Path, body: list[str] | bytes) -> None:
    if isinstance(body, bytes):
        path.write_bytes(body)
    else:
        path.write_text("\n".join(body) + "\n", encoding="utf-8")


def _read_back(target: Path, tally: Tally, label: str) -> None:
    """Every read route of an imported store; a failure counts as a lost write."""
    from memkern import MemoryStore
    from memkern.store.transfer import export_store

    try:
        with MemoryStore(target) as s:
            for ns in s.namespaces():
                ids = [int(i) for lv in ("topic", "turn") for i in s.ids(ns, include_invalidated=True, level=lv)]
                for r in s.get_batch(ids):
                    AV.assert_renders(r)
                    for h in s.history(r.id):
                        AV.assert_renders(h)
                s.embeddings(ids)
                q = np.ones((1, D), np.float32)
                s.search(ns, q, k=5, include_invalidated=True)
                s.search(ns, q, k=5, mode="hybrid", texts=["moved cats"], time_range=(0.0, None))
            export_store(s, target.parent / (target.name + ".again.jsonl"))
    except Exception as e:  # noqa: BLE001
        tally.fail("lost", f"{label}: imported but not readable: {type(e).__name__}: {e}")


def _export_attack(rng: random.Random, src: Path, root: Path, tally: Tally, i: int) -> None:
    """``export --out`` into a store folder, by every spelling: refused, the store unchanged."""
    from memkern.store.transfer import export_store

    names = sorted(p.relative_to(src) for p in src.rglob("*") if p.is_file())
    how = rng.randrange(7)
    if how == 0:
        out = src / rng.choice(names)
    elif how == 1:
        out = src / str(rng.choice(names)).upper()
    elif how == 2:
        out = root / f"link{i}"
        out.symlink_to(src / rng.choice(names))
    elif how == 3:
        out = root / f"hard{i}"
        os.link(src / rng.choice(names), out)
    elif how == 4:
        d = root / f"dirlink{i}"
        d.symlink_to(src)
        out = d / rng.choice(["wal.log", "new.jsonl"])
    elif how == 5:
        out = src / "x" / ".." / rng.choice(["CURRENT", "new.jsonl"])
    else:
        out = src / "rerankers" / rng.choice(["alice.pt", "new.jsonl"])
    before = tree_state(src)
    label = f"export --out {out}"
    if rng.random() < 0.5:
        status, _ = run_case(tally, label, lambda: export_store(src, out))
        if status == "accepted":
            tally.fail("lost", f"{label}: written into the store")
    else:
        tally.cases += 1
        code, err = cli(["export", "--store", str(src), "--out", str(out)])
        if code == 0:
            tally.fail("lost", f"{label}: CLI wrote into the store")
        else:
            check_cli_error(tally, label, code, err)
    if tree_state(src) != before:
        tally.fail("lost", f"{label}: the store's files changed")


def campaign(rng: random.Random, n: int, workdir: Path) -> dict:
    from memkern import MemoryStore
    from memkern.store.transfer import import_store

    tally = Tally()
    src, lines = _build_source(workdir)
    existing = workdir / "existing"
    with MemoryStore(existing, dim=D) as s:
        s.add("keep", "mine", np.ones(D, np.float32))
    for i in range(n):
        if rng.random() < 0.12:
            _export_attack(rng, src, workdir, tally, i)
            continue
        body, label, valid = _mutate(rng, lines, D)
        f = workdir / f"case{i}.jsonl"
        _write(f, body)
        into_existing = rng.random() < 0.1
        if into_existing:
            target = workdir / f"ex{i}"
            shutil.copytree(existing, target, ignore=shutil.ignore_patterns("LOCK"))
        else:
            target = workdir / f"t{i}"
        before = tree_state(target)
        if rng.random() < 0.25:
            tally.cases += 1
            code, err = cli(["import", "--store", str(target), "--in", str(f)])
            status = "accepted" if code == 0 else ("refused" if check_cli_error(tally, label, code, err) else "failed")
            if status == "refused":
                tally.refused += 1
            elif status == "accepted":
                tally.accepted += 1
        else:
            status, _ = run_case(tally, label, lambda: import_store(target, f))
        if status == "accepted":
            _read_back(target, tally, label)
        elif status == "refused":
            if tree_state(target) != before:
                tally.fail("lost", f"{label}: refused but the target changed")
            if any(p.name.startswith(f".{target.name}.import-") for p in workdir.iterdir()):
                tally.fail("lost", f"{label}: a partial import was left beside the target")
        if valid and status == "refused":
            tally.fail("lost", f"{label}: a valid file was refused")
        if os.path.exists("/tmp/memkern-attack-pwned"):
            tally.fail("cross_scope", f"{label}: a pickle ran code")
            os.unlink("/tmp/memkern-attack-pwned")
        shutil.rmtree(target, ignore_errors=True)
        f.unlink(missing_ok=True)
    return tally.result()
