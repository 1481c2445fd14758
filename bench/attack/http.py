"""Attack class ``http``: hostile requests against a real ``memkern serve`` on 127.0.0.1.

Every run draws fresh variants from ``rng``: bodies with fields of the wrong type, dropped or
added, hostile text (any script, control characters, lone surrogates as ``\\uXXXX`` escapes,
JSON- and date-looking strings, 1 MB values), dates far outside years 1-9999, big ints and
NaN / Infinity literals, metadata nested 200 deep or with 2,000 keys, random ids and scopes on
every id route, random paths, methods and headers, and raw-socket requests (garbage request
lines, oversized or truncated heads, lying ``Content-Length``, broken chunking, bodies that stop).
The server is SIGKILLed and restarted once half-way.

Counted: ``http_500`` (any 5xx but 503), ``non_memkern_exceptions`` (a 500 from a non-memkern
exception, a plain-text error, a traceback in the server's log, a dead server), ``hangs`` (no
answer within 30 s; a half-open request not closed within its timeout), ``cross_scope`` (an id
route that answered 200 for a memory outside the request's scope, a list / search result outside
it), ``lost`` (an acknowledged add / update / delete not in the store when it is reopened).

Run it: ``.venv/bin/python bench/attack/run.py --classes http --n 1000``.
"""
from __future__ import annotations

import pathlib
import random
import socket
import time

from . import _serverkit

CLASS = "http"


def _seed_foreign(store: pathlib.Path, rng: random.Random) -> dict[int, str]:
    """Records in namespaces that are not server scopes (the CLI's, a LangGraph store's)."""
    import numpy as np

    import memkern

    out = {}
    with memkern.MemoryStore(store, dim=384, metric="cos") as st:
        for ns in ("demo", "lg.users.alice", "default"):
            v = np.random.default_rng(rng.randrange(1 << 30)).standard_normal((2, 384)).astype(np.float32)
            for rid in st.add_batch(ns, [f"{ns} secret one", f"{ns} secret two"], v).tolist():
                out[int(rid)] = ns
    return out


