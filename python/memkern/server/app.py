"""The HTTP API of ``memkern serve``: a FastAPI app over a :class:`~memkern.server.service.MemoryService`.

Routes (mem0-shaped; the OpenAPI schema is served at ``/openapi.json``, the docs at ``/docs``):

=========================================  ==================================================
``GET /health``                            liveness and the store's shape (no auth)
``POST /v1/memories``                      add ``{"messages", "user_id"|"agent_id"|"run_id", "metadata"?, "infer"?, "date"?}``
``GET /v1/memories?user_id=...``           list the scope's memories
``POST /v1/memories/search``               ``{"query", "user_id"..., "limit"?, "filters"?, "threshold"?, time fields?}``
``GET /v1/memories/{id}``                  one memory
``PUT /v1/memories/{id}``                  ``{"text"?, "metadata"?}``: a new version
``DELETE /v1/memories/{id}``               delete
``GET /v1/memories/{id}/history``          every version
``POST /v1/respond``                       the RMM loop: answer with cited memories (``filters``?, time fields?)
``POST /v1/feedback``                      ``{"response_id", "rewards"}``: train the reranker
=========================================  ==================================================

Time: ``date`` on an add is the conversation's date (unix seconds or a date string such as
``"2023-05-08"``), kept as the records' ``event_time`` (returned as ISO 8601). Search and respond
take ``time_range: [start, end]`` (dates or unix seconds, ``null`` for an open end),
``time_field`` (``"event"``, ``"created"``, ``"updated"``) and a recency prior (``recency``: half-life
in seconds, ``recency_weight``, ``now``); see :meth:`memkern.server.service.MemoryService.search_kw`.

Auth: with an API key, every route but ``/health``, ``/openapi.json`` and ``/docs`` needs the
header ``Authorization: Bearer <key>`` or ``X-API-Key: <key>`` (401 otherwise; compared in
constant time). Limits: bodies over ``limits.max_body_bytes`` get 413 before they are read
whole; too many messages or too long texts get 422. Errors are JSON ``{"detail": "<argument>:
expected ..., got ...", "error": "<exception class>"}``: 422 bad input, 404 unknown id, 401 auth,
413 too large, 500 anything else (nothing half-written: every argument is checked first).
"""
import hmac
import json
import logging
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from ..errors import MemkernError, MemkernKeyError, MemkernTypeError, MemkernValueError
from .service import Limits, MemoryService

log = logging.getLogger("memkern")

