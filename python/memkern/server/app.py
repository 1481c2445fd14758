"""The HTTP API of ``memkern serve``: a FastAPI app over a :class:`~memkern.server.service.MemoryService`.

Routes (mem0-shaped; the OpenAPI schema is served at ``/openapi.json``, the docs at ``/docs``):

=========================================  ==================================================
``GET /health``                            liveness (200 while serving) and the store's shape (no auth)
``GET /health/live``                       liveness: 200 as soon as the process serves HTTP (no auth)
``GET /health/ready``                      readiness: 503 with the reason until the store is open and the
                                           models are loaded (:meth:`MemoryService.start_loading`), then 200
``POST /v1/memories``                      add ``{"messages", "user_id"|"agent_id"|"run_id", "metadata"?, "infer"?, "date"?}``
``GET /v1/memories?user_id=...``           list the scope's memories
``POST /v1/memories/search``               ``{"query", "user_id"..., "limit"?, "mode"?, "fusion"?, "lexical_weight"?,
                                           "filters"?, "threshold"?, time fields?}``
``GET /v1/memories/{id}?user_id=...``      one memory of the scope
``PUT /v1/memories/{id}``                  ``{"text"?, "metadata"?, "user_id"...}``: a new version
``DELETE /v1/memories/{id}?user_id=...``   delete
``GET /v1/memories/{id}/history?...``      every version
``POST /v1/respond``                       the RMM loop: answer with cited memories (``filters``?, time fields?)
``POST /v1/feedback``                      ``{"response_id", "rewards"}``: train the reranker, once per response
``GET /v1/export``                         the store as streamed JSON Lines, for backups (:mod:`memkern.server.export_route`)
=========================================  ==================================================

mem0's SDK (``MemoryClient(api_key=..., host=...)``) and OSS server paths: :mod:`memkern.server.mem0_routes`.

Time: ``date`` on an add is the conversation's date (unix seconds or a date string such as
``"2023-05-08"``), kept as the records' ``event_time`` (returned as ISO 8601). Search and respond
take ``time_range: [start, end]`` (dates or unix seconds, ``null`` for an open end),
``time_field`` (``"event"``, ``"created"``, ``"updated"``) and a recency prior (``recency``: half-life
in seconds, ``recency_weight``, ``now``); see :meth:`memkern.server.service.MemoryService.search_kw`.

Search: ``mode`` (``"dense"``, ``"lexical"``, ``"hybrid"``), ``fusion`` and ``lexical_weight`` as in
:meth:`memkern.MemoryStore.search`, with its defaults (:mod:`memkern.server.search_args`);
``filter`` is accepted for ``filters``.

Start-up: :func:`create_app` starts loading the models in the background
(:meth:`MemoryService.start_loading`); a request that needs one meanwhile waits for it.

Scopes: every route but the health routes and ``/v1/feedback`` names a scope (``user_id`` /
``agent_id`` / ``run_id``, at least one; a query parameter on ``GET`` / ``DELETE``, in the body
or the query on ``PUT``). The id routes answer only for a memory of a server scope that contains
the given ids; any other id (unknown, deleted, another user's, a namespace that is not a scope) is
the same 404.

Auth: with API keys, every route but the health routes, ``/openapi.json`` and ``/docs`` needs the header
``Authorization: Bearer <key>`` or ``X-API-Key: <key>`` (401 otherwise; compared in constant
time). A key may be bound to a scope (:class:`KeyRing`): its requests are held to it (its ids are
filled in where a request leaves them out; a request naming other ids gets 403). Without a key the
server only answers requests whose ``Host`` (and ``Origin``, when sent) is a loopback name
(``allowed_hosts``): a web page cannot reach it through DNS rebinding.

Limits: bodies over ``limits.max_body_bytes`` get 413 before they are read whole, a body not
received within ``body_timeout`` seconds 408 (request headers: ``header_timeout``, closed by
:class:`GuardedH11Protocol`), more than ``max_concurrent`` requests at once 503; too many messages
or too long fields get 422. Errors are JSON ``{"detail": "<argument>: expected ..., got ...",
"error": "<exception class>"}`` on every route and status: 422 bad input, 404 unknown id, 401 auth,
403 scope outside the key's, 408 slow body, 409 feedback already given, 413 too large, 503 busy,
500 anything else (nothing half-written: every argument is checked first).
"""
import asyncio
import json
import logging
from typing import Any, Iterable, Mapping, Optional, Union

