"""Attack class ``scopes``: users of one ``memkern serve`` try to read or write each other's memory.

The store is seeded with fresh random users, each with memories in four scopes (the user, a run,
an agent, agent + run), an agent-only scope, and namespaces that are not server scopes but look
close (``demo``, ``lg.users.<user>``, ``<user>``, ``u:<user>:x:y``, ``u:<USER>``). The server runs
with an API key file: one key bound to each user, one bound to a user's run, one to an agent
only, one for any scope. Each case picks a random key, a random route (get, update, delete,
history, list, search, add, respond, feedback), a random target id (any user's, a foreign
namespace's, a deleted one, an unknown one) and a random claimed scope (none, the key's own, a
narrower one, another user's, a partial or invalid one).

Counted as ``cross_scope``: an id route answering 200 for a memory outside the effective scope
(the key's scope with the claimed ids), a list / search / respond result outside it, a 404 whose
body differs from an unknown id's (existence leaks), an add or a feedback landing outside it, and
at the end any record whose state differs from what the allowed, acknowledged writes imply.
``http_500``, ``non_memkern_exceptions``, ``hangs``, ``lost``: as in the ``http`` class.

Run it: ``.venv/bin/python bench/attack/run.py --classes scopes --n 1000``.
"""
from __future__ import annotations

import json
import pathlib
import random

from . import _serverkit

CLASS = "scopes"


def _name(rng: random.Random, n: int = 6) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(n))


