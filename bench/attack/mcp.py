"""Attack class ``mcp``: hostile JSON-RPC lines against a real ``memkern mcp`` over stdio.

Every run draws fresh variants from ``rng``: tool calls with arguments of the wrong type
(``date=true``, ``infer="yes"``), dropped or unknown arguments, hostile text (lone surrogates as
``\\uXXXX`` escapes, any script, 1 MB values), far dates, big ints, NaN / Infinity literals,
metadata nested 200 deep, random ids and scopes on the id tools; and lines the protocol layer
cannot read: invalid UTF-8 bytes, JSON nested 100,000 deep, lines over the size limit, truncated
lines, non-objects, notifications, unknown tools and methods, odd request ids. The server is
SIGKILLed and restarted once half-way.

Counted: ``hangs`` (a request with an id that gets no reply within 30 s), ``non_memkern_exceptions``
(an ``internal error`` tool result or JSON-RPC error -32603, a line on stdout that is not JSON, a
traceback in the server's stderr, a dead server, a non-zero exit at EOF), ``cross_scope`` (an id
tool that succeeded on a memory outside the call's scope, a list / search result outside it),
``lost`` (an acknowledged add / update / delete missing when the store is reopened). ``http_500``
stays 0 (no HTTP here).

Run it: ``.venv/bin/python bench/attack/run.py --classes mcp --n 1000``.
"""
from __future__ import annotations

import json
import pathlib
import random
import subprocess
import sys
import threading
import time

from . import _serverkit

CLASS = "mcp"