#: Paths served without an API key.
PUBLIC_PATHS = frozenset({"/health", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


def _json_response(status: int, detail: str, error: str, headers: list | None = None):
    body = json.dumps({"detail": detail, "error": error}).encode()
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    return status, hdrs + (headers or []), body


class _Guard:
    """Pure ASGI middleware: API-key check, then the body size limit (``Content-Length`` checked up
    front, a chunked body counted as it streams)."""

    def __init__(self, app, api_key: str | None, max_body_bytes: int):
        self.app = app
        self.api_key = api_key
        self.max_body = int(max_body_bytes)

    async def _send_error(self, send, status, detail, error, headers=None):
        status, hdrs, body = _json_response(status, detail, error, headers)
        await send({"type": "http.response.start", "status": status, "headers": hdrs})
        await send({"type": "http.response.body", "body": body})

    def authorized(self, headers: dict[bytes, bytes]) -> bool:
        if self.api_key is None:
            return True
        want = self.api_key.encode()
        auth = headers.get(b"authorization", b"")
        if auth[:7].lower() == b"bearer " and hmac.compare_digest(auth[7:].strip(), want):
            return True
        key = headers.get(b"x-api-key")
        return key is not None and hmac.compare_digest(key.strip(), want)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if scope["path"] not in PUBLIC_PATHS and not self.authorized(headers):
            return await self._send_error(
                send, 401, "authorization: expected 'Authorization: Bearer <key>' or 'X-API-Key: <key>' "
                "with this server's API key", "Unauthorized", [(b"www-authenticate", b"Bearer")])
        length = headers.get(b"content-length")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                return await self._send_error(send, 400, f"content-length: expected an integer, got {length!r}",
                                              "BadRequest")
            if n > self.max_body:
                return await self._send_error(
                    send, 413, f"body: expected at most {self.max_body} bytes, got {n} bytes", "PayloadTooLarge")
        if length is None and scope.get("method") in ("POST", "PUT", "PATCH"):
            # No Content-Length (a chunked body): read it here, at most max_body bytes, then replay it.
            chunks, seen = [], 0
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return  # the client went away
                body = message.get("body", b"")
                seen += len(body)
                if seen > self.max_body:
                    return await self._send_error(
                        send, 413, f"body: expected at most {self.max_body} bytes, got more", "PayloadTooLarge")
                chunks.append(body)
                if not message.get("more_body", False):
                    break
            whole = b"".join(chunks)
            sent = False

            async def replay():
                nonlocal sent
                if sent:
                    return await receive()
                sent = True
                return {"type": "http.request", "body": whole, "more_body": False}

            return await self.app(scope, replay, send)
        return await self.app(scope, receive, send)


# ------------------------------------------------------------------ request bodies
class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

class Message(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    role: str = "user"
    content: str

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
    time_range: Optional[list[TimeEnd]] = Field(
        None, description="[start, end): dates or unix seconds, null for an open end")
    time_field: str = Field("event", description='"event" (the conversation date), "created" or "updated"')
    recency: Optional[float] = Field(None, description="half-life in seconds of a recency prior")
    recency_weight: float = 0.1
    now: Optional[float] = Field(None, description="unix seconds the recency prior measures ages from")

class SearchRequest(TimeFields):
    query: str
    limit: int = 10
    threshold: Optional[float] = None

class UpdateRequest(Strict):
    text: Optional[str] = None
    metadata: Optional[dict[str, Any]] = None

class RespondRequest(TimeFields):
    query: str
    session_turns: Optional[list[dict[str, Any]]] = None

class FeedbackRequest(Strict):
    response_id: str
    rewards: list[float]


def create_app(service: MemoryService, api_key: str | None = None):
    """The FastAPI app serving ``service``; ``api_key=None`` serves without auth (localhost only:
    ``memkern serve`` refuses a wider bind without a key)."""
    from fastapi import Body, FastAPI, Query, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    from .. import __version__

    if api_key is not None and (not isinstance(api_key, str) or not api_key.strip()):
        raise MemkernValueError("api_key: expected a non-empty str or None, got an empty one")

    app = FastAPI(title="memkern", version=__version__,
                  description="Long-term memory for LLM agents: mem0-shaped memory routes and the RMM loop "
                              "over one memkern store.")
    app.state.service = service

    def error(status: int, exc: BaseException) -> JSONResponse:
        msg = exc.args[0] if isinstance(exc, KeyError) and len(exc.args) == 1 else str(exc)
        return JSONResponse({"detail": str(msg), "error": type(exc).__name__}, status_code=status)

    @app.exception_handler(MemkernKeyError)
    async def _key(request: Request, exc: MemkernKeyError):
        return error(404, exc)

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

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        parts = []
        for e in exc.errors():
            # "body" and the branch tags of a Union ("str", "list[dict[str, any]]") say nothing to the user
            loc = [str(x) for x in e.get("loc", ()) if x != "body" and not (isinstance(x, str) and (
                "[" in x or x in ("str", "int", "float", "bool", "list", "dict")))]
            where = ".".join(loc) or "body"
            got = e.get("input")
            got_s = "" if isinstance(got, dict) and len(json.dumps(got, default=str)) > 200 else f", got {got!r}"
            parts.append(f"{where}: {e.get('msg', 'invalid')}{got_s}")
        return JSONResponse({"detail": "; ".join(parts) or "invalid request", "error": "RequestValidationError"},
                            status_code=422)

    def scope_kw(req: ScopeFields) -> dict:
        return {"user_id": req.user_id, "agent_id": req.agent_id, "run_id": req.run_id}

    def time_kw(req: TimeFields) -> dict:
        return {"filters": req.filters, "time_range": req.time_range, "time_field": req.time_field,
                "recency": req.recency, "recency_weight": req.recency_weight, "now": req.now}

    @app.get("/health", tags=["health"])
    def health() -> dict:
        st = service.store
        return {"status": "ok", "version": __version__, "dim": st.dim, "metric": st.metric,
                "namespaces": len(st.namespaces())}

    @app.post("/v1/memories", tags=["memories"])
    def add(req: AddRequest) -> dict:
        return service.add(req.messages, metadata=req.metadata, infer=req.infer, date=req.date, **scope_kw(req))

    @app.get("/v1/memories", tags=["memories"])
    def list_memories(user_id: Optional[str] = Query(None), agent_id: Optional[str] = Query(None),
                      run_id: Optional[str] = Query(None), limit: int = Query(100)) -> dict:
        return service.list(user_id=user_id, agent_id=agent_id, run_id=run_id, limit=limit)

    @app.post("/v1/memories/search", tags=["memories"])
    def search(req: SearchRequest) -> dict:
        return service.search(req.query, limit=req.limit, threshold=req.threshold, **time_kw(req), **scope_kw(req))

    @app.get("/v1/memories/{memory_id}", tags=["memories"])
    def get(memory_id: int) -> dict:
        return service.get(memory_id)

    @app.put("/v1/memories/{memory_id}", tags=["memories"])
    def update(memory_id: int, req: UpdateRequest = Body(...)) -> dict:
        return service.update(memory_id, text=req.text, metadata=req.metadata)

    @app.delete("/v1/memories/{memory_id}", tags=["memories"])
    def delete(memory_id: int) -> dict:
        return service.delete(memory_id)

    @app.get("/v1/memories/{memory_id}/history", tags=["memories"])
    def history(memory_id: int) -> dict:
        return service.history(memory_id)

    @app.post("/v1/respond", tags=["rmm"])
    def respond(req: RespondRequest) -> dict:
        return service.respond(req.query, session_turns=req.session_turns, **time_kw(req), **scope_kw(req))

    @app.post("/v1/feedback", tags=["rmm"])
    def feedback(req: FeedbackRequest) -> dict:
        return service.feedback(req.response_id, req.rewards)

    guarded = _Guard(app, api_key, service.limits.max_body_bytes)
    guarded.fastapi = app
    return guarded
