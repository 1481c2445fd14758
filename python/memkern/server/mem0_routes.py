"""mem0-compatible routes of ``memkern serve``: what mem0ai's ``MemoryClient`` /
``AsyncMemoryClient`` (platform API, v1/v2/v3) and mem0's OSS REST server send.

``MemoryClient(api_key=KEY, host="http://127.0.0.1:PORT")`` works unmodified: the key goes in
``Authorization: Token <key>`` (:meth:`memkern.server.scopes.KeyRing.match`), construction pings
``GET /v1/ping/``, and every memory method has its route:

==============================================  ================================================
``GET /v1/ping/``                               the key check (:data:`ORG_ID`, :data:`PROJECT_ID`)    
``POST /v3/memories/add/``, ``POST /v1/memories/``   add (entity ids at the top level or in ``filters``)
``POST /v3/memories/``, ``POST /v2/memories/``  get_all (``filters``; ``?page=&page_size=``), paginated
``GET /v1/memories/?user_id=...``               get_all, v1 style
``POST /v{1,2,3}/memories/search/``             search (``top_k``, ``threshold``, ``keyword_search``)
``GET|PUT|DELETE /v1/memories/{id}/``           get, update (``text``, ``metadata``), delete
``GET /v1/memories/{id}/history/``              history: a list of versions
``DELETE /v1/memories/?user_id=...``            delete_all of a scope
``GET /v1/entities/``                           users: ``{"results": [{"type", "name", ...}]}``
``DELETE /v2/entities/{type}/{name}/``          delete_users / reset
``PUT|DELETE /v1/batch/``                       batch_update / batch_delete (all checked first)
``/memories``, ``/memories/{id}``, ``/search``, ``/reset``   mem0's OSS server paths
==============================================  ================================================

Each route is served with and without the trailing slash, except where the path without it is
memkern's own route (``/v1/memories``, ``/v1/memories/search``, ``/v1/memories/{id}`` and its
``/history``: those keep memkern's bodies and need a scope; mem0's client always sends the slash).

Entity ids map to the server's scopes (:mod:`memkern.server.scopes`): ``user_id``, ``agent_id``
and ``run_id`` are the scope's ids; ``app_id`` is taken as the ``agent_id`` (both given and
different: 422). ``filters`` hold entity ids, flat or as ``{"AND": [{...}, ...]}``, and
``metadata`` (a memkern metadata filter); ``org_id`` / ``project_id`` are accepted and not used
(one server is one project: the ping names it :data:`ORG_ID` / :data:`PROJECT_ID`). The id routes need no entity id: an unbound key reaches every
server scope, a key bound to a scope only its own. Ids are returned as strings, as mem0 does.
Options of mem0's platform that steer its LLM extraction (``custom_instructions``,
``custom_categories``, ``rerank``, ...) are accepted on these routes and have no effect; one that
would change what is kept (``expiration_date``) is refused with 422. The platform's other methods
(project, webhooks, memory feedback, exports, summary, profiles) are
:mod:`memkern.server.mem0_platform`'s.
"""

import ast
import json
from typing import Any, Callable, Optional

from ..errors import MemkernKeyError, MemkernTypeError, bad_arg
from . import scopes as S

#: What the ping names as the organisation and project (the client needs both; one server is one project).
ORG_ID, PROJECT_ID = "memkern", "default"
ENTITY_KEYS = ("user_id", "agent_id", "run_id", "app_id")
#: Fields every mem0 body may carry that name the tenant, not the memory.
TENANT_KEYS = frozenset({"org_id", "project_id", "org_name", "project_name"})
#: mem0 platform options that steer its own extraction or output and mean nothing here.
IGNORED_KEYS = frozenset({
    "custom_categories", "custom_instructions", "agent_custom_instructions", "includes", "excludes",
    "async_mode", "version", "output_format", "immutable", "structured_data_schema", "enable_graph",
    "rerank", "fields", "categories", "show_expired", "reference_date", "latest_only", "filter_memories",
    "delete_linked", "prompt"})
