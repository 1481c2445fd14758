"""``memkern mcp``: the :class:`~memkern.server.service.MemoryService` operations as MCP tools, over stdio.

Tools (arguments as in the HTTP API, :mod:`memkern.server.app`): ``add_memory``,
``search_memories``, ``list_memories``, ``get_memory``, ``update_memory``, ``delete_memory``,
``memory_history``, ``respond``, ``feedback``. ``add_memory`` takes the conversation's ``date``;
``search_memories`` and ``respond`` take ``filters`` (or ``filter``), ``time_range``, ``time_field``,
``recency``, ``recency_weight`` and ``now``, and ``search_memories`` ``mode`` (``"dense"``,
``"lexical"``, ``"hybrid"``), ``fusion`` and ``lexical_weight`` (meaning and defaults as in
:meth:`memkern.MemoryStore.search`). :func:`build_server` starts loading the models
(:meth:`MemoryService.start_loading`). The tools that take a memory id
(``get_memory``, ``update_memory``, ``delete_memory``, ``memory_history``) need its scope too and
reach only a memory of that scope. Every tool returns the same JSON object as the HTTP route.

Arguments are taken as sent, never coerced: the service checks each one (``infer="yes"`` or
``date=true`` is an error, not ``True`` / ``1.0``), an argument the tool does not have is an error,
and nothing is written when one is refused; the tool error's text names it (``user_id: expected
...``). A request the protocol layer cannot read (a lone surrogate escape such as ``"\\ud800"``,
invalid UTF-8, JSON nested too deep, a line over ``limits.max_body_bytes``) is answered too: a tool
error for a ``tools/call``, a JSON-RPC error otherwise, so a client never waits on it. Built with
the ``mcp`` package (``pip install memkern[serve]``).
"""
import functools
import inspect
import json
import logging
import os
import re
from typing import Any, Optional, Union

from ..errors import MemkernError
from .search_args import DEFAULT_FUSION, DEFAULT_LEXICAL_WEIGHT
from .service import MemoryService

log = logging.getLogger("memkern")

INSTRUCTIONS = (
    "Long-term memory (memkern). Memories belong to a scope: user_id, agent_id and/or run_id (at least one; "
    "1-38 characters of A-Z a-z 0-9 _ - . @). add_memory stores a conversation (infer=true extracts topics and "
    "merges them with what is known; infer=false stores the messages as they are); search_memories finds the "
    "most relevant ones; respond answers a question from them with citations. get_memory, update_memory, "
    "delete_memory and memory_history take the memory's scope with its id."
)

TOOL_NAMES = ("add_memory", "search_memories", "list_memories", "get_memory", "update_memory", "delete_memory",
              "memory_history", "respond", "feedback")
#: The tools that change the store or its rerankers (not served on a read-only store).
WRITE_TOOLS = frozenset({"add_memory", "update_memory", "delete_memory", "respond", "feedback"})

#: Longest tool error text sent (a rejected large value is not echoed back whole).
MAX_ERROR_CHARS = 2000


