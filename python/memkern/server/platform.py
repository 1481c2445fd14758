"""mem0's platform features for ``memkern serve``: project settings, webhooks, memory feedback,
structured exports, summaries and user profiles (what ``MemoryClient``'s non-memory methods call).

One server is one project (:data:`memkern.server.mem0_routes.ORG_ID` / ``PROJECT_ID``).

What each feature does here:

- **Project settings** (``get_project`` / ``update_project``): kept and returned. The server's
  ``infer=true`` extraction uses no LLM, so ``custom_instructions`` and ``custom_categories`` do
  not steer it; ``custom_instructions`` is given to the chat model of exports, summaries and
  profiles.
- **Webhooks**: after a write is applied, one ``POST`` per memory and subscribed webhook, with
  mem0's body ``{"event_details": {"id", "data": {"memory"}, "event": "ADD"|"UPDATE"|"DELETE"}}``
  plus ``event_type`` and the memory's scope ids. Sent by one background thread (never in the
  write's request), up to 3 tries each (0.2 s, 1 s apart); a full queue drops events (counted as
  ``dropped``); the counters ``delivered`` / ``failed`` / ``dropped`` are in each webhook's listing.
- **Memory feedback**: one line per call appended to ``<store>/server/memory-feedback.jsonl`` and
  fsynced before the answer; the latest feedback of a memory is the export field ``feedback``.
- **Exports, profiles**: the chat model fills the given JSON schema from the scope's memories
  (:func:`fill_schema`): its JSON answer is parsed leniently and held to the schema
  (:func:`coerce`: unknown keys dropped, a value of the wrong type becomes the property's default
  or null), so the result always has the schema's shape. They run as jobs on one background
  thread. **Summaries** are one chat-model call, answered in the request.

State (settings, webhooks, profiles, the last :data:`KEEP_JOBS` jobs and exports) is one JSON
document, ``<store>/server/platform.json``, replaced atomically on each change
(:func:`memkern.base.atomic.atomic_write`); a store without a path keeps it in memory. A job that
was pending or running when the server stopped is read back as failed.
"""
from __future__ import annotations

import copy
import json
import logging
import os
import queue
import threading
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from ..base.atomic import append_durably, atomic_write, private_dir
from ..base.validate import iso_time
from ..errors import MemkernKeyError, MemkernTypeError, MemkernValueError, StoreCorruptedError, bad_arg
from ..text.jsonrepair import JSONRepairError, parse_json
from .mem0_routes import ORG_ID, PROJECT_ID

log = logging.getLogger("memkern")

__all__ = ["Platform", "coerce", "fill_schema", "PROJECT_FIELDS", "EVENT_TYPES"]

#: Project settings ``update_project`` takes, with their JSON types.
PROJECT_FIELDS = {"custom_instructions": str, "custom_categories": list, "memory_depth": str,
                  "usecase_setting": str, "multilingual": bool, "agent_custom_instructions": str,
                  "retrieval_criteria": list, "enable_graph": bool, "inclusion_prompt": str,
                  "exclusion_prompt": str, "name": str, "description": str}
#: Webhook event types (mem0 spells them ``memory_add`` or ``memory:add``).
EVENT_TYPES = ("memory_add", "memory_update", "memory_delete")
KEEP_JOBS = 256
MAX_MEMORY_CHARS = 6000          # memories given to the chat model per call (newest first)
WEBHOOK_QUEUE = 10000
WEBHOOK_RETRY_S = (0.2, 1.0)
_BAD = object()


def now_iso() -> str:
    return iso_time(time.time())