#: Options that would change what is kept or found: refused unless null.
REFUSED_KEYS = ("expiration_date", "start_date", "end_date")
ADD_KEYS = frozenset({"messages", "filters", "metadata", "infer", "timestamp"})
SEARCH_KEYS = frozenset({"query", "filters", "top_k", "limit", "threshold", "keyword_search", "mode", "fusion",
                         "lexical_weight", "metadata"})
LIST_KEYS = frozenset({"filters", "page", "page_size", "limit"})
ENTITY_TYPES = {"user": "user_id", "agent": "agent_id", "app": "app_id", "run": "run_id"}


def _check_keys(body: dict, allowed: frozenset, arg: str = "body") -> None:
    extra = sorted(set(body) - allowed - TENANT_KEYS - IGNORED_KEYS - set(ENTITY_KEYS) - set(REFUSED_KEYS))
    if extra:
        raise bad_arg(f"{arg}.{extra[0]}", f"one of {sorted(allowed | set(ENTITY_KEYS))}", extra[0])
    for k in REFUSED_KEYS:
        if body.get(k) is not None:
            raise bad_arg(k, "null (not supported by this server)", body[k])


def _filter_items(filters: Any, arg: str) -> list[tuple[str, Any]]:
    """``filters`` as ``(key, value)`` pairs: flat, or an ``AND`` of such dicts."""
    if not isinstance(filters, dict):
        raise bad_arg(arg, "a JSON object", type(filters).__name__, MemkernTypeError)
    items: list[tuple[str, Any]] = []
    for k, v in filters.items():
        if k == "AND":
            if not isinstance(v, list):
                raise bad_arg(f"{arg}.AND", "a list of objects", v)
            for i, part in enumerate(v):
                items += _filter_items(part, f"{arg}.AND[{i}]")
        elif k in ("OR", "NOT"):
            raise bad_arg(f"{arg}.{k}", "entity ids and metadata combined with AND (or flat)", k)
        else:
            items.append((k, v))
    return items


def entity_ids(body: dict, *, oss: bool = False) -> tuple[dict, Optional[dict]]:
    """``(scope ids, metadata filter)`` of a mem0 body or query: entity ids at the top level and
    in ``filters`` (``app_id`` as ``agent_id``), and ``filters.metadata`` (OSS routes: ``filters``
    is the metadata filter itself)."""
    got: dict[str, Any] = {}

    def put(key: str, value: Any, where: str) -> None:
        if value is None:
            return
        if not isinstance(value, str) or value == "*":
            raise bad_arg(where, f"a str of {S.SCOPE_RULE}", value)
        if got.get(key, value) != value:
            raise bad_arg(where, f"the same {key} as elsewhere in the request ({got[key]!r})", value)
        got[key] = value

    for k in ENTITY_KEYS:
        put(k, body.get(k), k)
    meta: dict = {}
    filters = body.get("filters")
    if filters is not None and oss:
        if not isinstance(filters, dict):
            raise bad_arg("filters", "a JSON object", type(filters).__name__, MemkernTypeError)
        meta.update(filters)
    elif filters is not None:
        for k, v in _filter_items(filters, "filters"):
            if k in ENTITY_KEYS:
                put(k, v, f"filters.{k}")
            elif k == "metadata":
                if not isinstance(v, dict):
                    raise bad_arg("filters.metadata", "a JSON object", type(v).__name__, MemkernTypeError)
                meta.update(v)
            else:
                raise bad_arg(f"filters.{k}", "user_id, agent_id, run_id, app_id, metadata, AND", k)
    if body.get("metadata") is not None and "messages" not in body and "text" not in body:
        if not isinstance(body["metadata"], dict):
            raise bad_arg("metadata", "a JSON object", type(body["metadata"]).__name__, MemkernTypeError)
        meta.update(body["metadata"])  # search(metadata=...): a filter
    app = got.pop("app_id", None)
    if app is not None:
        if got.get("agent_id", app) != app:
            raise bad_arg("app_id", f"the agent_id ({got['agent_id']!r}) or none (app_id is the agent_id here)", app)
        got["agent_id"] = app
    return got, (meta or None)


