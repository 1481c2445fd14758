"""The routes of mem0's platform methods (:mod:`memkern.server.platform` does the work).

==============================================================  ==========================================
``GET|PATCH /api/v1/orgs/organizations/{org}/projects/{proj}/``  get_project (``?fields=``), update_project
``GET|POST /api/v1/webhooks/projects/{proj}/``                   get_webhooks, create_webhook
``PUT|DELETE /api/v1/webhooks/{webhook_id}/``                    update_webhook, delete_webhook
``POST /v1/feedback/``                                           feedback (of one memory)
``POST /v1/exports/``, ``POST /v1/exports/get/``                 create_memory_export, get_memory_export (202 while it runs)
``POST /v1/summary/``                                            get_summary
``GET|POST /v2/profiles/settings/``                              get_profile_settings, update_profile_settings
``POST /v2/profiles/jobs/``, ``GET /v2/profiles/jobs/{id}/``     generate_profile / sample_profiles, get_profile_job
``GET /v2/entities/user/{user_id}/profile/``                     get_profile
==============================================================  ==========================================

Project settings, webhooks, profile settings and profile sampling reach the whole project: they
need a key bound to no scope (403 otherwise). Feedback, exports, summaries and profiles are held to
the key's scope like the memory routes. ``org`` / ``proj`` must be the ping's (404 otherwise).
"""

from typing import Any, Callable, Optional

from ..errors import MemkernKeyError, MemkernTypeError, bad_arg
from . import scopes as S
from .mem0_routes import ORG_ID, PROJECT_ID, entity_ids, memory_id_of

PROFILE_JOBS = "/v2/profiles/jobs/"
SAMPLE_LIMIT = 10