class _Proc:
    """``memkern mcp`` with a reader thread collecting its replies by id."""

    def __init__(self, K, workdir: pathlib.Path, store: pathlib.Path, chat: pathlib.Path):
        self.K, self.workdir, self.store, self.chat = K, workdir, store, chat
        self.logs: list[pathlib.Path] = []
        self.bad_lines: list[bytes] = []
        self.p: subprocess.Popen | None = None

    def start(self) -> None:
        log = self.workdir / f"mcp-{len(self.logs)}.log"
        self.logs.append(log)
        self.replies: dict = {}
        self.cv = threading.Condition()
        self.p = subprocess.Popen(
            [sys.executable, "-m", "memkern", "mcp", "--store", str(self.store), "--threads", "1",
             "--max-body-bytes", str(self.K.MAX_BODY), "--chat-model", str(self.chat), "--max-respond-chars", "2000"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(log, "w"), env=self.K.ENV)
        threading.Thread(target=self._read, args=(self.p,), daemon=True).start()
        self.send_obj({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "attack", "version": "1"}}})
        if self.wait("init", 240) is None:
            raise RuntimeError(f"memkern mcp did not start: {log.read_text()[-2000:]}")
        self.send_obj({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def _read(self, p) -> None:
        for line in p.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                self.bad_lines.append(line[:200])
                continue
            key = json.dumps(msg.get("id")) if isinstance(msg, dict) else None
            with self.cv:
                self.replies[key] = msg
                self.cv.notify_all()

    def alive(self) -> bool:
        return self.p is not None and self.p.poll() is None

    def send(self, line: bytes) -> bool:
        try:
            self.p.stdin.write(line + b"\n")
            self.p.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def send_obj(self, obj) -> bool:
        return self.send(self.K.dumps(obj))

    def wait(self, rid, timeout: float):
        key = json.dumps(rid)
        deadline = time.time() + timeout
        with self.cv:
            while key not in self.replies:
                left = deadline - time.time()
                if left <= 0 or not self.alive():
                    return None
                self.cv.wait(min(left, 0.5))
            return self.replies.pop(key)

    def kill(self) -> None:
        if self.alive():
            self.p.kill()
            self.p.wait(30)

    def close(self) -> int:
        if not self.alive():
            return self.p.returncode
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            return self.p.wait(60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            return -9


class _Run(_serverkit.Values):
    def __init__(self, K, rng: random.Random, proc: _Proc, foreign: dict[int, str]):
        self.K, self.rng, self.proc = K, rng, proc
        self.tally, self.ledger = K.Tally(), K.Ledger()
        self.foreign = foreign
        tag = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(6))
        self.tracked = [f"t{tag}{i}" for i in range(3)]
        self.inferred = [f"i{tag}{i}" for i in range(3)]
        self.pool = self.tracked + self.inferred + ["nobody"]
        self.ids: list[int] = list(foreign)
        self.known_ns: dict[int, str] = {}
        self.responses: list[str] = []
        self.next_id = 0

    def scope(self, users=None) -> dict:
        rng = self.rng
        d = {"user_id": rng.choice(users or self.pool) if rng.random() < 0.9 else None,
             "agent_id": rng.choice([None, None, "planner"]), "run_id": rng.choice([None, None, "s1"])}
        if rng.random() < 0.15 and not self.clean:
            d[rng.choice(list(d))] = self.K.scope_id(rng, self.pool)
        return {k: v for k, v in d.items() if v is not None or (rng.random() < 0.1 and not self.clean)}

    def rid(self):
        self.next_id += 1
        return self.rng.choice([self.next_id, self.next_id, f"r{self.next_id}", f"ü-{self.next_id}",
                                -self.next_id, 2 ** 70 + self.next_id])

    # -------------------------------------------------------------- tool arguments
    def call(self) -> tuple[str, dict, dict]:
        """(tool, arguments, what to check on success)."""
        rng, K = self.rng, self.K
        tool = rng.choice(["add_memory"] * 5 + ["search_memories"] * 3 + ["list_memories"] +
                          ["get_memory", "update_memory", "delete_memory", "memory_history"] * 2 +
                          ["respond", "feedback", "no_such_tool"])
        info: dict = {}
        if tool == "add_memory":
            raw = rng.random() < 0.7
            scope = self.scope(self.tracked if raw else self.inferred)
            msgs = ([{"role": "user", "content": self.text()} for _ in range(rng.choice([1, 2, 4]))]
                    if rng.random() < 0.5 else self.text())
            args = {"messages": msgs, "infer": not raw, **scope}
            if rng.random() < 0.4:
                args["metadata"] = self.json_value() if rng.random() < 0.5 else {"source": self.text()}
            if rng.random() < 0.4:
                args["date"] = self.date()
            args = self.mutate(args, {"infer": lambda: rng.choice(["yes", 1, "true", None]),
                                        "date": lambda: rng.choice([True, "yes", [1]]),
                                        "messages": lambda: self.json_value()})
            if args.get("infer") is not False and args.get("user_id") in self.tracked:
                args["user_id"] = rng.choice(self.inferred)
        elif tool in ("search_memories", "list_memories"):
            args = {**self.scope()}
            if tool == "search_memories":
                args["query"] = self.text()
                if rng.random() < 0.3:
                    args["time_range"] = [self.date(), self.date()]
                if rng.random() < 0.3:
                    args["filters"] = self.json_value()
            if rng.random() < 0.4:
                args["limit"] = rng.choice([1, 10, 0, "5", 10 ** 9, 2.5, True])
            args = self.mutate(args, {"time_field": lambda: rng.choice(["event", 3, ["x"]]),
                                        "recency": lambda: K.number(rng)})
        elif tool in ("get_memory", "update_memory", "delete_memory", "memory_history"):
            mid = rng.choice(self.ids) if self.ids and rng.random() < 0.85 else rng.choice(
                [-1, 10 ** 7, 2 ** 64, "3", 1.0, True, None])
            own = self.owner(mid) if isinstance(mid, int) and not isinstance(mid, bool) else None
            if own and rng.random() < 0.5:
                from memkern.server import scopes as S

                s = S.decode(own)
                scope = {k: v for k, v in (s.as_dict() if s else {}).items() if v is not None}
            else:
                scope = self.scope()
            args = {"memory_id": mid, **scope}
            if tool == "update_memory":
                if rng.random() < 0.8:
                    args["text"] = self.text()
                if rng.random() < 0.4:
                    args["metadata"] = {"edited": self.text()}
            args = self.mutate(args, {"memory_id": lambda: self.json_value()})
            info = {"mid": mid, "own": own}
        elif tool == "respond":
            args = self.mutate({"query": self.text(), **self.scope(self.inferred)}, {})
        elif tool == "feedback":
            args = {"response_id": rng.choice(self.responses + [self.text()]),
                    "rewards": [rng.choice([1.0, -1.0, 2.0, "x"]) for _ in range(rng.choice([1, 2]))]}
        else:
            args = {"x": 1}
        return tool, args, info

    def owner(self, mid: int) -> str | None:
        return self.foreign.get(mid) or self.ledger.namespace(mid) or self.known_ns.get(mid)

    def encoded(self, scope: dict) -> str | None:
        from memkern.server import scopes as S

        try:
            return S.encode(S.make_scope(scope.get("user_id"), scope.get("agent_id"), scope.get("run_id")))
        except Exception:
            return None

    # -------------------------------------------------------------- one case
    def case(self) -> None:
        rng, K = self.rng, self.K
        self.clean = rng.random() < 0.4  # valid arguments: the success paths get their share
        tool, args, info = self.call()
        rid = self.rid()
        line = K.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                        "params": {"name": tool, "arguments": args}})
        expect = True
        kind = "call"
        r = 1.0 if self.clean else rng.random()
        if r < 0.06:  # invalid UTF-8 inside a string
            i = line.find(b'"arguments"')
            line = line[:i] + b'"\xff\xfe":1,' + line[i:]
            kind = "bad-utf8"
        elif r < 0.09:
            i = line.find(b'"arguments":') + len(b'"arguments":')
            line = line[:i] + b'{"deep":' + b"[" * 100_000 + b"]" * 100_000 + b"," + line[i + 1:]
            kind = "deep"
        elif r < 0.12:
            i = line.find(b'"arguments":') + len(b'"arguments":')
            pad = b'"' + b"v" * (K.MAX_BODY + rng.randint(1, 3 * K.MAX_BODY)) + b'"'
            line = line[:i] + b'{"pad":' + pad + b"," + line[i + 1:]
            kind = "oversize"
        elif r < 0.15:  # truncated: a reply is due only if the id was written whole
            end_of_id = line.find(b',"method"')
            cut = rng.randint(1, len(line) - 1)
            line = line[:cut]
            expect = cut >= end_of_id
            kind = "truncated"
        elif r < 0.17:
            line = rng.choice([b"[1, 2, 3]", b"null", b"\"str\"", b"{}", b"garbage", b'{"jsonrpc":"2.0"}'])
            expect = False
            kind = "non-request"
        elif r < 0.19:
            line = K.dumps({"jsonrpc": "2.0", "method": "notifications/" + rng.choice(["x", "cancelled"]),
                            "params": {"requestId": 99999}})
            expect = False
            kind = "notification"
        elif r < 0.21:
            line = K.dumps({"jsonrpc": "2.0", "id": rid, "method": rng.choice(["nope", "tools/nope", "resources/read"]),
                            "params": {"uri": self.text()}})
            kind = "method"
        if not self.proc.send(line):
            self.tally.fail("non_memkern_exceptions", f"{kind} {tool}: stdin closed (the server died)")
            self.restart()
            return
        if not expect:
            return
        msg = self.proc.wait(rid, K.HANG_S)
        if msg is None:
            if not self.proc.alive():
                self.tally.fail("non_memkern_exceptions", f"{kind} {tool}: the server died")
                self.restart()
            else:
                self.tally.fail("hangs", f"{kind} {tool} id={rid!r}: no reply within {K.HANG_S:g} s")
            return
        if "error" in msg:
            if msg["error"].get("code") == -32603:
                self.tally.fail("non_memkern_exceptions", f"{kind} {tool} -> {msg['error']}")
            return
        result = msg.get("result") or {}
        texts = [c.get("text", "") for c in result.get("content", []) if isinstance(c, dict)]
        if result.get("isError"):
            if any(t.startswith("internal error") for t in texts):
                self.tally.fail("non_memkern_exceptions", f"{kind} {tool} -> {texts[0][:150]}")
            return
        if kind != "call" or not texts:
            return
        try:
            out = json.loads(texts[0])
        except ValueError:
            self.tally.fail("non_memkern_exceptions", f"{tool} -> a result that is not JSON: {texts[0][:80]}")
            return
        self.record(tool, args, info, out)

    def record(self, tool: str, args: dict, info: dict, out: dict) -> None:
        K = self.K
        if tool == "add_memory":
            ns = self.encoded(args)
            meta = args.get("metadata") or {}
            for res in out.get("results", []):
                rid = int(res["id"])
                self.ids.append(rid)
                if args.get("infer") is False and ns is not None and isinstance(meta, dict):
                    self.ledger.added(rid, ns, res["memory"], meta)
                elif ns is not None:
                    self.known_ns[rid] = ns
        elif tool in ("search_memories", "list_memories"):
            for res in out.get("results", []):
                if not K.contained(res.get("namespace"), args):
                    self.tally.fail("cross_scope", f"{tool} {args.get('user_id')!r} returned {res.get('namespace')}")
        elif tool in ("get_memory", "update_memory", "delete_memory", "memory_history"):
            mid, own = info.get("mid"), info.get("own")
            ns = own if own is not None else out.get("namespace")
            if (own is not None or "namespace" in out) and not K.contained(ns, args):
                self.tally.fail("cross_scope", f"{tool} {mid} of {ns} succeeded for {args}")
            if tool == "update_memory" and isinstance(mid, int) and self.ledger.namespace(mid) is not None:
                self.ledger.updated(mid, out["memory"], out.get("metadata") or {})
            elif tool == "delete_memory" and isinstance(mid, int):
                self.ledger.deleted(mid)
        elif tool == "respond" and "response_id" in out:
            self.responses.append(out["response_id"])

    def restart(self) -> None:
        self.proc.kill()
        self.proc.start()