def memory_id_of(value: str) -> int:
    """A path's memory id (memkern ids are integers; anything else is an unknown memory: 404)."""
    if not value.isascii() or not value.isdigit() or len(value) > 19:
        raise bad_arg("memory_id", "the id of a memory in the given scope", value[:64], MemkernKeyError)
    return int(value)


def mem0_item(d: dict) -> dict:
    """A memkern memory as mem0 shows one: the id a string, ``app_id`` and ``categories``."""
    out = dict(d)
    out["id"] = str(d["id"])
    out.setdefault("app_id", None)
    out.setdefault("categories", [])
    return out


def mount(app: Any, service: Any, scoped: Callable[..., dict]) -> None:
    """Add the mem0 routes to the FastAPI ``app`` serving ``service``; ``scoped(request,
    user_id, agent_id, run_id)`` holds ids to the request's API key (app.py's)."""
    from fastapi import Body, Query, Request

    native = {(m, r.path) for r in app.routes for m in getattr(r, "methods", ())}

    def route(method: str, *paths: str, oss: bool = False):
        def deco(fn):
            for p in paths:
                for q in (p, p.rstrip("/")):
                    if (method, q) not in native:
                        app.add_api_route(q, fn, methods=[method], tags=["mem0 OSS" if oss else "mem0"],
                                          include_in_schema=(q == p))
                        native.add((method, q))
            return fn
        return deco

    def ids_for(request: Request, body: dict, oss: bool = False) -> tuple[dict, Optional[dict]]:
        ids, meta = entity_ids(body, oss=oss)
        return scoped(request, ids.get("user_id"), ids.get("agent_id"), ids.get("run_id")), meta

    def by_id(request: Request, query: dict) -> dict:
        """The scope keywords of an id route: the given / bound ids, or every scope when none."""
        ids, _ = ids_for(request, query)
        return {**ids, "any_scope": all(v is None for v in ids.values())}

    def query_of(request: Request) -> dict:
        q: dict[str, Any] = dict(request.query_params)
        if "filters" in q:  # the SDK's delete_all(filters=...) sends a dict's repr
            text = q["filters"]
            try:
                q["filters"] = json.loads(text)
            except ValueError:
                try:
                    q["filters"] = ast.literal_eval(text)
                except (ValueError, SyntaxError):
                    raise bad_arg("filters", "a JSON object", text[:100]) from None
        return q

    @route("GET", "/v1/ping/")
    def ping(request: Request) -> dict:
        return {"status": "ok", "message": "memkern", "org_id": ORG_ID, "project_id": PROJECT_ID, "user_email": None}

    def add_body(request: Request, body: dict, oss: bool = False) -> dict:
        _check_keys(body, ADD_KEYS)
        ids, _ = ids_for(request, {k: v for k, v in body.items() if k != "metadata"}, oss=oss)
        infer = body.get("infer", True)
        out = service.add(body.get("messages"), metadata=body.get("metadata"), infer=infer,
                          date=body.get("timestamp"), **ids)
        return {"results": [{**r, "id": str(r["id"])} for r in out["results"]]}

    @route("POST", "/v3/memories/add/", "/v1/memories/")
    def add(request: Request, body: dict[str, Any] = Body(...)) -> dict:
        return add_body(request, body)

    @route("POST", "/memories", oss=True)
    def oss_add(request: Request, body: dict[str, Any] = Body(...)) -> dict:
        return add_body(request, body, oss=True)

    def list_body(request: Request, body: dict, page: Any, page_size: Any, oss: bool = False) -> dict:
        _check_keys(body, LIST_KEYS)
        ids, meta = ids_for(request, body, oss=oss)
        if meta:
            raise bad_arg("filters.metadata", "none on a listing (search takes a metadata filter)", meta)
        page_size = body.get("limit", 100) if page_size is None else page_size
        page = 1 if page is None else page
        for name, v in (("page", page), ("page_size", page_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise bad_arg(name, "an int >= 1", v)
        out = service.list(limit=page_size, offset=(page - 1) * page_size, **ids)
        res = [mem0_item(d) for d in out["results"]]
        nxt = str(request.url.include_query_params(page=page + 1, page_size=page_size)) \
            if page * page_size < out["count"] else None
        prev = str(request.url.include_query_params(page=page - 1, page_size=page_size)) if page > 1 else None
        return {"count": out["count"], "next": nxt, "previous": prev, "results": res}

    @route("POST", "/v3/memories/", "/v2/memories/")
    def get_all(request: Request, body: dict[str, Any] = Body(default_factory=dict),
                page: Optional[int] = Query(None), page_size: Optional[int] = Query(None)) -> dict:
        return list_body(request, body, page, page_size)

    @route("GET", "/v1/memories/")
    def get_all_v1(request: Request) -> dict:
        q = query_of(request)
        for k in ("page", "page_size", "limit"):
            if k in q and q[k].isdigit():
                q[k] = int(q[k])
        return list_body(request, q, q.pop("page", None), q.pop("page_size", None))

    @route("GET", "/memories", oss=True)
    def oss_get_all(request: Request) -> dict:
        return {"results": get_all_v1(request)["results"]}

    def search_body(request: Request, body: dict, oss: bool = False) -> dict:
        _check_keys(body, SEARCH_KEYS)
        ids, meta = ids_for(request, body, oss=oss)
        limit = body.get("top_k", body.get("limit", 10))
        mode = body.get("mode", "hybrid" if body.get("keyword_search") else "dense")
        kw = {k: body[k] for k in ("fusion", "lexical_weight") if k in body}
        out = service.search(body.get("query"), limit=limit, threshold=body.get("threshold"), filters=meta,
                             mode=mode, **kw, **ids)
        return {"results": [mem0_item(d) for d in out["results"]]}

    @route("POST", "/v3/memories/search/", "/v2/memories/search/", "/v1/memories/search/")
    def search(request: Request, body: dict[str, Any] = Body(...)) -> dict:
        return search_body(request, body)

    @route("POST", "/search", oss=True)
    def oss_search(request: Request, body: dict[str, Any] = Body(...)) -> dict:
        return search_body(request, body, oss=True)

    @route("GET", "/v1/memories/{memory_id}/", "/memories/{memory_id}")
    def get(request: Request, memory_id: str) -> dict:
        return mem0_item(service.get(memory_id_of(memory_id), **by_id(request, query_of(request))))

    @route("PUT", "/v1/memories/{memory_id}/", "/memories/{memory_id}")
    def update(request: Request, memory_id: str, body: dict[str, Any] = Body(...)) -> dict:
        body = dict(body)
        for alias in ("data", "memory"):  # the OSS server's names for the new text
            if "text" not in body and alias in body:
                body["text"] = body.pop(alias)
        _check_keys(body, frozenset({"text", "metadata", "timestamp"}))
        if body.get("timestamp") is not None:
            raise bad_arg("timestamp", "null on an update (a memory's date is set when it is added)", body["timestamp"])
        kw = by_id(request, {**query_of(request), **{k: v for k, v in body.items() if k in ENTITY_KEYS}})
        return mem0_item(service.update(memory_id_of(memory_id), text=body.get("text"), metadata=body.get("metadata"),
                                        **kw))

    @route("DELETE", "/v1/memories/{memory_id}/", "/memories/{memory_id}")
    def delete(request: Request, memory_id: str) -> dict:
        service.delete(memory_id_of(memory_id), **by_id(request, query_of(request)))
        return {"message": "Memory deleted successfully!", "id": memory_id}

    @route("GET", "/v1/memories/{memory_id}/history/", "/memories/{memory_id}/history")
    def history(request: Request, memory_id: str) -> list:
        out = service.history(memory_id_of(memory_id), **by_id(request, query_of(request)))["results"]
        return [{**v, "id": f"{v['memory_id']}:{v['version']}", "memory_id": str(v["memory_id"])} for v in out]

    @route("DELETE", "/v1/memories/", "/memories")
    def delete_all(request: Request) -> dict:
        ids, _ = ids_for(request, query_of(request))
        n = service.delete_scope(**ids)["deleted"]
        return {"message": "Memories deleted successfully!", "deleted": n}

    @route("GET", "/v1/entities/")
    def users(request: Request) -> dict:
        rows = service.entities(request.scope.get("memkern.key_scope"))
        res = [{"id": r["name"], "name": r["name"], "type": r["type"], "total_memories": r["total_memories"],
                "owner": None, "metadata": {}, "created_at": None, "updated_at": None} for r in rows]
        return {"count": len(res), "next": None, "previous": None, "results": res}

    @route("DELETE", "/v2/entities/{entity_type}/{entity_id}/", "/v1/entities/{entity_type}/{entity_id}/")
    def delete_entity(request: Request, entity_type: str, entity_id: str) -> dict:
        if entity_type not in ENTITY_TYPES:
            raise bad_arg("entity_type", f"one of {sorted(ENTITY_TYPES)}", entity_type)
        ids, _ = ids_for(request, {ENTITY_TYPES[entity_type]: entity_id})
        # none left is no error: reset deletes a user and then the agents of its scopes
        n = service.delete_scope(**ids)["deleted"]
        return {"message": "Entity deleted successfully.", "deleted": n}

    @route("POST", "/reset", oss=True)
    def reset(request: Request) -> dict:
        bound = request.scope.get("memkern.key_scope")
        n = 0
        for ns in S.matching(service.store.namespaces(), bound or S.Scope()):
            n += service.delete_scope(**S.decode(ns).as_dict())["deleted"]
        return {"message": "All memories reset", "deleted": n}

    def batch(request: Request, body: Any, with_text: bool) -> list[tuple[int, dict]]:
        if not isinstance(body, dict) or not isinstance(body.get("memories"), list) or not body["memories"]:
            raise bad_arg("memories", "a non-empty list of {memory_id, ...}", body)
        if len(body["memories"]) > service.limits.max_limit:
            raise bad_arg("memories", f"at most {service.limits.max_limit}", len(body["memories"]))
        kw = by_id(request, {})
        out = []
        for i, m in enumerate(body["memories"]):
            if not isinstance(m, dict) or not isinstance(m.get("memory_id"), (str, int)):
                raise bad_arg(f"memories[{i}]", "an object with a memory_id", m)
            extra = set(m) - ({"memory_id", "text", "metadata"} if with_text else {"memory_id"})
            if extra:
                raise bad_arg(f"memories[{i}].{sorted(extra)[0]}", "memory_id, text, metadata", sorted(extra)[0])
            mid = memory_id_of(str(m["memory_id"]))
            service.owned(mid, **kw)  # every id checked before anything is written
            if with_text and m.get("text") is None and m.get("metadata") is None:
                raise bad_arg(f"memories[{i}]", "a text or metadata to update", m)
            out.append((mid, m))
        return out

    @route("PUT", "/v1/batch/")
    def batch_update(request: Request, body: Any = Body(...)) -> dict:
        todo = batch(request, body, True)
        kw = by_id(request, {})
        for mid, m in todo:
            service.update(mid, text=m.get("text"), metadata=m.get("metadata"), **kw)
        return {"message": f"Successfully updated {len(todo)} memories"}

    @route("DELETE", "/v1/batch/")
    def batch_delete(request: Request, body: Any = Body(...)) -> dict:
        todo = batch(request, body, False)
        kw = by_id(request, {})
        for mid, _ in todo:
            service.delete(mid, **kw)
        return {"message": f"Successfully deleted {len(todo)} memories"}


__all__ = ["entity_ids", "mem0_item", "memory_id_of", "mount"]