class _Run(_serverkit.Values):
    def __init__(self, K, rng: random.Random, serve, key: str, foreign: dict[int, str]):
        import httpx

        self.K, self.rng, self.serve, self.key = K, rng, serve, key
        self.tally, self.ledger = K.Tally(), K.Ledger()
        self.foreign = foreign
        tag = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(6))
        self.tracked = [f"t{tag}{i}" for i in range(4)]  # raw adds only: every write to them is in the ledger
        self.inferred = [f"i{tag}{i}" for i in range(3)]  # infer=true adds (the decider may rewrite them)
        self.pool = self.tracked + self.inferred + ["nobody", "a" * 38]
        self.runs = [None, None, "s1", "s2"]
        self.agents = [None, None, None, "planner"]
        self.ids: list[int] = list(foreign)
        self.responses: list[str] = []
        self.known_ns: dict[int, str] = {}  # ids of inferred adds
        self.http = httpx.Client(base_url=serve.url, timeout=K.HANG_S, headers={"X-API-Key": key})

    # -------------------------------------------------------------- helpers
    def scope(self, users=None) -> dict:
        rng = self.rng
        d = {"user_id": rng.choice(users or self.pool) if rng.random() < 0.9 else None,
             "agent_id": rng.choice(self.agents), "run_id": rng.choice(self.runs)}
        if rng.random() < 0.15 and not self.clean:
            d[rng.choice(list(d))] = self.K.scope_id(rng, self.pool)
        return {k: v for k, v in d.items() if v is not None or (rng.random() < 0.1 and not self.clean)}

    def send(self, method: str, path: str, body=None, params=None, headers=None, raw: bytes | None = None):
        from urllib.parse import quote

        content = raw if raw is not None else (None if body is None else self.K.dumps(body))
        hdrs = {"content-type": "application/json", **(headers or {})}
        if params:  # encoded here: a lone surrogate goes out as its (invalid UTF-8) bytes
            path += "?" + "&".join(f"{quote(str(k).encode('utf-8', 'surrogatepass'))}="
                                   f"{quote(str(v).encode('utf-8', 'surrogatepass'))}" for k, v in params.items())
        return self.http.request(method, path, content=content, headers=hdrs)

    def judge(self, r, what: str) -> dict | None:
        """Count a bad answer; the parsed JSON body of a good one."""
        ctype = r.headers.get("content-type", "")
        if r.request.method == "HEAD":
            return None  # no body by definition
        if r.status_code >= 500 and r.status_code != 503:
            self.tally.fail("http_500", f"{what} -> {r.status_code} {r.text[:120]}")
            if "InternalServerError" in r.text or not ctype.startswith("application/json"):
                self.tally.fail("non_memkern_exceptions", f"{what} -> {r.text[:120]}")
            return None
        if r.status_code >= 400:
            if not ctype.startswith("application/json"):
                self.tally.fail("non_memkern_exceptions", f"{what} -> plain-text {r.status_code} {r.text[:80]}")
                return None
            try:
                body = r.json()
                assert isinstance(body, dict) and isinstance(body.get("detail"), str) and "error" in body
            except Exception:
                self.tally.fail("non_memkern_exceptions", f"{what} -> malformed error body {r.text[:80]}")
            return None
        if r.status_code >= 300 or r.url.path in ("/docs", "/redoc"):
            return None  # a redirect (a trailing slash), the HTML docs
        try:
            return r.json()
        except Exception:
            self.tally.fail("non_memkern_exceptions", f"{what} -> 2xx without JSON {r.text[:80]}")
            return None

    def encoded(self, scope: dict) -> str | None:
        from memkern.server import scopes as S

        try:
            return S.encode(S.make_scope(scope.get("user_id"), scope.get("agent_id"), scope.get("run_id")))
        except Exception:
            return None

    def owner_of(self, rid: int) -> str | None:
        return self.foreign.get(rid) or self.ledger.namespace(rid) or self.known_ns.get(rid)

    # -------------------------------------------------------------- cases
    def add(self) -> None:
        rng, K = self.rng, self.K
        raw = rng.random() < 0.7
        scope = self.scope(self.tracked if raw else self.inferred)
        msgs = ([{"role": rng.choice(["user", "assistant", "system", self.text()]), "content": self.text()}
                 for _ in range(rng.choice([1, 1, 2, 5, 300]))] if rng.random() < 0.6 else self.text())
        body = {"messages": msgs, "infer": not raw, **scope}
        if rng.random() < 0.4:
            body["metadata"] = self.json_value() if rng.random() < 0.5 else {"source": self.text(), "n": K.number(rng)}
        if rng.random() < 0.4:
            body["date"] = self.date()
        body = self.mutate(body, {"messages": lambda: self.json_value(), "infer": lambda: rng.choice(["yes", 1, None]),
                                    "date": lambda: self.date(), "user_id": lambda: K.scope_id(rng, self.pool)})
        if body.get("infer") is not False and body.get("user_id") in self.tracked:
            body["user_id"] = rng.choice(self.inferred)  # the decider may rewrite records: not tracked
        out = self.judge(self.send("POST", "/v1/memories", body), "add")
        if out is None:
            return
        ns = self.encoded(body)
        meta = body.get("metadata") or {}
        for res in out.get("results", []):
            rid = int(res["id"])
            self.ids.append(rid)
            if body.get("infer") is False and ns is not None and isinstance(meta, dict):
                self.ledger.added(rid, ns, res["memory"], meta)
            elif ns is not None:
                self.known_ns[rid] = ns

    def search(self) -> None:
        rng, K = self.rng, self.K
        scope = self.scope()
        body = {"query": self.text(), "limit": rng.choice([1, 5, 10, 1000, 0, 10 ** 6]), **scope}
        if rng.random() < 0.3:
            body["filters"] = rng.choice([{"source": self.text()}, {"n": {"$in": [K.number(rng)]}}, self.json_value()])
        if rng.random() < 0.3:
            body["time_range"] = [self.date(), self.date()]
            body["time_field"] = rng.choice(["event", "created", "updated", "nope", 3])
        if rng.random() < 0.2:
            body.update(recency=K.number(rng), recency_weight=K.number(rng), now=self.date())
        if rng.random() < 0.2:
            body["threshold"] = K.number(rng)
        body = self.mutate(body, {"query": lambda: self.json_value(), "limit": lambda: K.number(rng)})
        out = self.judge(self.send("POST", "/v1/memories/search", body), "search")
        self._results_in_scope(out, body, "search")

    def listing(self) -> None:
        rng = self.rng
        scope = self.scope()
        params = {k: v for k, v in scope.items() if isinstance(v, str)}
        if rng.random() < 0.5:
            params["limit"] = rng.choice(["5", "1000", "0", "-1", "abc", "1e3", str(10 ** 30)])
        out = self.judge(self.send("GET", "/v1/memories", params=params), "list")
        self._results_in_scope(out, params, "list")

    def _results_in_scope(self, out, scope: dict, what: str) -> None:
        if not out:
            return
        for res in out.get("results", []):
            if not self.K.contained(res.get("namespace"), scope):
                self.tally.fail("cross_scope", f"{what} {scope} returned {res.get('namespace')} id {res.get('id')}")

    def by_id(self) -> None:
        rng, K = self.rng, self.K
        rid = rng.choice(self.ids) if self.ids and rng.random() < 0.85 else rng.choice(
            [-1, 0, 10 ** 6, 2 ** 63, 2 ** 64, "abc", "1e3", "%00", "0x10", "１２"])
        own = self.owner_of(rid) if isinstance(rid, int) else None
        if own and rng.random() < 0.5:
            from memkern.server import scopes as S

            s = S.decode(own)
            scope = {k: v for k, v in (s.as_dict() if s else {}).items() if v is not None}
            if scope and rng.random() < 0.5:
                scope.pop(rng.choice(list(scope)))  # a containing scope
        else:
            scope = self.scope()
        params = {k: v for k, v in scope.items() if isinstance(v, str)}
        op = rng.choice(["GET", "GET", "HISTORY", "PUT", "DELETE"])
        path = f"/v1/memories/{rid}" + ("/history" if op == "HISTORY" else "")
        if op == "PUT":
            body = {**scope}
            if rng.random() < 0.8:
                body["text"] = self.text()
            if rng.random() < 0.5:
                body["metadata"] = self.json_value() if rng.random() < 0.3 else {"edited": self.text()}
            body = self.mutate(body, {"text": lambda: self.json_value()})
            if rng.random() < 0.3:
                r = self.send("PUT", path, body, params=params)
                scope = {**{k: body.get(k) for k in ("user_id", "agent_id", "run_id")}, **params}
            else:
                r = self.send("PUT", path, body)
                scope = {k: body.get(k) for k in ("user_id", "agent_id", "run_id")}
        else:
            r = self.send("GET" if op == "HISTORY" else op, path, params=params)
        out = self.judge(r, f"{op} {path}")
        if out is None or not isinstance(rid, int):
            return
        ns = own if own is not None else out.get("namespace")
        if (own is not None or "namespace" in out) and not K.contained(ns, scope):
            self.tally.fail("cross_scope", f"{op} {rid} of {ns} answered 200 to scope {scope}")
        if op == "PUT" and self.ledger.namespace(rid) is not None:
            self.ledger.updated(rid, out["memory"], out.get("metadata") or {})
        elif op == "DELETE":
            self.ledger.deleted(rid)

    def respond(self) -> None:
        rng, K = self.rng, self.K
        if self.responses and rng.random() < 0.5:
            body = {"response_id": rng.choice(self.responses + [self.text()]),
                    "rewards": [rng.choice([1.0, -1.0, 0.5, 2.0, K.number(rng)]) for _ in range(rng.choice([1, 2, 5]))]}
            self.judge(self.send("POST", "/v1/feedback", self.mutate(body, {})), "feedback")
            return
        body = {"query": self.text() if rng.random() < 0.7 else rng.choice(K.WORDS) + "?", **self.scope(self.inferred)}
        if rng.random() < 0.3:
            body["session_turns"] = [{"role": "user", "content": self.text()} for _ in range(rng.randint(1, 3))]
        body = self.mutate(body, {})
        out = self.judge(self.send("POST", "/v1/respond", body), "respond")
        if out and "response_id" in out:
            self.responses.append(out["response_id"])
            for m in out.get("memories", []):
                if not K.contained(m.get("namespace"), body):
                    self.tally.fail("cross_scope", f"respond {dict((k, body.get(k)) for k in ('user_id', 'agent_id', 'run_id'))} showed {m.get('namespace')}")

    def weird_path(self) -> None:
        rng, K = self.rng, self.K
        method = rng.choice(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"])
        path = rng.choice(["/v1/memories/", "/v1/memories//1", "/v1/memories/1/", "/v1/../v1/memories", "/%2e%2e/",
                           "/v1/memories/%ED%A0%80", "/v1/memories/" + "9" * 400, "/docs", "/openapi.json",
                           "/v1/feedback/x", "/" + "a" * 3000, "/v1/memories/search/extra", "/v1/respond?x=%FF"])
        hdrs = rng.choice([{}, {"Host": "evil.example"}, {"Origin": "null"}, {"X-API-Key": "wrong"},
                           {"Authorization": "Bearer " + "x" * 5000}, {"content-type": "text/plain"}])
        r = self.http.request(method, path, headers=hdrs, content=K.dumps(self.json_value()) if method in
                              ("POST", "PUT", "PATCH") else None)
        self.judge(r, f"{method} {path[:40]}")

    def raw(self) -> None:
        """A raw-socket request: the answer must come (or the connection close) within the
        header / body timeouts, and any error answer is JSON."""
        rng, K = self.rng, self.K
        key = self.key.encode()
        body = K.dumps({"messages": "raw hello", "user_id": rng.choice(self.inferred), "infer": False})
        choice = rng.randrange(8)
        if choice == 0:
            data = bytes(rng.randrange(256) for _ in range(rng.randint(1, 200))) + b"\r\n\r\n"
        elif choice == 1:
            data = b"POST /v1/memories HTTP/1.1\r\nHost: x\r\nX-API-Key: " + key + b"\r\ncontent-length: 100\r\n\r\n" + \
                body[:10]  # the body stops: 408 after the body timeout
        elif choice == 2:
            data = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 70_000 + b"\r\n\r\n"
        elif choice == 3:
            data = b"POST /v1/memories HTTP/1.1\r\nHost: x\r\nX-API-Key: " + key + \
                b"\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n" + body + b"\r\n0\r\n\r\n"
        elif choice == 4:
            data = b"POST /v1/memories HTTP/1.1\r\nHost: x\r\nX-API-Key: " + key + b"\r\ncontent-length: -5\r\n\r\n"
        elif choice == 5:
            data = b"GET /v1/memories?user_id=a HTTP/1.1\r\nHost: x\r\n"  # a head that never ends
        elif choice == 6:
            data = b"POST /v1/memories HTTP/1.1\r\nHost: x\r\nX-API-Key: " + key + \
                b"\r\ncontent-length: 5\r\ncontent-length: 9\r\n\r\nhello"
        else:
            data = b"GET /v1/memories/%FF%FE?user_id=%ED%A0%80 HTTP/1.1\r\nHost: x\r\nX-API-Key: " + key + b"\r\n\r\n"
        t0 = time.time()
        out = b""
        closed = False
        try:
            with socket.create_connection(("127.0.0.1", self.serve.port), timeout=12) as s:
                s.sendall(data)
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        closed = True
                        break
                    out += chunk
                    if b"\r\n\r\n" in out:
                        head, _, rest = out.partition(b"\r\n\r\n")
                        n = [int(v) for k, v in (ln.split(b":", 1) for ln in head.split(b"\r\n")[1:] if b":" in ln)
                             if k.strip().lower() == b"content-length"]
                        if n and len(rest) >= n[0]:
                            break
        except socket.timeout:
            self.tally.fail("hangs", f"raw case {choice}: no answer or close within 12 s")
            return
        except OSError:
            closed = True
        if out:
            head = out.split(b"\r\n", 1)[0]
            status = int(head.split()[1]) if len(head.split()) > 1 and head.split()[1].isdigit() else 0
            if status >= 500 and status != 503:
                self.tally.fail("http_500", f"raw case {choice} -> {head[:60]!r}")
            if status >= 400 and b"application/json" not in out.split(b"\r\n\r\n", 1)[0].lower():
                self.tally.fail("non_memkern_exceptions", f"raw case {choice} -> plain-text {head[:60]!r}")
        elif not closed:
            self.tally.fail("hangs", f"raw case {choice}: neither answered nor closed")
        if time.time() - t0 > 11:
            self.tally.fail("hangs", f"raw case {choice} took {time.time() - t0:.1f} s")

    def reconnect(self) -> None:
        import httpx

        self.http.close()
        self.http = httpx.Client(base_url=self.serve.url, timeout=self.K.HANG_S, headers={"X-API-Key": self.key})


CASES = (("add", 6), ("search", 4), ("listing", 2), ("by_id", 6), ("respond", 1), ("weird_path", 1), ("raw", 1))


def campaign(rng: random.Random, n: int, workdir: pathlib.Path) -> dict:
    """``n`` hostile requests against a fresh ``memkern serve`` in ``workdir``; the counts of
    :mod:`bench.attack` (module docstring)."""
    import httpx

    K = _serverkit
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    store = workdir / "http-store"
    foreign = _seed_foreign(store, rng)
    key = "k-" + "".join(rng.choice("0123456789abcdef") for _ in range(32))
    serve = K.Serve(workdir, store, ["--chat-model", str(K.tiny_chat(workdir)), "--header-timeout", "2",
                                     "--body-timeout", "3", "--max-respond-chars", "2000"],
                    env=dict(K.ENV, MEMKERN_API_KEY=key))
    serve.start()
    run = _Run(K, rng, serve, key, foreign)
    names = [name for name, w in CASES for _ in range(w)]
    try:
        for i in range(n):
            if i == n // 2 and n >= 20:  # a crash half-way: acknowledged writes must survive it
                serve.kill()
                serve.start()
                run.reconnect()
            run.tally.cases += 1
            name = rng.choice(names)
            run.clean = rng.random() < 0.4  # valid requests: the success paths get their share
            try:
                getattr(run, name)()
            except httpx.TimeoutException as e:
                run.tally.fail("hangs", f"{name}: no answer within {K.HANG_S:g} s ({type(e).__name__})")
            except httpx.TransportError as e:
                if not serve.alive():
                    run.tally.fail("non_memkern_exceptions", f"{name}: the server died ({e})")
                    serve.start()
                run.reconnect()
        # every tracked user's memories read back through the API, then the store itself
        for u in run.tracked:
            try:
                out = run.judge(run.send("GET", "/v1/memories", params={"user_id": u, "limit": "1000"}), "final list")
            except httpx.HTTPError as e:
                run.tally.fail("hangs" if isinstance(e, httpx.TimeoutException) else "non_memkern_exceptions",
                               f"final list of {u}: {type(e).__name__} {e}")
                continue
            if out is not None:
                got = {int(m["id"]) for m in out["results"]}
                for rid, want in run.ledger.state.items():
                    if want is not None and want[0].startswith(f"u:{u}") and rid not in got and len(got) < 1000:
                        run.tally.fail("lost", f"acknowledged {rid} missing from the list of {u}")
    finally:
        run.http.close()
        rc = serve.stop()
    if rc != 0:
        run.tally.fail("non_memkern_exceptions", f"memkern serve exited {rc} on SIGTERM")
    for tb in serve.tracebacks():
        run.tally.fail("non_memkern_exceptions", f"server log: {tb}")
    run.ledger.check(store, run.tally)
    return K.result(run.tally)