def campaign(rng: random.Random, n: int, workdir: pathlib.Path) -> dict:
    """``n`` cross-user attempts against a fresh ``memkern serve`` in ``workdir``; the counts of
    :mod:`bench.attack` (module docstring)."""
    import httpx
    import numpy as np

    import memkern
    from memkern.server import scopes as S

    K = _serverkit
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    store = workdir / "scopes-store"
    tally, ledger = K.Tally(), K.Ledger()
    users = [f"{_name(rng)}{i}" for i in range(4)]
    agent, run_id = "planner" + _name(rng, 3), "s" + _name(rng, 3)
    seeded: dict[int, str] = {}
    with memkern.MemoryStore(store, dim=384, metric="cos") as st:
        vec = np.random.default_rng(rng.randrange(1 << 30))
        spaces = [S.encode(S.Scope(agent_id=agent))]
        for u in users:
            spaces += [S.encode(S.Scope(u)), S.encode(S.Scope(u, None, run_id)), S.encode(S.Scope(u, agent)),
                       S.encode(S.Scope(u, agent, run_id))]
        u0 = users[0]
        foreign = ["demo", f"lg.users.{u0}", u0, f"u:{u0}:x:y", f"u:{u0.upper()}", f"a:{agent}:u:{u0}"]
        for ns in spaces + foreign:
            texts = [f"{ns} secret {i}" for i in range(2)]
            for rid, t in zip(st.add_batch(ns, texts, vec.standard_normal((2, 384)).astype(np.float32)).tolist(),
                              texts):
                seeded[int(rid)] = ns
                ledger.added(int(rid), ns, t, {})
    keys: dict[str, S.Scope | None] = {}
    for u in users:
        keys["k-" + _name(rng, 24)] = S.Scope(u)
    keys["k-" + _name(rng, 24)] = S.Scope(users[1], None, run_id)
    keys["k-" + _name(rng, 24)] = S.Scope(agent_id=agent)
    keys["k-" + _name(rng, 24)] = None
    keyfile = workdir / "keys"
    keyfile.write_text("".join(f"{k} " + " ".join(f"{f}={v}" for f, v in (s.as_dict() if s else {}).items()
                                                    if v is not None) + "\n" for k, s in keys.items()))
    keyfile.chmod(0o600)
    serve = K.Serve(workdir, store, ["--api-key-file", str(keyfile), "--chat-model", str(K.tiny_chat(workdir)),
                                     "--max-respond-chars", "2000"], env=K.ENV)
    serve.start()
    clients = {k: httpx.Client(base_url=serve.url, timeout=K.HANG_S, headers={"X-API-Key": k}) for k in keys}
    ids = list(seeded)
    responses: list[tuple[str, str]] = []  # (key, response_id)
    touched: set[int] = set()  # ids an allowed write acknowledged
    unknown_id = 10 ** 9

    def effective(key: str, claim: dict) -> tuple[dict | None, bool]:
        """(the ids the request is held to, whether the claim conflicts with the key: 403)."""
        bound = keys[key]
        eff = {k: v for k, v in claim.items() if v is not None}
        if bound is not None:
            for k, v in bound.as_dict().items():
                if v is None:
                    continue
                if eff.get(k) not in (None, v):
                    return None, True
                eff[k] = v
        return eff, False

    def claim_for(key: str) -> dict:
        r = rng.random()
        bound = keys[key]
        if r < 0.3:
            return {}
        if r < 0.5 and bound is not None:
            return {k: v for k, v in bound.as_dict().items() if v is not None}
        if r < 0.9:
            return {k: v for k, v in {"user_id": rng.choice(users + [None]), "agent_id": rng.choice([None, agent]),
                                      "run_id": rng.choice([None, run_id])}.items() if v is not None}
        return {"user_id": rng.choice([u0.upper(), f"{u0}:x", "", "demo", "a" * 39])}

    def judge(r, what: str) -> dict | None:
        if r.status_code >= 500 and r.status_code != 503:
            tally.fail("http_500", f"{what} -> {r.status_code} {r.text[:100]}")
            return None
        if r.status_code >= 400:
            if not r.headers.get("content-type", "").startswith("application/json"):
                tally.fail("non_memkern_exceptions", f"{what} -> plain-text {r.status_code}")
            return None
        try:
            return r.json()
        except ValueError:
            tally.fail("non_memkern_exceptions", f"{what} -> 2xx without JSON")
            return None

    def params(claim: dict) -> dict:
        return {k: v for k, v in claim.items() if isinstance(v, str)}

    try:
        for _ in range(n):
            tally.cases += 1
            key = rng.choice(list(keys))
            c = clients[key]
            claim = claim_for(key)
            eff, conflict = effective(key, claim)
            op = rng.choice(["get", "get", "history", "put", "delete", "list", "search", "add", "respond", "feedback"])
            try:
                if op in ("get", "history", "put", "delete"):
                    target = rng.choice(ids) if rng.random() < 0.9 else unknown_id
                    path = f"/v1/memories/{target}" + ("/history" if op == "history" else "")
                    if op == "put":
                        r = c.put(path, json={"text": f"edited by {key[:6]} {_name(rng)}", **params(claim)})
                    else:
                        r = c.request("GET" if op == "history" else op.upper(), path, params=params(claim))
                    out = judge(r, f"{op} {target}")
                    ns = ledger.namespace(target) or seeded.get(target)
                    allowed = not conflict and bool(eff) and K.contained(ns, eff)
                    if out is not None and not allowed:
                        tally.fail("cross_scope", f"{op} {target} ({ns}) answered 200 to key {keys[key]} claim {claim}")
                    if r.status_code == 404:  # the same body as an id that never existed
                        ref_path = f"/v1/memories/{unknown_id}" + ("/history" if op == "history" else "")
                        ref = c.request("GET" if op in ("get", "history") else op.upper(), ref_path, params=params(claim),
                            **({"json": {"text": "x", **params(claim)}} if op == "put" else {}))
                        if r.json() != json.loads(json.dumps(ref.json()).replace(str(unknown_id), str(target))):
                            tally.fail("cross_scope", f"{op} {target}: its 404 {r.json()} differs from an unknown "
                                                      f"id's {ref.status_code} {ref.json()}")
                    if out is not None and allowed:
                        touched.add(target)
                        if op == "put":
                            ledger.updated(target, out["memory"], out.get("metadata") or {})
                        elif op == "delete":
                            ledger.deleted(target)
                elif op in ("list", "search"):
                    if op == "list":
                        r = c.get("/v1/memories", params={**params(claim), "limit": "1000"})
                    else:
                        r = c.post("/v1/memories/search", json={"query": "secret", "limit": 50, **params(claim)})
                    out = judge(r, op)
                    if out is not None:
                        if conflict:
                            tally.fail("cross_scope", f"{op}: answered 200 to a claim {claim} outside key {keys[key]}")
                        for m in out.get("results", []):
                            if not K.contained(m.get("namespace"), eff or {}):
                                tally.fail("cross_scope", f"{op} for {eff} returned {m.get('namespace')}")
                elif op == "add":
                    r = c.post("/v1/memories", json={"messages": f"note {_name(rng)}", "infer": False, **params(claim)})
                    out = judge(r, "add")
                    if out is not None:
                        want = None if conflict or not eff else S.encode(S.make_scope(**eff))
                        for res in out["results"]:
                            rid = int(res["id"])
                            ids.append(rid)
                            if want is None:
                                tally.fail("cross_scope", f"add answered 200 to claim {claim} of key {keys[key]}")
                            ledger.added(rid, want or "?", res["memory"], {})
                elif op == "respond":
                    r = c.post("/v1/respond", json={"query": "what secret?", **params(claim)})
                    out = judge(r, "respond")
                    if out is not None:
                        for m in out.get("memories", []):
                            if not K.contained(m.get("namespace"), eff or {}):
                                tally.fail("cross_scope", f"respond for {eff} showed {m.get('namespace')}")
                        responses.append((S.encode(S.make_scope(**eff)), out["response_id"]))
                elif op == "feedback" and responses:
                    resp_ns, resp = rng.choice(responses)
                    r = c.post("/v1/feedback", json={"response_id": resp, "rewards": [1.0] * rng.choice([1, 2, 3, 5])})
                    out = judge(r, "feedback")
                    if out is not None and keys[key] is not None and not K.contained(
                            resp_ns, {k: v for k, v in keys[key].as_dict().items() if v is not None}):
                        tally.fail("cross_scope", f"feedback by {keys[key]} on a response of {resp_ns} accepted")
            except httpx.TimeoutException:
                tally.fail("hangs", f"{op}: no answer within {K.HANG_S:g} s")
            except httpx.TransportError as e:
                if not serve.alive():
                    tally.fail("non_memkern_exceptions", f"{op}: the server died ({e})")
                    serve.start()
    finally:
        for c in clients.values():
            c.close()
        rc = serve.stop()
    if rc != 0:
        tally.fail("non_memkern_exceptions", f"memkern serve exited {rc} on SIGTERM")
    for tb in serve.tracebacks():
        tally.fail("non_memkern_exceptions", f"server log: {tb}")
    # every record as the allowed writes left it: a seeded record changed without one was written
    # across scopes; an allowed, acknowledged write missing is lost
    with memkern.MemoryStore(store) as st:
        for rid, want in ledger.state.items():
            try:
                rec = st.get(rid)
                got = (rec.namespace, rec.summary, dict(rec.meta or {}))
            except KeyError:
                got = None
            if got != want:
                kind = "cross_scope" if rid in seeded and rid not in touched else "lost"
                tally.fail(kind, f"record {rid}: expected {want!r:.100}, found {got!r:.100}")
    return K.result(tally)