from ..errors import require

require("serve", "fastapi", "pydantic", feature="memkern.server.app")  # names the extra when a package is missing
from pydantic import BaseModel, ConfigDict, Field

from ..errors import MemkernError, MemkernKeyError, MemkernTypeError, MemkernValueError, bad_arg
from .scopes import KeyRing
from .limits import BusyError, ConflictError
from .search_args import DEFAULT_FUSION, DEFAULT_LEXICAL_WEIGHT
from .service import MemoryService

log = logging.getLogger("memkern")

#: Paths served without an API key.
PUBLIC_PATHS = frozenset({"/health", "/health/live", "/health/ready", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
#: Host names a keyless server answers to (any port).
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
#: Longest error ``detail`` sent (a rejected 1 MB value is not echoed back whole).
MAX_DETAIL_CHARS = 2000


def error_body(detail: str, error: str) -> bytes:
    """The JSON error body: ASCII (``\\uXXXX`` escapes), so any text, even a lone surrogate a
    client sent, can be written; ``detail`` cut at :data:`MAX_DETAIL_CHARS`."""
    if len(detail) > MAX_DETAIL_CHARS:
        detail = detail[:MAX_DETAIL_CHARS] + f"... ({len(detail)} characters)"
    return json.dumps({"detail": detail, "error": error}, ensure_ascii=True).encode("ascii")


def raw_json_response(status: int, reason: str, detail: str, error: str) -> bytes:
    """A whole HTTP/1.1 response (JSON error, ``Connection: close``) for the protocol layer."""
    body = error_body(detail, error)
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode("ascii")
    return head + body


class ScopeForbidden(MemkernValueError):
    """A request names scope ids other than those its API key is bound to: HTTP 403."""


def _host_name(value: str) -> str:
    """The host of a ``Host`` header or an origin's authority, lower-case, without port."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    name, colon, port = value.rpartition(":")
    return name if colon and port.isdigit() else value


class _Guard:
    """Pure ASGI middleware, before any route: Host / Origin allowlist, API key, concurrency
    limit, then the whole body read here, within ``body_timeout`` seconds and ``max_body_bytes``
    (``Content-Length`` checked up front, a chunked body counted as it streams), and replayed to
    the app. Everything it refuses is a JSON error."""

    def __init__(self, app, keys: KeyRing | None, max_body_bytes: int, *, allowed_hosts: Iterable[str] | None,
                 body_timeout: float, max_concurrent: int):
        self.app = app
        self.keys = keys
        self.max_body = int(max_body_bytes)
        self.allowed_hosts = None if allowed_hosts is None else frozenset(h.lower() for h in allowed_hosts)
        self.body_timeout = float(body_timeout)
        self.max_concurrent = int(max_concurrent)
        self.inflight = 0

    @staticmethod
    async def _send_error(send, status, detail, error, headers=None):
        body = error_body(detail, error)
        hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": hdrs + (headers or [])})
        await send({"type": "http.response.body", "body": body})

    def authorized(self, headers: Mapping[bytes, bytes]) -> bool:
        return self.keys is None or self.keys.match(headers)[0]

    def _bad_host(self, headers: Mapping[bytes, bytes]) -> str | None:
        if self.allowed_hosts is None:
            return None
        host = headers.get(b"host")
        if host is not None and _host_name(host.decode("latin-1")) not in self.allowed_hosts:
            return f"host: expected one of {sorted(self.allowed_hosts)} (this server has no API key), got " \
                   f"{host.decode('latin-1')[:100]!r}"
        origin = headers.get(b"origin")
        if origin is not None:
            text = origin.decode("latin-1")
            scheme, sep, rest = text.partition("://")
            if not sep or scheme.lower() not in ("http", "https") or _host_name(rest.split("/")[0]) not in \
                    self.allowed_hosts:
                return f"origin: expected a page of {sorted(self.allowed_hosts)} (this server has no API key), " \
                       f"got {text[:100]!r}"
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracked_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            return await self._serve(scope, receive, tracked_send)
        except Exception as exc:  # never uvicorn's plain-text 500
            log.exception("serve: %s %s failed", scope.get("method"), scope.get("path"))
            if not started:
                await self._send_error(send, 500, f"internal error: {type(exc).__name__}", "InternalServerError")

    async def _serve(self, scope, receive, send):
        headers = dict(scope.get("headers") or [])
        bad = self._bad_host(headers)
        if bad is not None:
            return await self._send_error(send, 403, bad, "Forbidden")
        if self.keys is not None and scope["path"] not in PUBLIC_PATHS:
            ok, key_scope = self.keys.match(headers)
            if not ok:
                return await self._send_error(
                    send, 401, "authorization: expected 'Authorization: Bearer <key>' (or 'Token <key>') or 'X-API-Key: <key>' "
                    "with one of this server's API keys", "Unauthorized", [(b"www-authenticate", b"Bearer")])
            scope["memkern.key_scope"] = key_scope
        if self.inflight >= self.max_concurrent:
            return await self._send_error(
                send, 503, f"requests: expected at most {self.max_concurrent} at once, got one more (retry later)",
                "ServiceUnavailable", [(b"retry-after", b"1")])
        self.inflight += 1
        try:
            body = await self._read_body(scope, headers, receive, send)
            if body is None:
                return  # refused (the error is sent) or the client went away
            sent = False

            async def replay():
                nonlocal sent
                if sent:
                    return await receive()
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}

            return await self.app(scope, replay, send)
        finally:
            self.inflight -= 1

    async def _read_body(self, scope, headers, receive, send) -> bytes | None:
        close = [(b"connection", b"close")]
        length = headers.get(b"content-length")
        if length is not None:
            try:
                n = int(length)
                if n < 0:
                    raise ValueError
            except ValueError:
                await self._send_error(send, 400, f"content-length: expected an integer >= 0, got "
                                       f"{length.decode('latin-1')[:40]!r}", "BadRequest", close)
                return None
            if n > self.max_body:
                await self._send_error(send, 413, f"body: expected at most {self.max_body} bytes, got {n} bytes",
                                       "PayloadTooLarge", close)
                return None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout
        chunks, seen = [], 0
        while True:
            left = deadline - loop.time()
            try:
                if left <= 0:
                    raise asyncio.TimeoutError
                message = await asyncio.wait_for(receive(), left)
            except asyncio.TimeoutError:
                await self._send_error(send, 408, f"body: expected it within {self.body_timeout:g} s, got "
                                       f"{seen} bytes by then", "RequestTimeout", close)
                return None
            if message["type"] != "http.request":
                return None  # the client went away
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.max_body:
                await self._send_error(send, 413, f"body: expected at most {self.max_body} bytes, got more",
                                       "PayloadTooLarge", close)
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


# ------------------------------------------------------------------ the HTTP protocol (uvicorn)
def guarded_protocol(header_timeout: float = 10.0, max_connections: int = 256) -> type:
    """uvicorn's h11 protocol with a request-header deadline and a connection cap.

    A connection that has not sent a whole request head within ``header_timeout`` seconds of
    opening (or of its previous response) is closed (``408`` JSON when part of a head came), so
    half-open requests cannot hold the server; a connection beyond ``max_connections`` gets a
    ``503`` JSON and is closed; a malformed request gets a ``400`` JSON instead of uvicorn's text.
    Pass it as ``uvicorn.Config(..., http=guarded_protocol(...))``.
    """
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport):
            super().connection_made(transport)
            self._head_timer = None
            self._head_cycle = None
            self._head_bytes = False
            if len(self.connections) > max_connections:
                transport.write(raw_json_response(
                    503, "Service Unavailable", f"connections: expected at most {max_connections} at once, got "
                    "one more (retry later)", "ServiceUnavailable"))
                transport.close()
                return
            self._arm_head_timer()

        def _arm_head_timer(self):
            self._disarm_head_timer()
            self._head_cycle = self.cycle
            self._head_bytes = False
            self._head_timer = self.loop.call_later(header_timeout, self._head_timed_out)

        def _disarm_head_timer(self):
            if getattr(self, "_head_timer", None) is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self):
            self._head_timer = None
            if self.cycle is not self._head_cycle or self.transport.is_closing():
                return  # a request head arrived meanwhile
            if self._head_bytes:
                self.transport.write(raw_json_response(
                    408, "Request Timeout", f"headers: expected a whole request head within {header_timeout:g} s, "
                    "got part of one", "RequestTimeout"))
            self.transport.close()

        def data_received(self, data):
            waiting = getattr(self, "_head_timer", None) is not None
            if waiting:
                self._head_bytes = True
            super().data_received(data)
            if waiting and self.cycle is not self._head_cycle:
                self._disarm_head_timer()

        def on_response_complete(self):
            super().on_response_complete()
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self._arm_head_timer()

        def connection_lost(self, exc):
            self._disarm_head_timer()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            self.transport.write(raw_json_response(400, "Bad Request", f"request: {msg}", "BadRequest"))
            self.transport.close()

    return GuardedH11Protocol


def uvicorn_config(app, host: str = "127.0.0.1", port: int = 8000, *, log_level: str = "info",
                   header_timeout: float = 10.0, max_connections: int = 256, **kw):
    """The ``uvicorn.Config`` ``memkern serve`` runs: :func:`guarded_protocol` for HTTP, a short
    keep-alive (5 s), other options passed on."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, log_level=log_level,
                          http=guarded_protocol(header_timeout, max_connections), **kw)


# ------------------------------------------------------------------ request bodies
class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

class ScopeFields(Strict):
    user_id: Optional[str] = None
    agent_id: Optional[str] = None
    run_id: Optional[str] = None

class AddRequest(ScopeFields):
    messages: Union[str, list[dict[str, Any]]] = Field(
        description='the conversation: a list of {"role", "content", ...} messages (other keys kept), or one user '
                    'message as a str')
    metadata: Optional[dict[str, Any]] = None
    infer: bool = Field(True, description="true: prospective reflection (topics, update decisions); "
                                          "false: store every message as it is")
    date: Optional[Union[float, str]] = Field(
        None, description="the conversation's date: unix seconds or a date string ('2023-05-08', ISO 8601, ...)")

TimeEnd = Optional[Union[float, str]]

class TimeFields(ScopeFields):
    filters: Optional[dict[str, Any]] = Field(None, description='metadata filter: {"key": value} or '
                                              '{"key": {"$eq": value}} / {"key": {"$in": [values]}}')
    filter: Optional[dict[str, Any]] = Field(None, description="the same as filters (the Python API's name)")
    time_range: Optional[list[TimeEnd]] = Field(
        None, description="[start, end): dates or unix seconds, null for an open end")
    time_field: str = Field("event", description='"event" (the conversation date), "created" or "updated"')
    recency: Optional[float] = Field(None, description="half-life in seconds of a recency prior")
    recency_weight: float = 0.1
    now: Optional[float] = Field(None, description="unix seconds the recency prior measures ages from")

class SearchRequest(TimeFields):
    query: str
    limit: int = 10
    mode: str = Field("dense", description='"dense" (embeddings), "lexical" (BM25 over the query text) or '
                                           '"hybrid" (both, fused)')
    fusion: str = Field(DEFAULT_FUSION, description='how hybrid lists are fused: "coverage", "rrf" or "weighted"')
    lexical_weight: float = Field(DEFAULT_LEXICAL_WEIGHT, description="weight of the lexical list in a hybrid search")
    threshold: Optional[float] = None

class UpdateRequest(ScopeFields):
    text: Optional[str] = None
    metadata: Optional[dict[str, Any]] = None

class RespondRequest(TimeFields):
    query: str
    session_turns: Optional[list[dict[str, Any]]] = None

class FeedbackRequest(Strict):
    response_id: str
    rewards: list[float]


def create_app(service: MemoryService, api_key: str | None = None, *, api_keys: KeyRing | None = None,
               allowed_hosts: Iterable[str] | None = None, body_timeout: float = 30.0, max_concurrent: int = 64,
               freeze_gc: bool = False):
    """The ASGI app serving ``service`` (FastAPI behind :class:`_Guard`; ``.fastapi`` is the
    FastAPI app). Starts the service's model load in the background
    (:meth:`MemoryService.start_loading`; ``GET /health/ready`` is 200 once it is done).

    Parameters
    ----------
    service : MemoryService
    api_key : str, optional
        One key for any scope (``memkern serve`` reads it from ``$MEMKERN_API_KEY``).
    api_keys : KeyRing, optional
        Keys, some bound to scopes (``--api-key-file``); joined with ``api_key``. No key at all:
        served without auth, for loopback only (``memkern serve`` refuses a wider bind).
    allowed_hosts : iterable of str, optional
        Host names (of ``Host`` and ``Origin``) answered; default without keys: the loopback
        names (:data:`LOOPBACK_HOSTS`), with keys: any.
    body_timeout : float
        Seconds a request body may take to arrive (408 after).
    max_concurrent : int
        Requests handled at once (503 beyond).
    freeze_gc : bool
        Once the models are loaded, keep everything the process holds out of later garbage
        collections (``gc.freeze``; ``memkern serve`` sets it: the process serves from then on).
    """
    from fastapi import Body, FastAPI, Query, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import Response
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from ..base.version import __version__

    if api_key is not None and (not isinstance(api_key, str) or not api_key.strip()):
        raise MemkernValueError("api_key: expected a non-empty str or None, got an empty one")
    if api_keys is not None and not isinstance(api_keys, KeyRing):
        raise bad_arg("api_keys", "a KeyRing or None", type(api_keys).__name__, MemkernTypeError)
    keys = api_keys
    if api_key is not None:
        joined = {} if keys is None else dict(keys.items())
        joined[api_key.strip()] = None
        keys = KeyRing(joined)
    if allowed_hosts is None and keys is None:
        allowed_hosts = LOOPBACK_HOSTS
    for name, v, lo in (("body_timeout", body_timeout, 0), ("max_concurrent", max_concurrent, 1)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > lo or v != v:
            raise bad_arg(name, f"a number > {lo}", v)

    app = FastAPI(title="memkern", version=__version__,
                  description="Long-term memory for LLM agents: mem0-shaped memory routes and the RMM loop "
                              "over one memkern store.")
    app.state.service = service

    def json_error(status: int, detail: str, name: str, headers: dict | None = None) -> Response:
        return Response(error_body(detail, name), status_code=status, headers=headers, media_type="application/json")

    def error(status: int, exc: BaseException, headers: dict | None = None) -> Response:
        msg = exc.args[0] if isinstance(exc, KeyError) and len(exc.args) == 1 else str(exc)
        return json_error(status, str(msg), type(exc).__name__, headers)

    @app.exception_handler(MemkernKeyError)
    async def _key(request: Request, exc: MemkernKeyError):
        return error(404, exc)

    @app.exception_handler(ScopeForbidden)
    async def _forbidden(request: Request, exc: ScopeForbidden):
        return error(403, exc)

    @app.exception_handler(ConflictError)
    async def _conflict(request: Request, exc: ConflictError):
        return error(409, exc)

    @app.exception_handler(BusyError)
    async def _busy(request: Request, exc: BusyError):
        return error(503, exc, {"retry-after": "1"})

    @app.exception_handler(MemkernValueError)
    async def _value(request: Request, exc: MemkernValueError):
        return error(422, exc)

    @app.exception_handler(MemkernTypeError)
    async def _type(request: Request, exc: MemkernTypeError):
        return error(422, exc)

    @app.exception_handler(MemkernError)
    async def _other(request: Request, exc: MemkernError):
        log.error("serve: %s %s failed: %s", request.method, request.url.path, exc)
        return error(500, exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        name = {404: "NotFound", 405: "MethodNotAllowed", 400: "BadRequest"}.get(exc.status_code, "HTTPException")
        return json_error(exc.status_code, f"{request.url.path[:200]}: {exc.detail}", name,
                          getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _crash(request: Request, exc: Exception):
        log.error("serve: %s %s failed: %r", request.method, request.url.path, exc, exc_info=exc)
        return json_error(500, f"internal error: {type(exc).__name__}", "InternalServerError")

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        parts = []
        for e in exc.errors():
            # "body" and the branch tags of a Union ("str", "list[dict[str, any]]") say nothing to the user
            loc = [str(x) for x in e.get("loc", ()) if x != "body" and not (isinstance(x, str) and (
                "[" in x or x in ("str", "int", "float", "bool", "list", "dict")))]
            where = ".".join(loc) or "body"
            got = e.get("input")
            got_s = "" if isinstance(got, (dict, list)) and len(repr(got)) > 200 else f", got {got!r}"
            parts.append(f"{where}: {e.get('msg', 'invalid')}{got_s}")
        return json_error(422, "; ".join(parts) or "invalid request", "RequestValidationError")

    def scoped(request: Request, user_id=None, agent_id=None, run_id=None) -> dict:
        """The request's scope ids held to its key's scope (filled in; another value: 403)."""
        kw = {"user_id": user_id, "agent_id": agent_id, "run_id": run_id}
        bound = request.scope.get("memkern.key_scope")
        if bound is not None:
            for k, v in bound.as_dict().items():
                if v is None:
                    continue
                if kw[k] is not None and kw[k] != v:
                    raise ScopeForbidden(f"{k}: expected {v!r} (this API key's scope) or none, got {kw[k]!r}")
                kw[k] = v
        return kw

    def scope_kw(request: Request, req: ScopeFields) -> dict:
        return scoped(request, req.user_id, req.agent_id, req.run_id)

    def time_kw(req: TimeFields) -> dict:
        return {"filters": req.filters, "filter": req.filter, "time_range": req.time_range, "time_field": req.time_field,
                "recency": req.recency, "recency_weight": req.recency_weight, "now": req.now}

    @app.get("/health", tags=["health"])
    def health() -> dict:
        """Liveness, with the store's shape (200 while the process serves; readiness: ``/health/ready``)."""
        st = service.store
        return {"status": "ok", "version": __version__, "dim": st.dim, "metric": st.metric,
                "namespaces": len(st.namespaces())}

    @app.get("/health/live", tags=["health"])
    async def health_live() -> dict:
        """200 as soon as the process serves HTTP (nothing else is looked at)."""
        return {"status": "live"}

    @app.get("/health/ready", tags=["health"])
    async def health_ready() -> Response:
        """200 once the store is open and the models are loaded; 503 with the reason before."""
        ok, why = service.ready()
        r = service.readiness
        if ok:
            return Response(json.dumps({"status": "ready", "load_seconds": r.seconds}), media_type="application/json")
        body = json.loads(error_body(why, "NotReady"))
        body["status"] = r.state if r.state != "ready" else "closed"
        return Response(json.dumps(body, ensure_ascii=True), status_code=503, media_type="application/json",
                        headers={"retry-after": "1"})

    @app.post("/v1/memories", tags=["memories"])
    def add(request: Request, req: AddRequest) -> dict:
        return service.add(req.messages, metadata=req.metadata, infer=req.infer, date=req.date,
                           **scope_kw(request, req))

    @app.get("/v1/memories", tags=["memories"])
    def list_memories(request: Request, user_id: Optional[str] = Query(None), agent_id: Optional[str] = Query(None),
                      run_id: Optional[str] = Query(None), limit: int = Query(100)) -> dict:
        return service.list(limit=limit, **scoped(request, user_id, agent_id, run_id))

    @app.post("/v1/memories/search", tags=["memories"])
    def search(request: Request, req: SearchRequest) -> dict:
        return service.search(req.query, limit=req.limit, threshold=req.threshold, mode=req.mode, fusion=req.fusion,
                              lexical_weight=req.lexical_weight, **time_kw(req), **scope_kw(request, req))

    @app.get("/v1/memories/{memory_id}", tags=["memories"])
    def get(request: Request, memory_id: int, user_id: Optional[str] = Query(None),
            agent_id: Optional[str] = Query(None), run_id: Optional[str] = Query(None)) -> dict:
        return service.get(memory_id, **scoped(request, user_id, agent_id, run_id))

    @app.put("/v1/memories/{memory_id}", tags=["memories"])
    def update(request: Request, memory_id: int, req: UpdateRequest = Body(...), user_id: Optional[str] = Query(None),
               agent_id: Optional[str] = Query(None), run_id: Optional[str] = Query(None)) -> dict:
        ids = {}
        for k, q in (("user_id", user_id), ("agent_id", agent_id), ("run_id", run_id)):
            b = getattr(req, k)
            if q is not None and b is not None and q != b:
                raise MemkernValueError(f"{k}: expected one value (query and body), got {q!r} and {b!r}")
            ids[k] = q if q is not None else b
        return service.update(memory_id, text=req.text, metadata=req.metadata, **scoped(request, **ids))

    @app.delete("/v1/memories/{memory_id}", tags=["memories"])
    def delete(request: Request, memory_id: int, user_id: Optional[str] = Query(None),
               agent_id: Optional[str] = Query(None), run_id: Optional[str] = Query(None)) -> dict:
        return service.delete(memory_id, **scoped(request, user_id, agent_id, run_id))

    @app.get("/v1/memories/{memory_id}/history", tags=["memories"])
    def history(request: Request, memory_id: int, user_id: Optional[str] = Query(None),
                agent_id: Optional[str] = Query(None), run_id: Optional[str] = Query(None)) -> dict:
        return service.history(memory_id, **scoped(request, user_id, agent_id, run_id))

    @app.post("/v1/respond", tags=["rmm"])
    def respond(request: Request, req: RespondRequest) -> dict:
        return service.respond(req.query, session_turns=req.session_turns, **time_kw(req), **scope_kw(request, req))

    @app.post("/v1/feedback", tags=["rmm"])
    def feedback(request: Request, req: FeedbackRequest) -> dict:
        return service.feedback(req.response_id, req.rewards, scope=request.scope.get("memkern.key_scope"))

    from .export_route import mount as mount_export
    from .mem0_platform import mount as mount_mem0_platform
    from .mem0_routes import mount as mount_mem0

    mount_export(app, service, ScopeForbidden)

    mount_mem0_platform(app, service, scoped, ScopeForbidden)  # before the slash-less fallbacks of mount_mem0
    mount_mem0(app, service, scoped)  # mem0's SDK and OSS server paths (after the routes above, which win)
    service.start_loading(freeze_gc=freeze_gc)
    guarded = _Guard(app, keys, service.limits.max_body_bytes, allowed_hosts=allowed_hosts,
                     body_timeout=body_timeout, max_concurrent=int(max_concurrent))
    guarded.fastapi = app
    return guarded
