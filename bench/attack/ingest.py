"""Attack class ``ingest``: hostile session files through ``memkern ingest`` (in this process, with a
hash embedder in place of the models and the ``embedding`` extractor).

Files in every accepted layout (bundled, a list of sessions, LongMemEval, LoCoMo) broken one way:
huge ints, deep nesting, NaN / Infinity, lone surrogates (escaped), invalid UTF-8 bytes,
unreadable or out-of-range session dates, content / role of the wrong type or past the bounds,
ids past the bounds, a truncated file, a foreign layout; and valid files (control), some with
accepted edge values (dates at years 1 and 9999, long texts, astral characters).

Outcomes: a refused file must exit 2 with one line and leave the store exactly as it was (a new
store is not created); an accepted file must exit 0 and every stored record must read back and
render (else ``lost``).
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from .common import Tally, check_cli_error, cli, fake_cli_models, tree_state
from . import values as AV

CLASS = "ingest"
D = 32


def _session(rng: random.Random, i: int) -> dict:
    turns = [{"role": rng.choice(["user", "assistant"]), "content": AV.accepted_text(rng, 400, nonblank=True, long=0.0)}
             for _ in range(rng.randint(1, 4))]
    date = AV.accepted_date(rng)
    if not isinstance(date, str):
        from memkern.base import validate as V
        from memkern.text.template import event_seconds

        date = V.iso_time(event_seconds(date))
    return {"session_id": f"s{i}", "date": date, "turns": turns}


def _layout(rng: random.Random, sessions: list[dict]):
    k = rng.randrange(4)
    if k == 0:
        return {"sessions": sessions}
    if k == 1:
        return [dict(s) for s in sessions]
    if k == 2:  # LongMemEval
        return [{"question_id": "q1", "question_type": "t", "question": "?", "answer": "!", "question_date": None,
                 "haystack_session_ids": [s["session_id"] for s in sessions],
                 "haystack_dates": [s["date"] for s in sessions],
                 "haystack_sessions": [[{"role": t["role"], "content": t["content"]} for t in s["turns"]]
                                       for s in sessions], "answer_session_ids": []}]
    conv = {"speaker_a": "Ann", "speaker_b": "Bob"}
    for j, s in enumerate(sessions, 1):
        conv[f"session_{j}"] = [{"speaker": "Ann" if t["role"] == "user" else "Bob", "dia_id": f"D{j}:{m + 1}",
                                 "text": t["content"]} for m, t in enumerate(s["turns"])]
        conv[f"session_{j}_date_time"] = s["date"]
    return {"sample_id": "c1", "conversation": conv, "qa": []}


_MARK = "\u2063MARK\u2063"


def _break(rng: random.Random, sessions: list[dict]) -> tuple[bytes, str, bool]:
    """(file bytes, label, valid)."""
    s = rng.choice(sessions)
    t = rng.choice(s["turns"])
    k = rng.randrange(11)
    raw = None
    if k == 0:
        s["date"] = AV.hostile_date_string(rng)
        label = f"date {s['date'][:40]!r}"
    elif k == 1:
        t["n"] = _MARK
        raw = rng.choice([AV.huge_int_literal(rng), AV.deep_json(rng.choice([70, 3000, 100_000])), "NaN", "-Infinity",
                          str(2 ** 63), json.dumps("\ud800")])
        label = f"turn value {raw[:30]}"
    elif k == 2:
        t["content"] = rng.choice([7, None, ["a"], {"a": 1}, True, "x" * (2 ** 20 + 1)])
        label = f"content {type(t['content']).__name__}"
    elif k == 3:
        t["role"] = rng.choice(["", 3, "r" * 257, None])
        label = f"role {t['role']!r:.30}"
    elif k == 4:
        s["session_id"] = rng.choice(["", None, "i" * 513, True, [1]])
        label = f"session_id {s['session_id']!r:.30}"
    elif k == 5:
        t["content"] = _MARK
        raw = json.dumps("ok " + AV.surrogate(rng))
        label = "lone surrogate"
    else:
        label = "valid"
        if k == 6:
            s["date"] = rng.choice(["0001-01-01", "9999-12-31T23:59:59", "9999-12-31", "1:56 pm on 8 May, 2023"])
        body = json.dumps(_layout(rng, sessions), ensure_ascii=rng.random() < 0.5).encode("utf-8")
        if k == 10:  # whole-file breakage
            how = rng.choice(["cut", "bytes", "empty", "foreign"])
            if how == "cut":
                return body[: rng.randrange(1, len(body) - 1)], "truncated", False
            if how == "bytes":
                p = rng.randrange(len(body))
                return body[:p] + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80"]) + body[p:], "invalid UTF-8", False
            if how == "empty":
                return rng.choice([b"", b"[]", b"{}", b"null", b"{\"sessions\": []}"]), "empty", False
            return json.dumps({"data": [1, 2]}).encode(), "foreign layout", False
        return body, label + (f" date {s['date']}" if k == 6 else ""), True
    text = json.dumps(_layout(rng, sessions))  # ASCII: a lone surrogate travels as its \\u escape
    if raw is not None:
        text = text.replace(json.dumps(_MARK), raw)
    return text.encode("utf-8"), label, False


def _read_back(tally: Tally, label: str, path: Path) -> None:
    from memkern import MemoryStore

    try:
        with MemoryStore(path) as s:
            for ns in s.namespaces():
                for r in s.get_batch([int(x) for lv in ("topic", "turn") for x in s.ids(ns, True, level=lv)]):
                    AV.assert_renders(r)
                    if r.level == "topic" and r.event_time is None:
                        raise AssertionError(f"record {r.id}: a dated session stored without its event time")
    except Exception as e:  # noqa: BLE001
        tally.fail("lost", f"{label}: ingested, then unreadable: {type(e).__name__}: {e}")


def campaign(rng: random.Random, n: int, workdir: Path) -> dict:
    tally = Tally()
    existing = workdir / "existing"
    with fake_cli_models(D):
        seed_file = workdir / "seed.json"
        seed_file.write_text(json.dumps({"sessions": [_session(rng, 0), _session(rng, 1)]}))
        code, err = cli(["ingest", str(seed_file), "--store", str(existing), "-n", "u", "--no-progress"])
        if code != 0:
            tally.fail("non_memkern_exceptions", f"seed ingest failed: {err.strip()[:300]}")
            return tally.result()
        for i in range(n):
            sessions = [_session(rng, j) for j in range(rng.randint(1, 3))]
            body, label, valid = _break(rng, sessions)
            f = workdir / f"case{i}.json"
            f.write_bytes(body)
            target = existing if rng.random() < 0.4 else workdir / f"new{i}"
            before = tree_state(target)
            tally.cases += 1
            code, err = cli(["ingest", str(f), "--store", str(target), "-n", rng.choice(["u", "v"]), "--no-progress"])
            if code == 0:
                tally.accepted += 1
                _read_back(tally, label, target)
            elif check_cli_error(tally, label, code, err):
                tally.refused += 1
                if tree_state(target) != before:
                    tally.fail("lost", f"{label}: refused but the store changed")
                if valid:
                    tally.fail("lost", f"{label}: a valid file was refused: {err.strip()[:200]}")
            if target != existing:
                import shutil

                shutil.rmtree(target, ignore_errors=True)
            f.unlink()
    return tally.result()