def campaign(rng: random.Random, n: int, workdir: pathlib.Path) -> dict:
    """``n`` hostile lines against a fresh ``memkern mcp`` in ``workdir``; the counts of
    :mod:`bench.attack` (module docstring)."""
    K = _serverkit
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    store = workdir / "mcp-store"
    import numpy as np

    import memkern

    foreign = {}
    with memkern.MemoryStore(store, dim=384, metric="cos") as st:
        for ns in ("demo", "lg.users.alice", "u:someone"):
            v = np.random.default_rng(rng.randrange(1 << 30)).standard_normal((1, 384)).astype(np.float32)
            foreign[int(st.add_batch(ns, [f"{ns} secret"], v)[0])] = ns
    proc = _Proc(K, workdir, store, K.tiny_chat(workdir))
    proc.start()
    run = _Run(K, rng, proc, foreign)
    try:
        for i in range(n):
            if i == n // 2 and n >= 20:
                proc.kill()
                proc.start()
            run.tally.cases += 1
            run.case()
    finally:
        rc = proc.close()
    if rc != 0:
        run.tally.fail("non_memkern_exceptions", f"memkern mcp exited {rc} at the end of its input")
    for line in proc.bad_lines:
        run.tally.fail("non_memkern_exceptions", f"a stdout line that is not JSON: {line[:80]!r}")
    for log in proc.logs:
        for tb in K.tracebacks(log):
            run.tally.fail("non_memkern_exceptions", f"server log: {tb}")
    run.ledger.check(store, run.tally)
    return K.result(run.tally)