# ---------------------------------------------------------------------------------- schemas
def check_schema(schema: Any, arg: str = "schema") -> dict:
    """A JSON schema of an object (a dict, or a str holding one) with ``properties``."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            raise bad_arg(arg, "a JSON schema (an object or a JSON string of one)", schema[:100]) from None
    if not isinstance(schema, dict):
        raise bad_arg(arg, "a JSON schema object", type(schema).__name__, MemkernTypeError)
    props = schema.get("properties")
    if not isinstance(props, dict) or not props or not all(isinstance(v, dict) for v in props.values()):
        raise bad_arg(f"{arg}.properties", "an object of property schemas (at least one)", props)
    return schema


def _resolve(schema: dict, root: dict) -> dict:
    ref = schema.get("$ref")
    for _ in range(32):
        if not isinstance(ref, str):
            return schema
        part = ref.rsplit("/", 1)[-1]
        schema = (root.get("$defs") or root.get("definitions") or {}).get(part, {})
        ref = schema.get("$ref")
    return {}


def coerce(value: Any, schema: dict, root: dict | None = None) -> Any:
    """``value`` held to a JSON-schema subset, or the internal marker of a mismatch.

    Handles ``type`` (one or a list: object, array, string, integer, number, boolean, null),
    ``properties`` (unknown keys dropped; a missing or mismatched property becomes its
    ``default`` or null), ``items``, ``enum``, ``anyOf`` / ``oneOf`` (the first branch that fits),
    ``$ref`` into ``$defs`` / ``definitions``, ``minLength`` / ``maxLength``.
    """
    root = schema if root is None else root
    schema = _resolve(schema, root)
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            for branch in schema[key]:
                out = coerce(value, branch, root) if isinstance(branch, dict) else _BAD
                if out is not _BAD:
                    return out
            return _BAD
    if "enum" in schema:
        return value if value in schema["enum"] else _BAD
    types = schema.get("type")
    types = [types] if isinstance(types, str) else (types or [])
    if not types and isinstance(schema.get("properties"), dict):
        types = ["object"]
    if not types:
        return value
    for t in types:
        if t == "null" and value is None:
            return None
        if t == "object" and isinstance(value, dict):
            props = schema.get("properties")
            if not isinstance(props, dict):
                return value
            return {k: _property(value.get(k, _BAD), sub, root) for k, sub in props.items()}
        if t == "array" and isinstance(value, list):
            items = schema.get("items")
            if not isinstance(items, dict):
                return value
            return [v for v in (coerce(x, items, root) for x in value) if v is not _BAD]
        if t == "string" and isinstance(value, str):
            if len(value) < schema.get("minLength", 0):
                continue
            return value[:schema["maxLength"]] if isinstance(schema.get("maxLength"), int) else value
        if t == "boolean" and isinstance(value, bool):
            return value
        if t == "integer" and isinstance(value, int) and not isinstance(value, bool):
            return value
        if t == "integer" and isinstance(value, float) and value.is_integer():
            return int(value)
        if t == "number" and isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
    return _BAD


def _property(value: Any, schema: dict, root: dict) -> Any:
    out = _BAD if value is _BAD else coerce(value, schema, root)
    if out is _BAD:
        return copy.deepcopy(_resolve(schema, root).get("default"))
    return out


def _types(sub: dict, root: dict) -> list[str]:
    sub = _resolve(sub, root)
    t = sub.get("type")
    if isinstance(t, str):
        return [t]
    if isinstance(t, list):
        return [x for x in t if isinstance(x, str)]
    return [x for b in sub.get("anyOf", sub.get("oneOf", [])) if isinstance(b, dict) for x in _types(b, root)]


def schema_skeleton(schema: dict) -> str:
    """The schema as a JSON object to complete, each value a ``<description>`` placeholder typed
    the way the value is written (small chat models follow this better than a list of fields)."""
    parts = []
    for name, sub in schema["properties"].items():
        r = _resolve(sub, schema)
        desc = str(r.get("description") or r.get("title") or name).replace('"', "'")
        types = [t for t in _types(sub, schema) if t != "null"]
        if isinstance(r.get("enum"), list):
            hole = "<one of " + ", ".join(json.dumps(e) for e in r["enum"]) + f": {desc}>"
        elif types[:1] == ["boolean"]:
            hole = f"<true/false: {desc}>"
        elif types[:1] in (["integer"], ["number"]):
            hole = f"<number: {desc}>"
        elif types[:1] == ["array"]:
            hole = f"[<{desc}>]"
        elif types[:1] == ["object"]:
            hole = f"{{<{desc}>}}"
        else:
            hole = f'"<{desc}>"'
        parts.append(f"{json.dumps(name)}: {hole}")
    return "{" + ", ".join(parts) + "}"


def memory_lines(memories: list[dict], budget: int = MAX_MEMORY_CHARS) -> str:
    """The newest memories that fit in ``budget`` characters, one ``- text`` line each, oldest first."""
    out, used = [], 0
    for m in sorted(memories, key=lambda m: m["id"], reverse=True):
        line = f"- {m['memory']}"
        if used + len(line) + 1 > budget and out:
            break
        out.append(line[:budget])
        used += len(line) + 1
    return "\n".join(reversed(out))


def _ask(chat: Any, memories: list[dict], task: str, instructions: str | None, **generate) -> str:
    """One chat-model call: the memories (:func:`memory_lines`), the task, then the instructions."""
    ask = f"Memories:\n{memory_lines(memories)}\n\n{task}"
    if instructions:
        ask += f"\n\n{instructions}"
    return chat.generate([[{"role": "user", "content": ask}]], **generate)[0]


def fill_schema(chat: Any, memories: list[dict], schema: dict, instructions: str | None = None) -> dict:
    """The chat model's reading of ``memories`` as one object of ``schema`` (:func:`coerce`d;
    an unparsable answer gives every property its default or null)."""
    text = _ask(chat, memories, "Complete this JSON with facts from the memories (null if unknown):\n"
                + schema_skeleton(schema), instructions, max_new_tokens=512, json=True)
    try:
        value = parse_json(text, expect=dict)
    except JSONRepairError:
        value = {}
    return coerce(value, {**schema, "type": "object"}, schema)   # a dict (value is one)


def summarize(chat: Any, memories: list[dict], instructions: str | None = None) -> str:
    return _ask(chat, memories, "Summarize what these memories say in a short paragraph.", instructions,
                max_new_tokens=256).strip()


def event_type(value: Any, arg: str) -> str:
    if not isinstance(value, str) or value.replace(":", "_") not in EVENT_TYPES:
        raise bad_arg(arg, f"one of {list(EVENT_TYPES)} (or memory:add, ...)", value)
    return value.replace(":", "_")


# ---------------------------------------------------------------------------------- state
class Platform:
    """The platform state of one :class:`~memkern.server.service.MemoryService` (module docstring).

    Parameters
    ----------
    service : MemoryService
        Its store's path holds the state; its ``chat_model`` runs exports, summaries and profiles;
        its ``list`` reads a scope's memories.
    sender : callable ``(url, body: bytes) -> None``, optional
        Delivers one webhook call (raises on failure); default an HTTP ``POST`` (urllib, 5 s timeout).
    """

    FILE, FEEDBACK_FILE = "platform.json", "memory-feedback.jsonl"

    def __init__(self, service: Any, sender: Callable[[str, bytes], None] | None = None):
        self.service = service
        store = service.store
        path = getattr(store, "path", None)
        self.folder = None if not path else os.path.join(os.fspath(path), "server")
        self.read_only = bool(getattr(store, "read_only", False))
        self._lock = threading.RLock()
        self._send = sender or _http_post
        self.state: dict = {"project": {}, "webhooks": {}, "next_webhook": 1, "profile_settings":
                            {"enabled": False, "schema": None, "custom_instructions": None},
                            "profiles": {}, "jobs": {}, "idempotency": {}}
        self._feedback: dict[int, dict] | None = None   # read from its file on first use
        self.stats: dict[str, dict] = {}
        self._jobs: ThreadPoolExecutor | None = None
        self._queue: queue.Queue | None = None
        self._sender_thread: threading.Thread | None = None
        self._closed = False
        self._load()

    # -------------------------------------------------------------- persistence
    def _file(self, name: str) -> str | None:
        return None if self.folder is None else os.path.join(self.folder, name)

    def _load(self) -> None:
        path = self._file(self.FILE)
        if path and os.path.exists(path):
            try:
                with open(path, encoding="utf-8") as f:
                    saved = json.load(f)
                if not isinstance(saved, dict) or not isinstance(saved.get("jobs", {}), dict):
                    raise ValueError("not a platform state object")
            except ValueError as e:
                raise StoreCorruptedError(f"{path}: expected the server's platform state (JSON), got "
                                          f"unreadable content ({e})") from None
            self.state.update(saved)
            for job in self.state["jobs"].values():
                if job["status"] in ("pending", "running"):
                    job.update(status="failed", error="the server stopped before the job finished")

    @property
    def feedback(self) -> dict[int, dict]:
        """The latest memory feedback per memory id (its file read on first use, under the lock)."""
        with self._lock:
            if self._feedback is None:
                got: dict[int, dict] = {}
                fb = self._file(self.FEEDBACK_FILE)
                if fb and os.path.exists(fb):
                    with open(fb, encoding="utf-8", errors="replace") as f:
                        for line in f:
                            try:
                                row = json.loads(line)
                            except ValueError:          # a torn last line
                                continue
                            got[int(row["memory_id"])] = row
                self._feedback = got
            return self._feedback

    def _writable(self) -> None:
        if self.read_only:
            raise MemkernValueError("store: expected one open for writing, got a read-only store "
                                    "(platform settings are written beside it)")

    def _save(self) -> None:
        if self.folder is None:
            return
        private_dir(self.folder)
        atomic_write(self._file(self.FILE), json.dumps(self.state, ensure_ascii=False, sort_keys=True))

    def _mutate(self, fn: Callable[[dict], Any]) -> Any:
        """``fn(state)`` applied to a copy, saved durably, then made current (a failed save changes nothing)."""
        self._writable()
        with self._lock:
            new = copy.deepcopy(self.state)
            out = fn(new)
            old, self.state = self.state, new
            try:
                self._save()
            except BaseException:
                self.state = old
                raise
            return out

    # -------------------------------------------------------------- project
    def project(self, fields: list[str] | None = None) -> dict:
        with self._lock:
            full = {"id": PROJECT_ID, "org_id": ORG_ID, "name": PROJECT_ID, "description": None,
                    **{k: None for k in PROJECT_FIELDS}, "custom_categories": [], **copy.deepcopy(self.state["project"])}
        if fields:
            unknown = [f for f in fields if f not in full]
            if unknown:
                raise bad_arg("fields", f"names among {sorted(full)}", unknown[0])
            return {f: full[f] for f in fields}
        return full

    def update_project(self, body: dict) -> dict:
        if not isinstance(body, dict) or not body:
            raise bad_arg("body", f"an object with some of {sorted(PROJECT_FIELDS)}", body)
        for k, v in body.items():
            if k not in PROJECT_FIELDS:
                raise bad_arg(f"body.{k}", f"one of {sorted(PROJECT_FIELDS)}", k)
            if v is not None and (not isinstance(v, PROJECT_FIELDS[k]) or (PROJECT_FIELDS[k] is not bool
                                                                           and isinstance(v, bool))):
                raise bad_arg(k, f"a {PROJECT_FIELDS[k].__name__} or null", v, MemkernTypeError)
        self._mutate(lambda s: s["project"].update(body))
        return {"message": "Updated project settings", **self.project(sorted(body))}

    def instructions(self) -> str | None:
        with self._lock:
            return self.state["project"].get("custom_instructions")

    # -------------------------------------------------------------- webhooks
    def _webhook_json(self, wid: str, w: dict) -> dict:
        return {"webhook_id": int(wid), **w, **self.stats.get(wid, {"delivered": 0, "failed": 0, "dropped": 0})}

    def webhooks(self) -> list[dict]:
        with self._lock:
            return [self._webhook_json(k, w) for k, w in sorted(self.state["webhooks"].items(), key=lambda kv: int(kv[0]))]

    def _check_webhook(self, body: dict, partial: bool) -> dict:
        out = {}
        for k in ("name", "url", "event_types"):
            if k not in body or body[k] is None:
                if not partial:
                    raise bad_arg(k, "a value (name, url and event_types are required)", None)
                continue
            v = body[k]
            if k == "url" and (not isinstance(v, str) or not v.startswith(("http://", "https://")) or len(v) > 2048):
                raise bad_arg("url", "an http:// or https:// URL", v)
            if k == "name" and (not isinstance(v, str) or not v.strip() or len(v) > 256):
                raise bad_arg("name", "a non-empty str of at most 256 characters", v)
            if k == "event_types":
                if not isinstance(v, list) or not v:
                    raise bad_arg("event_types", f"a non-empty list of {list(EVENT_TYPES)}", v)
                v = sorted({event_type(e, f"event_types[{i}]") for i, e in enumerate(v)})
            out[k] = v
        extra = sorted(set(body) - {"name", "url", "event_types", "is_active"})
        if extra:
            raise bad_arg(f"body.{extra[0]}", "name, url, event_types", extra[0])
        if "is_active" in body:
            if not isinstance(body["is_active"], bool):
                raise bad_arg("is_active", "a bool", body["is_active"], MemkernTypeError)
            out["is_active"] = body["is_active"]
        return out

    def create_webhook(self, body: dict) -> dict:
        fields = self._check_webhook(body, partial=False)

        def add(s):
            wid = str(s["next_webhook"])
            s["next_webhook"] += 1
            t = now_iso()
            s["webhooks"][wid] = {"name": fields["name"], "url": fields["url"], "event_types": fields["event_types"],
                                  "is_active": fields.get("is_active", True), "project": PROJECT_ID,
                                  "created_at": t, "updated_at": t}
            return wid

        wid = self._mutate(add)
        with self._lock:
            return self._webhook_json(wid, self.state["webhooks"][wid])

    def _webhook_id(self, webhook_id: Any) -> str:
        wid = str(webhook_id)
        with self._lock:
            if wid not in self.state["webhooks"]:
                raise MemkernKeyError(f"webhook_id: expected the id of a webhook of this project, got {wid[:64]!r}")
        return wid

    def update_webhook(self, webhook_id: Any, body: dict) -> dict:
        wid = self._webhook_id(webhook_id)
        fields = self._check_webhook(body, partial=True)
        if not fields:
            raise bad_arg("body", "some of name, url, event_types, is_active", body)
        self._mutate(lambda s: s["webhooks"][wid].update(fields, updated_at=now_iso()))
        return {"message": "Webhook updated successfully"}

    def delete_webhook(self, webhook_id: Any) -> dict:
        wid = self._webhook_id(webhook_id)
        self._mutate(lambda s: s["webhooks"].pop(wid))
        return {"message": "Webhook deleted successfully"}

    def memory_event(self, event: str, items: list[dict]) -> None:
        """Queue the webhook calls of an applied write (``event``: ADD / UPDATE / DELETE; ``items``:
        ``{"id", "memory", "user_id", "agent_id", "run_id"}``). Never blocks, never raises."""
        kind = {"ADD": "memory_add", "UPDATE": "memory_update", "DELETE": "memory_delete"}.get(event)
        with self._lock:
            hooks = [(wid, w["url"]) for wid, w in self.state["webhooks"].items()
                     if w.get("is_active", True) and kind in w["event_types"]]
        if not hooks or not items or self._closed:
            return
        self._start_sender()
        for wid, url in hooks:
            for it in items:
                body = {"event_details": {"id": str(it["id"]), "data": {"memory": it.get("memory")}, "event": event},
                        "event_type": kind, "webhook_id": int(wid),
                        **{k: it.get(k) for k in ("user_id", "agent_id", "run_id")}}
                try:
                    self._queue.put_nowait((wid, url, json.dumps(body, ensure_ascii=False).encode("utf-8")))
                except queue.Full:
                    self._count(wid, "dropped")

    def _count(self, wid: str, what: str) -> None:
        with self._lock:
            st = self.stats.setdefault(wid, {"delivered": 0, "failed": 0, "dropped": 0})
            st[what] += 1

    def _start_sender(self) -> None:
        with self._lock:
            if self._sender_thread is None:
                self._queue = queue.Queue(WEBHOOK_QUEUE)
                self._sender_thread = threading.Thread(target=self._deliver, name="memkern-webhooks", daemon=True)
                self._sender_thread.start()

    def _deliver(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._deliver_one(*item)
            finally:
                self._queue.task_done()

    def _deliver_one(self, wid: str, url: str, body: bytes) -> None:
        for attempt in range(len(WEBHOOK_RETRY_S) + 1):
            try:
                self._send(url, body)
                self._count(wid, "delivered")
                return
            except Exception as e:  # noqa: BLE001 - any failure of the receiver is retried, then counted
                if attempt == len(WEBHOOK_RETRY_S):
                    log.warning("serve: webhook %s: %s failed: %s", wid, url, e)
                    self._count(wid, "failed")
                else:
                    time.sleep(WEBHOOK_RETRY_S[attempt])

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait until queued webhook calls are sent (tests, shutdown); ``False`` on timeout."""
        deadline = time.monotonic() + timeout
        while self._queue is not None and self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return self._queue is None or not self._queue.unfinished_tasks

    # -------------------------------------------------------------- feedback
    def add_feedback(self, memory_id: int, feedback: Any, reason: Any) -> dict:
        self._writable()
        if feedback is not None and feedback not in ("POSITIVE", "NEGATIVE", "VERY_NEGATIVE"):
            raise bad_arg("feedback", "POSITIVE, NEGATIVE, VERY_NEGATIVE or null", feedback)
        if reason is not None and (not isinstance(reason, str) or len(reason) > 4096):
            raise bad_arg("feedback_reason", "a str of at most 4096 characters or null", reason)
        row = {"memory_id": int(memory_id), "feedback": feedback, "feedback_reason": reason, "at": now_iso()}
        with self._lock:
            known = self.feedback              # read before the append, so the new row is not read twice
            path = self._file(self.FEEDBACK_FILE)
            if path is not None:
                append_durably(path, (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
            known[int(memory_id)] = row
        return {"id": str(memory_id), "feedback": feedback, "feedback_reason": reason}

    # -------------------------------------------------------------- jobs
    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._jobs is None:
                self._jobs = ThreadPoolExecutor(1, thread_name_prefix="memkern-platform")
            return self._jobs

    def _new_job(self, kind: str, fields: dict, key: str | None = None) -> tuple[dict, bool]:
        """A new job record (or the one an earlier call with the same idempotency ``key`` made)."""
        with self._lock:
            if key is not None and key in self.state["idempotency"]:
                jid = self.state["idempotency"][key]
                if jid in self.state["jobs"]:
                    return copy.deepcopy(self.state["jobs"][jid]), True
        jid = uuid.uuid4().hex
        job = {"id": jid, "kind": kind, "status": "pending", "created_at": now_iso(), "updated_at": now_iso(),
               "total": None, "completed": 0, "succeeded": 0, "failed": 0, "skipped": 0,
               "enumeration_complete": False, "error": None, **fields}

        def put(s):
            s["jobs"][jid] = job
            if key is not None:
                s["idempotency"][key] = jid
            while len(s["jobs"]) > KEEP_JOBS:
                s["jobs"].pop(next(iter(s["jobs"])))
            live = set(s["jobs"])
            s["idempotency"] = {k: v for k, v in s["idempotency"].items() if v in live}

        self._mutate(put)
        return copy.deepcopy(job), False

    def _run(self, jid: str, work: Callable[[], Any]) -> None:
        def run():
            self._mutate(lambda s: s["jobs"][jid].update(status="running", updated_at=now_iso()))
            try:
                work()
                self._mutate(lambda s: s["jobs"][jid].update(status="completed", enumeration_complete=True,
                                                             updated_at=now_iso()))
            except Exception as e:  # noqa: BLE001 - a job's failure is its status
                log.warning("serve: platform job %s failed: %s", jid, e)
                try:
                    self._mutate(lambda s: s["jobs"][jid].update(status="failed", error=str(e)[:500],
                                                                 updated_at=now_iso()))
                except Exception:  # noqa: BLE001
                    log.exception("serve: platform job %s: the failure could not be recorded", jid)

        self._executor().submit(run)

    def job(self, jid: str) -> dict:
        with self._lock:
            job = self.state["jobs"].get(str(jid))
            if job is None:
                raise MemkernKeyError(f"job_id: expected the id of a job of this server, got {str(jid)[:64]!r}")
            return copy.deepcopy(job)

    def wait(self, timeout: float = 30.0) -> None:
        """Wait for the queued jobs (tests, shutdown)."""
        if self._jobs is not None:
            self._jobs.submit(lambda: None).result(timeout)

    # -------------------------------------------------------------- exports
    def _memories(self, scope: dict) -> list[dict]:
        out = self.service.list(limit=self.service.limits.max_limit, **scope)["results"]
        with self._lock:
            known = self.feedback
            for m in out:
                fb = known.get(int(m["id"]))
                m["feedback"] = None if fb is None else fb["feedback"]
        return out

    def create_export(self, schema: Any, scope: dict) -> dict:
        schema = check_schema(schema)
        job, _ = self._new_job("export", {"scope": scope, "schema": schema, "data": None})
        jid = job["id"]

        def work():
            mems = self._memories(scope)
            data = fill_schema(self.service.chat_model, mems, schema, self.instructions()) if mems else \
                coerce({}, {**schema, "type": "object"}, schema)
            self._mutate(lambda s: s["jobs"][jid].update(data=data, total=len(mems), completed=len(mems),
                                                         succeeded=len(mems)))

        self._run(jid, work)
        return {"message": "Memory export request received. The export will be ready in a few seconds.", "id": jid}

    def get_export(self, export_id: Any, scope: dict, visible: Callable[[dict], bool]) -> tuple[int, dict]:
        """``(status code, body)``: 200 with the export's data once completed, 202 while it runs."""
        with self._lock:
            jobs = [j for j in self.state["jobs"].values() if j["kind"] == "export" and visible(j["scope"])]
        if export_id is not None:
            jobs = [j for j in jobs if j["id"] == str(export_id)]
            if not jobs:
                raise MemkernKeyError(f"memory_export_id: expected the id of an export in the given scope, got "
                                      f"{str(export_id)[:64]!r}")
        else:
            jobs = [j for j in jobs if all(j["scope"].get(k) == v for k, v in scope.items() if v is not None)]
            if not jobs:
                raise MemkernKeyError("filters: expected the scope of an export made earlier, got one with none")
        job = jobs[-1]
        if job["status"] == "completed":
            return 200, copy.deepcopy(job["data"])
        if job["status"] == "failed":
            raise MemkernValueError(f"memory_export_id: the export {job['id']} failed: {job['error']}")
        return 202, {"id": job["id"], "status": job["status"], "message": "The export is not ready yet."}

    def summary(self, scope: dict) -> dict:
        mems = self._memories(scope)
        text = summarize(self.service.chat_model, mems, self.instructions()) if mems else ""
        return {"status": "completed", "summary": text, "memory_count": len(mems),
                "filters": {k: v for k, v in scope.items() if v is not None}}

    # -------------------------------------------------------------- profiles
    def profile_settings(self) -> dict:
        with self._lock:
            ps = copy.deepcopy(self.state["profile_settings"])
        return {"enabled": ps["enabled"], "capabilities": {"entity_types": ["user"], "schema": True,
                                                           "custom_instructions": True},
                "entities": {"user": {"schema": ps["schema"], "custom_instructions": ps["custom_instructions"]}}}

    def update_profile_settings(self, body: Any) -> dict:
        if not isinstance(body, dict):
            raise bad_arg("body", "an object with enabled and/or entities.user", type(body).__name__, MemkernTypeError)
        extra = sorted(set(body) - {"enabled", "entities"})
        if extra:
            raise bad_arg(f"body.{extra[0]}", "enabled, entities", extra[0])
        upd: dict = {}
        if "enabled" in body:
            if not isinstance(body["enabled"], bool):
                raise bad_arg("enabled", "a bool", body["enabled"], MemkernTypeError)
            upd["enabled"] = body["enabled"]
        ents = body.get("entities", {})
        if not isinstance(ents, dict) or set(ents) - {"user"} or not isinstance(ents.get("user", {}), dict):
            raise bad_arg("entities", "{'user': {'schema': ..., 'custom_instructions': ...}}", ents)
        user = ents.get("user", {})
        extra = sorted(set(user) - {"schema", "custom_instructions"})
        if extra:
            raise bad_arg(f"entities.user.{extra[0]}", "schema, custom_instructions", extra[0])
        if "schema" in user:
            upd["schema"] = None if user["schema"] is None else check_schema(user["schema"], "entities.user.schema")
            for name, sub in (upd["schema"] or {}).get("properties", {}).items():
                if not isinstance(_resolve(sub, upd["schema"]).get("description"), str):
                    raise bad_arg(f"entities.user.schema.properties.{name}.description", "a str", None)
        if "custom_instructions" in user:
            ci = user["custom_instructions"]
            if ci is not None and (not isinstance(ci, str) or len(ci) > 4096):
                raise bad_arg("entities.user.custom_instructions", "a str of at most 4096 characters or null", ci)
            upd["custom_instructions"] = ci
        self._mutate(lambda s: s["profile_settings"].update(upd))
        return self.profile_settings()

    def _profile_instructions(self) -> str | None:
        with self._lock:
            parts = [self.state["profile_settings"].get("custom_instructions"), self.instructions()]
        return " ".join(p for p in parts if p) or None

    def _generate_profile(self, user_id: str) -> None:
        mems = self._memories({"user_id": user_id, "agent_id": None, "run_id": None})
        with self._lock:
            schema = self.state["profile_settings"]["schema"]
        if not mems:
            profile, status = None, "insufficient_data"
        elif schema is None:
            profile, status = summarize(self.service.chat_model, mems, self._profile_instructions()), "succeeded"
        else:
            profile, status = fill_schema(self.service.chat_model, mems, schema, self._profile_instructions()), "succeeded"

        def put(s):
            old = s["profiles"].get(user_id, {})
            s["profiles"][user_id] = {"profile": profile, "status": status, "updated_at": now_iso(),
                                      "generation_count": old.get("generation_count", 0) + 1}

        self._mutate(put)

    def _check_enabled(self) -> None:
        with self._lock:
            if not self.state["profile_settings"]["enabled"]:
                raise MemkernValueError("profiles: expected enabled (update_profile_settings(enabled=True)), got disabled")

    def profile(self, user_id: str) -> dict:
        with self._lock:
            p = copy.deepcopy(self.state["profiles"].get(user_id))
            enabled = self.state["profile_settings"]["enabled"]
            pending = any(j["kind"] == "profile" and user_id in j["entity_ids"] and j["status"] in ("pending", "running")
                          for j in self.state["jobs"].values())
        base = {"entity_type": "user", "entity_id": user_id}
        if p is None:
            status = "pending" if pending else ("not_enabled" if not enabled else "insufficient_data")
            return {**base, "profile": None, "status": status, "updated_at": None, "generation_count": 0}
        return {**base, **p, "status": "pending" if pending else p["status"]}

    def start_profiles(self, operation: str, user_ids: list[str], key: str | None, status_base: str) -> dict:
        self._check_enabled()
        job, replayed = self._new_job("profile", {"operation": operation, "entity_type": "user",
                                                  "entity_ids": list(user_ids), "total": len(user_ids)}, key)
        jid = job["id"]
        if not replayed:
            def work():
                for uid in user_ids:
                    self._generate_profile(uid)
                    self._mutate(lambda s: s["jobs"][jid].update(completed=s["jobs"][jid]["completed"] + 1,
                                                                 succeeded=s["jobs"][jid]["succeeded"] + 1))
            self._run(jid, work)
        out = {"job_id": jid, "status": job["status"], "status_url": f"{status_base}{jid}/", "operation": operation,
               "entity_type": "user", "replayed": replayed, "event_id": jid}
        if operation == "sample":
            out.update(sampled=len(user_ids), entity_ids=list(user_ids))
        else:
            out["entity_count_reserved"] = len(user_ids)
        return out

    # -------------------------------------------------------------- shutdown
    def close(self) -> None:
        """Finish the queued jobs and webhook calls (at most a few seconds), then stop the threads."""
        self._closed = True
        if self._jobs is not None:
            self._jobs.shutdown(wait=True, cancel_futures=False)
        if self._queue is not None:
            self.drain(5.0)
            self._queue.put(None)


def _http_post(url: str, body: bytes) -> None:
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": "application/json", "User-Agent": "memkern-webhooks"})
    with urllib.request.urlopen(req, timeout=5.0) as r:  # noqa: S310 - http(s) URLs only (checked on create)
        if not 200 <= r.status < 300:
            raise OSError(f"HTTP {r.status}")