def mount(app: Any, service: Any, scoped: Callable[..., dict], forbidden: type) -> None:
    """Add the platform routes to ``app``; ``scoped`` holds ids to the request's key (app.py's),
    ``forbidden`` is the exception class answered with 403."""
    from fastapi import Body, Query, Request
    from fastapi.responses import JSONResponse

    platform = service.platform

    def route(method: str, path: str):
        def deco(fn):
            for p in (path, path.rstrip("/")):
                app.add_api_route(p, fn, methods=[method], tags=["mem0 platform"], include_in_schema=(p == path))
            return fn
        return deco

    def whole_project(request: Request) -> None:
        if request.scope.get("memkern.key_scope") is not None:
            raise forbidden("api key: expected one bound to no scope (this setting is the whole project's), "
                            "got a scoped key")

    def project_of(org_id: str, project_id: str) -> None:
        if org_id != ORG_ID or project_id != PROJECT_ID:
            raise MemkernKeyError(f"project: expected {ORG_ID}/{PROJECT_ID} (this server's, named by the ping), "
                                  f"got {org_id[:64]}/{project_id[:64]}")

    def scope_of(request: Request, body: dict, need: bool = False) -> dict:
        ids, meta = entity_ids({k: v for k, v in body.items() if k in ("filters", "user_id", "agent_id", "run_id",
                                                                           "app_id")})
        if meta:
            raise bad_arg("filters.metadata", "none here (entity ids only)", meta)
        kw = scoped(request, ids.get("user_id"), ids.get("agent_id"), ids.get("run_id"))
        if need and all(v is None for v in kw.values()):
            raise bad_arg("filters", "at least one of user_id, agent_id, run_id, app_id", body.get("filters"))
        return kw

    def visible(request: Request) -> Callable[[dict], bool]:
        bound = request.scope.get("memkern.key_scope")
        return lambda scope: bound is None or bound.contains(S.make_scope(**scope, required=False))

    def only(body: Any, allowed: set, arg: str = "body") -> dict:
        if not isinstance(body, dict):
            raise bad_arg(arg, "a JSON object", type(body).__name__, MemkernTypeError)
        extra = sorted(set(body) - allowed - {"org_id", "project_id"})
        if extra:
            raise bad_arg(f"{arg}.{extra[0]}", f"one of {sorted(allowed)}", extra[0])
        return body

    # ------------------------------------------------------------------ project
    @route("GET", "/api/v1/orgs/organizations/{org_id}/projects/{project_id}/")
    def get_project(request: Request, org_id: str, project_id: str,
                    fields: Optional[list[str]] = Query(None)) -> dict:
        project_of(org_id, project_id)
        return platform.project(fields)

    @route("PATCH", "/api/v1/orgs/organizations/{org_id}/projects/{project_id}/")
    def update_project(request: Request, org_id: str, project_id: str, body: Any = Body(...)) -> dict:
        project_of(org_id, project_id)
        whole_project(request)
        if isinstance(body, dict):
            body = {k: v for k, v in body.items() if k not in ("org_id", "project_id")}
        return platform.update_project(body)

    # ------------------------------------------------------------------ webhooks
    @route("GET", "/api/v1/webhooks/projects/{project_id}/")
    def get_webhooks(request: Request, project_id: str) -> list:
        project_of(ORG_ID, project_id)
        whole_project(request)
        return platform.webhooks()

    @route("POST", "/api/v1/webhooks/projects/{project_id}/")
    def create_webhook(request: Request, project_id: str, body: Any = Body(...)) -> dict:
        project_of(ORG_ID, project_id)
        whole_project(request)
        return platform.create_webhook(only(body, {"name", "url", "event_types", "is_active"}))

    @route("PUT", "/api/v1/webhooks/{webhook_id}/")
    def update_webhook(request: Request, webhook_id: str, body: Any = Body(...)) -> dict:
        whole_project(request)
        return platform.update_webhook(webhook_id, only(body, {"name", "url", "event_types", "is_active"}))

    @route("DELETE", "/api/v1/webhooks/{webhook_id}/")
    def delete_webhook(request: Request, webhook_id: str) -> dict:
        whole_project(request)
        return platform.delete_webhook(webhook_id)

    # ------------------------------------------------------------------ feedback
    @app.post("/v1/feedback/", tags=["mem0 platform"])
    def memory_feedback(request: Request, body: Any = Body(...)) -> dict:
        """mem0's feedback on one memory (memkern's reranker rewards: ``POST /v1/feedback``, no slash)."""
        only(body, {"memory_id", "feedback", "feedback_reason"})
        if not isinstance(body.get("memory_id"), (str, int)) or isinstance(body.get("memory_id"), bool):
            raise bad_arg("memory_id", "the id of a memory", body.get("memory_id"))
        mid = memory_id_of(str(body["memory_id"]))
        kw = scoped(request)
        service.owned(mid, **kw, any_scope=all(v is None for v in kw.values()))
        return platform.add_feedback(mid, body.get("feedback"), body.get("feedback_reason"))

    # ------------------------------------------------------------------ exports, summary
    @route("POST", "/v1/exports/")
    def create_export(request: Request, body: Any = Body(...)) -> dict:
        only(body, {"schema", "filters", "user_id", "agent_id", "run_id", "app_id"})
        if "schema" not in body:
            raise bad_arg("schema", "a JSON schema", None)
        return platform.create_export(body["schema"], scope_of(request, body, need=True))

    @route("POST", "/v1/exports/get/")
    def get_export(request: Request, body: Any = Body(default_factory=dict)):
        only(body, {"memory_export_id", "filters", "user_id", "agent_id", "run_id", "app_id"})
        code, out = platform.get_export(body.get("memory_export_id"), scope_of(request, body), visible(request))
        return out if code == 200 else JSONResponse(out, status_code=code)

    @route("POST", "/v1/summary/")
    def summary(request: Request, body: Any = Body(default_factory=dict)) -> dict:
        only(body, {"filters", "user_id", "agent_id", "run_id", "app_id"})
        return platform.summary(scope_of(request, body, need=True))

    # ------------------------------------------------------------------ profiles
    @route("GET", "/v2/profiles/settings/")
    def get_profile_settings(request: Request) -> dict:
        return platform.profile_settings()

    @route("POST", "/v2/profiles/settings/")
    def update_profile_settings(request: Request, body: Any = Body(...)) -> dict:
        whole_project(request)
        return platform.update_profile_settings(body)

    def users_with_memories(request: Request) -> list[str]:
        return [e["name"] for e in service.entities(request.scope.get("memkern.key_scope")) if e["type"] == "user"]

    @route("POST", PROFILE_JOBS)
    def profile_job(request: Request, body: Any = Body(...)) -> dict:
        only(body, {"operation", "entity_type", "entity_id", "limit"})
        if body.get("entity_type", "user") != "user":
            raise bad_arg("entity_type", "user", body.get("entity_type"))
        key = request.headers.get("idempotency-key")
        op = body.get("operation")
        if op == "trigger":
            uid = body.get("entity_id")
            if not isinstance(uid, str) or not uid:
                raise bad_arg("entity_id", "a user id", uid)
            kw = scoped(request, user_id=uid)
            if uid not in users_with_memories(request):
                raise MemkernKeyError(f"entity_id: expected a user with memories in the given scope, got {uid[:64]!r}")
            return platform.start_profiles("trigger", [kw["user_id"]], key, PROFILE_JOBS)
        if op == "sample":
            whole_project(request)
            limit = body.get("limit", 3)
            if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= SAMPLE_LIMIT:
                raise bad_arg("limit", f"an int in 1..{SAMPLE_LIMIT}", limit)
            return platform.start_profiles("sample", users_with_memories(request)[:limit], key, PROFILE_JOBS)
        raise bad_arg("operation", "trigger or sample", op)

    @route("GET", PROFILE_JOBS + "{job_id}/")
    def get_profile_job(request: Request, job_id: str) -> dict:
        job = platform.job(job_id)
        if job["kind"] != "profile":
            raise MemkernKeyError(f"job_id: expected the id of a profile job, got {job_id[:64]!r}")
        if request.scope.get("memkern.key_scope") is not None and job["operation"] == "sample":
            whole_project(request)
        keep = ("id", "status", "operation", "entity_type", "total", "completed", "succeeded", "failed", "skipped",
                "enumeration_complete", "created_at", "updated_at", "error")
        return {"job": {k: job[k] for k in keep}}

    @route("GET", "/v2/entities/user/{user_id}/profile/")
    def get_profile(request: Request, user_id: str) -> dict:
        scoped(request, user_id=user_id)
        out = platform.profile(user_id)
        if out["generation_count"] == 0 and user_id not in users_with_memories(request):
            raise MemkernKeyError(f"entity_id: expected a user of this project, got {user_id[:64]!r}")
        return out


__all__ = ["mount"]