def _wire_text(text: str) -> str:
    """``text`` as it can go on the wire: any lone surrogate written as a ``\\udXXX`` escape."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _error_text(text: str) -> str:
    if len(text) > MAX_ERROR_CHARS:
        text = text[:MAX_ERROR_CHARS] + f"... ({len(text)} characters)"
    return _wire_text(text)


def build_server(service: MemoryService):
    """An MCP server exposing ``service`` (run it with :func:`run_stdio`; ``.run()`` also works but
    without the checks of unreadable requests)."""
    import anyio
    from mcp.server.mcpserver import MCPServer  # mcp >= 2
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp_types import CallToolResult, TextContent

    tools: dict[str, tuple[Any, frozenset, tuple]] = {}
    # A read-only store (`memkern mcp --read-only`, beside a process that writes it): the read
    # tools only, each call on the view brought up to date first (MemoryStore.refresh).
    read_only = bool(getattr(service.store, "read_only", False))

    class StrictServer(MCPServer):
        """Tool arguments checked by the service alone: no coercion, no JSON strings parsed into
        lists, no unknown argument dropped."""

        async def call_tool(self, name, arguments, context=None):
            spec = tools.get(name)
            if spec is None:
                return await super().call_tool(name, arguments, context)
            fn, params, required = spec
            if not isinstance(arguments, dict):
                raise ToolError(_error_text(f"arguments: expected a JSON object, got {type(arguments).__name__}"))
            unknown = sorted(set(arguments) - params)
            if unknown:
                raise ToolError(_error_text(f"{unknown[0]!r}: expected one of the arguments of {name} "
                                            f"({', '.join(sorted(params))}), got an unknown argument"))
            missing = [p for p in required if p not in arguments]
            if missing:
                raise ToolError(f"{missing[0]}: expected a value (a required argument of {name}), got none")
            try:
                if read_only:
                    await anyio.to_thread.run_sync(service.store.refresh)
                result = await anyio.to_thread.run_sync(functools.partial(fn, **arguments))
            except MemkernError as e:
                msg = e.args[0] if isinstance(e, KeyError) and len(e.args) == 1 else str(e)
                raise ToolError(_error_text(f"{type(e).__name__}: {msg}")) from None
            except Exception as e:
                log.exception("mcp: tool %s failed", name)
                raise ToolError(f"internal error: {type(e).__name__}") from None
            text = _wire_text(json.dumps(result, indent=2, ensure_ascii=False))
            return CallToolResult(content=[TextContent(type="text", text=text)])

    server = StrictServer("memkern", instructions=INSTRUCTIONS)

    def tool(fn):
        """Register ``fn`` (its signature is the tool's schema; :class:`StrictServer` calls it)."""
        if read_only and fn.__name__ in WRITE_TOOLS:
            return fn
        sig = inspect.signature(fn)
        required = tuple(p.name for p in sig.parameters.values() if p.default is inspect.Parameter.empty)
        tools[fn.__name__] = (fn, frozenset(sig.parameters), required)
        return server.tool()(fn)

    @tool
    def add_memory(messages: Union[str, list[dict[str, Any]]], user_id: Optional[str] = None,
                   agent_id: Optional[str] = None, run_id: Optional[str] = None,
                   metadata: Optional[dict[str, Any]] = None, infer: bool = True,
                   date: Optional[Union[float, str]] = None) -> dict:
        """Add a conversation (a list of {"role", "content"} messages, or one user message) to a scope's memory;
        date: when the conversation happened (unix seconds or a date string such as "2023-05-08")."""
        return service.add(messages, user_id=user_id, agent_id=agent_id, run_id=run_id, metadata=metadata,
                           infer=infer, date=date)

    @tool
    def search_memories(query: str, user_id: Optional[str] = None, agent_id: Optional[str] = None,
                        run_id: Optional[str] = None, limit: int = 10,
                        filters: Optional[dict[str, Any]] = None,
                        time_range: Optional[list[Optional[Union[float, str]]]] = None, time_field: str = "event",
                        recency: Optional[float] = None, recency_weight: float = 0.1,
                        now: Optional[float] = None, mode: str = "dense", fusion: str = DEFAULT_FUSION,
                        lexical_weight: float = DEFAULT_LEXICAL_WEIGHT,
                        filter: Optional[dict[str, Any]] = None) -> dict:
        """The memories most relevant to query, in every scope containing the given ids, best first.
        mode: "dense" (embeddings), "lexical" (BM25 over the query's words) or "hybrid" (both, fused by fusion:
        "coverage", "rrf" or "weighted", the lexical list weighted lexical_weight); filters (or filter):
        {"key": value} or {"key": {"$in": [values]}} on metadata; time_range: [start, end) as dates or
        unix seconds (null: open); time_field: "event" (conversation date), "created" or "updated"; recency:
        half-life in seconds of a recency prior of weight recency_weight, measured from now."""
        return service.search(query, user_id=user_id, agent_id=agent_id, run_id=run_id, limit=limit, filters=filters,
                              time_range=time_range, time_field=time_field, recency=recency,
                              recency_weight=recency_weight, now=now, mode=mode, fusion=fusion,
                              lexical_weight=lexical_weight, filter=filter)

    @tool
    def list_memories(user_id: Optional[str] = None, agent_id: Optional[str] = None, run_id: Optional[str] = None,
                      limit: int = 100) -> dict:
        """Every memory of the scopes containing the given ids."""
        return service.list(user_id=user_id, agent_id=agent_id, run_id=run_id, limit=limit)

    @tool
    def get_memory(memory_id: int, user_id: Optional[str] = None, agent_id: Optional[str] = None,
                   run_id: Optional[str] = None) -> dict:
        """One memory by id, of the given scope."""
        return service.get(memory_id, user_id=user_id, agent_id=agent_id, run_id=run_id)

    @tool
    def update_memory(memory_id: int, text: Optional[str] = None, metadata: Optional[dict[str, Any]] = None,
                      user_id: Optional[str] = None, agent_id: Optional[str] = None,
                      run_id: Optional[str] = None) -> dict:
        """Replace a memory's text and/or metadata (a new version; the old one stays in its history)."""
        return service.update(memory_id, text=text, metadata=metadata, user_id=user_id, agent_id=agent_id,
                              run_id=run_id)

    @tool
    def delete_memory(memory_id: int, user_id: Optional[str] = None, agent_id: Optional[str] = None,
                      run_id: Optional[str] = None) -> dict:
        """Delete a memory of the given scope."""
        return service.delete(memory_id, user_id=user_id, agent_id=agent_id, run_id=run_id)

    @tool
    def memory_history(memory_id: int, user_id: Optional[str] = None, agent_id: Optional[str] = None,
                       run_id: Optional[str] = None) -> dict:
        """Every version of a memory of the given scope, oldest first."""
        return service.history(memory_id, user_id=user_id, agent_id=agent_id, run_id=run_id)

    @tool
    def respond(query: str, user_id: Optional[str] = None, agent_id: Optional[str] = None,
                run_id: Optional[str] = None, filters: Optional[dict[str, Any]] = None,
                time_range: Optional[list[Optional[Union[float, str]]]] = None, time_field: str = "event",
                recency: Optional[float] = None, recency_weight: float = 0.1, now: Optional[float] = None,
                filter: Optional[dict[str, Any]] = None) -> dict:
        """Answer query from the scope's memories (RMM: retrieve, rerank, answer with citations); filters and
        time arguments as in search_memories limit the memories it may use."""
        return service.respond(query, user_id=user_id, agent_id=agent_id, run_id=run_id, filters=filters,
                               time_range=time_range, time_field=time_field, recency=recency,
                               recency_weight=recency_weight, now=now, filter=filter)

    @tool
    def feedback(response_id: str, rewards: list[float]) -> dict:
        """Rewards in [-1, 1] for the memories an earlier respond showed (in order): trains the reranker. Once
        per response."""
        return service.feedback(response_id, rewards)

    assert sorted(tools) == sorted(set(TOOL_NAMES) - (WRITE_TOOLS if read_only else set()))
    service.start_loading()  # the models load while the client connects; a tool call that needs one waits
    server.memkern_max_message_bytes = service.limits.max_body_bytes
    return server


# ------------------------------------------------------------------ stdio with unreadable requests answered
class _TopLevel:
    """The top-level ``"id"`` and ``"method"`` of a JSON object fed in chunks, nested values
    skipped unparsed: how a request the parser refuses (too large, nested too deep, a lone
    surrogate) is still answered. Linear in the input; keeps at most 512 bytes of a token."""

    _IN_STRING = re.compile(rb'["\\]')
    _NESTED = re.compile(rb'["{}\[\]]')
    _KEEP = 512

    def __init__(self):
        self.depth = 0
        self.in_str = False
        self.esc = False
        self.expect = "key"  # at depth 1: "key", "colon", "value" or "comma"
        self.token: bytearray | None = None  # the depth-1 key / value being read
        self.scalar = False  # the token is a number / true / false / null
        self.key: str | None = None
        self.found: dict[str, Any] = {}

    def _take(self, b: bytes) -> None:
        if self.token is not None and len(self.token) < self._KEEP:
            self.token += b[: self._KEEP - len(self.token)]

    def _end_token(self, quoted: bool) -> None:
        raw, self.token, self.scalar = self.token, None, False
        if raw is None:
            return
        try:
            value = json.loads(b'"' + bytes(raw) + b'"' if quoted else bytes(raw))
        except (ValueError, RecursionError):
            value = None
        if self.expect == "key":
            self.key = value if isinstance(value, str) else None
            self.expect = "colon"
        else:
            if self.key in ("id", "method") and self.key not in self.found:
                self.found[self.key] = value
            self.expect = "comma"

    def feed(self, data: bytes) -> None:
        i, n = 0, len(data)
        while i < n:
            if self.in_str:
                if self.esc:
                    self.esc = False
                    if self.depth == 1:
                        self._take(data[i:i + 1])
                    i += 1
                    continue
                m = self._IN_STRING.search(data, i)
                j = n if m is None else m.start()
                if self.depth == 1:
                    self._take(data[i:j])
                if m is None:
                    return
                if data[j] == 0x5C:  # backslash: the next byte is escaped
                    if self.depth == 1:
                        self._take(b"\\")
                    self.esc = True
                    i = j + 1
                    continue
                self.in_str = False
                i = j + 1
                if self.depth == 1:
                    self._end_token(quoted=True)
                continue
            if self.depth != 1:
                m = self._NESTED.search(data, i)
                if m is None:
                    return
                c, i = data[m.start()], m.start() + 1
                if c == 0x22:
                    self.in_str = True
                elif c in b"{[":
                    self.depth += 1
                else:
                    self.depth -= 1
                    if self.depth == 1:
                        self.expect = "comma"  # a nested value ended
                    elif self.depth <= 0:
                        return
                continue
            c = data[i]
            i += 1
            if self.scalar and c in b" \t\r\n,}]":
                self._end_token(quoted=False)
            if c in b" \t\r\n":
                continue
            if c == 0x22:
                self.in_str = True
                self.token = bytearray() if self.expect in ("key", "value") else None
            elif c == 0x3A:
                self.expect = "value"
            elif c == 0x2C:
                self.expect = "key"
            elif c in b"{[":
                self.depth += 1
            elif c in b"}]":
                self.depth -= 1
                return
            elif self.expect == "value":
                if not self.scalar:
                    self.scalar, self.token = True, bytearray()
                self._take(bytes([c]))


def _first_surrogate(value: Any, path: str) -> tuple[str, str] | None:
    """``(path, detail)`` of the first str (or key) in ``value`` that holds a lone surrogate."""
    stack = [(value, path)]
    while stack:
        v, p = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                return p, f"{v[e.start:e.end]!r} at index {e.start}"
        elif isinstance(v, dict):
            for k, item in reversed(list(v.items())):
                found = _first_surrogate(k, f"{p} key")
                if found:
                    return found
                stack.append((item, f"{p}[{k!r}]" if p else k))
        elif isinstance(v, list):
            stack.extend((item, f"{p}[{i}]") for i, item in reversed(list(enumerate(v))))
    return None


def _refusal(raw: bytes, oversize: int | None, limit: int, ids: dict) -> str:
    """Why the protocol layer refuses a line (``ids``: its top-level ``id`` / ``method`` if known)."""
    if oversize is not None:
        return f"request: expected a message of at most {limit} bytes, got {oversize} bytes"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"request: expected UTF-8, got byte {raw[e.start:e.start + 1]!r} at offset {e.start}"
    try:
        obj = json.loads(text)
    except RecursionError:
        return "request: expected JSON nested at most a few hundred levels deep, got deeper"
    except ValueError as e:
        return f"request: expected a JSON-RPC message (JSON), got one the parser refuses: {str(e)[:200]}"
    if isinstance(obj, dict):
        args = (obj.get("params") or {}).get("arguments") if isinstance(obj.get("params"), dict) else None
        found = _first_surrogate(args, "") if isinstance(args, dict) else None
        if found:
            return f"{found[0]}: expected text encodable as UTF-8 (no lone surrogates), got {found[1]}"
        found = _first_surrogate(obj, "request")
        if found:
            return f"{found[0]}: expected text encodable as UTF-8 (no lone surrogates), got {found[1]}"
    return "request: expected a JSON-RPC message, got one the parser refuses (nested too deep or a number out of range)"


class _Wire:
    """The MCP server's stdin / stdout, as :func:`mcp.server.stdio.stdio_server` reads and writes
    them: each line is checked first; a line the SDK would not parse (and so never answer) gets a
    reply here, written between the SDK's own lines."""

    def __init__(self, limit: int):
        import anyio

        self.limit = int(limit)
        self._lock = anyio.Lock()
        # The wire moves to private descriptors; fd 0 reads EOF and fd 1 goes to stderr, so stray
        # prints of libraries cannot corrupt the protocol.
        self._saved = (os.dup(0), os.dup(1))
        self._in = os.fdopen(os.dup(0), "rb")
        self._out = os.fdopen(os.dup(1), "wb")
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.dup2(2, 1)

    def restore(self) -> None:
        for fd, saved in enumerate(self._saved):
            os.dup2(saved, fd)
            os.close(saved)

    # -- stdout, for the SDK's writer and for the replies here
    async def write(self, text: str) -> None:
        import anyio

        data = text.encode("utf-8", "backslashreplace")
        async with self._lock:
            await anyio.to_thread.run_sync(self._out.write, data)

    async def flush(self) -> None:
        import anyio

        async with self._lock:
            await anyio.to_thread.run_sync(self._out.flush)

    # -- stdin
    def _read(self) -> tuple[bytes, int | None, dict]:
        """One line (thread): ``(line, None, {})``, or for a line over the limit ``(prefix,
        size, its top-level id / method)`` with the rest read and dropped; ``b""`` at EOF."""
        line = self._in.readline(self.limit + 1)
        if len(line) <= self.limit or line.endswith(b"\n"):
            return line, None, {}
        scan = _TopLevel()
        scan.feed(line)
        size = len(line)
        while not line.endswith(b"\n"):
            line = self._in.readline(1 << 16)
            if not line:
                break
            size += len(line)
            if "id" not in scan.found or "method" not in scan.found:
                scan.feed(line)
        return b"x", size, scan.found

    def __aiter__(self):
        return self._lines()

    async def _lines(self):
        import anyio
        import mcp_types as types

        while True:
            raw, oversize, found = await anyio.to_thread.run_sync(self._read)
            if not raw:
                return
            if oversize is None:
                if not raw.strip():
                    continue
                try:
                    text = raw.decode("utf-8")
                    types.jsonrpc_message_adapter.validate_json(text, by_name=False)
                    yield text
                    continue
                except Exception:  # refused by the SDK: answered below
                    scan = _TopLevel()
                    scan.feed(raw)
                    found = scan.found
            reason = _refusal(raw, oversize, self.limit, found)
            rid = found.get("id")
            if isinstance(rid, bool) or not isinstance(rid, (int, str)):
                log.warning("mcp: dropped a message without an id: %s", reason)
                continue
            if found.get("method") == "tools/call":
                reply = {"jsonrpc": "2.0", "id": rid,
                         "result": {"content": [{"type": "text", "text": _error_text(reason)}], "isError": True}}
            else:
                reply = {"jsonrpc": "2.0", "id": rid, "error": {"code": -32600, "message": _error_text(reason)}}
            log.warning("mcp: refused request %r: %s", rid, reason)
            await self.write(json.dumps(reply, ensure_ascii=True) + "\n")
            await self.flush()


def run_stdio(server) -> None:
    """Serve ``server`` (:func:`build_server`) over this process's stdin / stdout until stdin closes."""
    import anyio
    from mcp.server.stdio import stdio_server

    wire = _Wire(getattr(server, "memkern_max_message_bytes", 1 << 20))

    async def main():
        async with stdio_server(stdin=wire, stdout=wire) as (read, write):
            low = server._lowlevel_server  # what MCPServer.run_stdio_async runs
            await low.run(read, write, low.create_initialization_options())

    try:
        anyio.run(main)
    finally:
        wire.restore()
