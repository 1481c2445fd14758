"""mem0's own SDK (the real ``mem0ai`` package, unmodified) against ``memkern serve``: the
platform methods of ``MemoryClient`` and ``AsyncMemoryClient`` (project, webhooks, memory
feedback, exports, summary, profiles). Together with test_mem0_client.py's memory methods this
covers every public method of both clients; ``chat`` raises NotImplementedError inside mem0
itself. Webhooks are received by a real HTTP server on 127.0.0.1."""
from __future__ import annotations

import asyncio
import inspect
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

os.environ["MEM0_TELEMETRY"] = "False"
os.environ.setdefault("MEM0_DIR", os.path.join(os.environ.get("TMPDIR", "/tmp"), "memkern-test-mem0"))

import pytest  # noqa: E402

pytest.importorskip("mem0")
pytest.importorskip("fastapi")

from fakes_rmm import HashEmbedder, ScriptedChat  # noqa: E402
from mem0 import AsyncMemoryClient, MemoryClient  # noqa: E402
from mem0.exceptions import MemoryNotFoundError  # noqa: E402
from serve_common import KEY, running  # noqa: E402
from test_mem0_client import MEMORY_METHODS  # noqa: E402

import memkern  # noqa: E402
from memkern.server import MemoryService  # noqa: E402
from memkern.server.platform import coerce  # noqa: E402
from memkern.server.scopes import KeyRing, Scope  # noqa: E402

PLATFORM_METHODS = ("get_project", "update_project", "get_webhooks", "create_webhook", "update_webhook",
                    "delete_webhook", "feedback", "create_memory_export", "get_memory_export", "get_summary",
                    "get_profile_settings", "update_profile_settings", "generate_profile", "sample_profiles",
                    "get_profile_job", "get_profile")
SCHEMA = {"title": "Person", "type": "object",
          "properties": {"instrument": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None,
                                        "description": "the instrument the user plays"},
                         "city": {"type": "string", "description": "where the user's sister lives"},
                         "weekly": {"type": "boolean", "default": False, "description": "plays every week"}}}


def answer(prompt) -> str:
    """The fake chat model: JSON that names what the memories in the prompt say, plus noise the
    server must drop (an unknown key, a wrong type); a summary otherwise."""
    user = prompt[-1]["content"]
    if "Complete this JSON" in user:
        inst = "cello" if "cello" in user else None
        return "Sure! " + json.dumps({"instrument": inst, "city": "Lisbon" if "Lisbon" in user else 7,
                                      "weekly": "yes", "extra": 1})
    return f"The user has {user.count(chr(10) + '- ')} memories."


class Receiver:
    """An HTTP server on 127.0.0.1 that records the JSON bodies POSTed to it."""

    def __init__(self):
        self.bodies: list[dict] = []
        got = self.bodies

        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


def _service(st, chat=None):
    return MemoryService(st, embedder=HashEmbedder(64), chat_model=chat or ScriptedChat(answer))


def _wait(fn, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        out = fn()
        if out:
            return out
        time.sleep(0.02)
    raise AssertionError("timed out")


def test_every_public_client_method_is_covered():
    for cls in (MemoryClient, AsyncMemoryClient):
        public = {n for n, _ in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")}
        assert public == set(MEMORY_METHODS) | set(PLATFORM_METHODS) | {"chat"}, sorted(public)


def test_memory_client_every_platform_method(tmp_path):
    hooks = Receiver()
    try:
        with memkern.MemoryStore(tmp_path / "store", dim=64, metric="cos") as st:
            service = _service(st)
            with running(service) as url:
                c = MemoryClient(api_key=KEY, host=url)
                called = set()
                alice = {"user_id": "alice"}

                # project settings, through both the deprecated methods and client.project
                assert c.get_project(fields=["custom_instructions"]) == {"custom_instructions": None}
                called.add("get_project")
                out = c.update_project(custom_instructions="Answer briefly.", custom_categories=[{"music": "x"}])
                called.add("update_project")
                assert out["custom_instructions"] == "Answer briefly."
                assert c.project.get(fields=["custom_categories"]) == {"custom_categories": [{"music": "x"}]}
                c.project.update(multilingual=True)
                assert c.get_project()["multilingual"] is True

                # webhooks: created, listed, updated, delivered after writes, deleted
                wh = c.create_webhook(url=hooks.url, name="log", project_id=c.project_id, event_types=["memory_add"])
                called.add("create_webhook")
                assert wh["event_types"] == ["memory_add"] and wh["is_active"]
                ids = [r["id"] for r in c.add([{"role": "user", "content": "I play the cello every Sunday."},
                                               {"role": "user", "content": "My sister lives in Lisbon."}],
                                              filters=alice, infer=False)["results"]]
                assert c.update_webhook(wh["webhook_id"], event_types=["memory:add", "memory_delete"])["message"] \
                    == "Webhook updated successfully"
                called.add("update_webhook")
                c.update(ids[1], text="My sister lives in Lisbon, by the river.")   # not subscribed: no call
                c.add("Temporary note.", filters=alice, infer=False)
                tmp = c.get_all(filters=alice)["results"][-1]["id"]
                c.delete(tmp)
                assert service.platform.drain()
                got = [(b["event_details"]["event"], b["event_details"]["id"], b["event_details"]["data"]["memory"])
                       for b in hooks.bodies]
                assert got == [("ADD", ids[0], "I play the cello every Sunday."),
                               ("ADD", ids[1], "My sister lives in Lisbon."),
                               ("ADD", tmp, "Temporary note."), ("DELETE", tmp, "Temporary note.")]
                assert all(b["user_id"] == "alice" and b["webhook_id"] == wh["webhook_id"] for b in hooks.bodies)
                listed = c.get_webhooks(project_id=c.project_id)
                called.add("get_webhooks")
                assert [(w["webhook_id"], w["delivered"], w["failed"]) for w in listed] == [(wh["webhook_id"], 4, 0)]
                assert c.delete_webhook(wh["webhook_id"])["message"] == "Webhook deleted successfully"
                called.add("delete_webhook")
                assert c.get_webhooks(project_id=c.project_id) == []

                # memory feedback: durable, and the export's "feedback" field
                fb = c.feedback(ids[0], "positive", feedback_reason="right instrument")
                called.add("feedback")
                assert fb == {"id": ids[0], "feedback": "POSITIVE", "feedback_reason": "right instrument"}
                lines = (tmp_path / "store" / "server" / "memory-feedback.jsonl").read_text().splitlines()
                assert json.loads(lines[-1])["feedback"] == "POSITIVE"
                with pytest.raises(MemoryNotFoundError):
                    c.feedback("987654", "NEGATIVE")

                # structured export: the chat model's answer held to the schema
                job = c.create_memory_export(json.dumps(SCHEMA), filters=alice)
                called.add("create_memory_export")
                assert job["message"].startswith("Memory export request received") and job["id"]
                service.platform.wait()
                data = c.get_memory_export(memory_export_id=job["id"])
                called.add("get_memory_export")
                # "extra" dropped, "weekly": "yes" is no bool -> its default
                assert data == {"instrument": "cello", "city": "Lisbon", "weekly": False}
                assert c.get_memory_export(filters=alice) == data          # the latest export of a scope
                prompt = service._chat_raw.calls[-1]["prompts"][0]
                assert "Answer briefly." in prompt[0]["content"] and "- I play the cello" in prompt[0]["content"]
                assert '"weekly": <true/false: plays every week>' in prompt[0]["content"]
                assert service._chat_raw.calls[-1]["json"] is True

                summary = c.get_summary(filters=alice)
                called.add("get_summary")
                assert summary["summary"] == "The user has 2 memories." and summary["memory_count"] == 2

                # profiles: off by default, a schema, one user's job, a sample job
                assert c.get_profile_settings()["enabled"] is False
                called.add("get_profile_settings")
                assert c.get_profile("alice")["status"] == "not_enabled"
                called.add("get_profile")
                with pytest.raises(Exception, match="enabled"):
                    c.generate_profile("alice")
                st_ = c.update_profile_settings(enabled=True, schema=SCHEMA, custom_instructions="Be terse.")
                called.add("update_profile_settings")
                assert st_["enabled"] and st_["entities"]["user"]["schema"]["title"] == "Person"
                run = c.generate_profile("alice", idempotency_key="k1")
                called.add("generate_profile")
                assert run["replayed"] is False and run["entity_count_reserved"] == 1
                assert c.generate_profile("alice", idempotency_key="k1")["job_id"] == run["job_id"]   # replayed
                job = _wait(lambda: (j := c.get_profile_job(run["status_url"])["job"])["status"] == "completed" and j)
                called.add("get_profile_job")
                assert (job["total"], job["succeeded"]) == (1, 1)
                prof = c.get_profile("alice")
                assert prof["status"] == "succeeded" and prof["generation_count"] == 1
                assert prof["profile"] == {"instrument": "cello", "city": "Lisbon", "weekly": False}
                with pytest.raises(Exception):
                    c.get_profile("nobody")                                  # no such user: 404
                c.add("Bob has a dog.", filters={"user_id": "bob"}, infer=False)
                sample = c.sample_profiles(limit=5)
                called.add("sample_profiles")
                assert sorted(sample["entity_ids"]) == ["alice", "bob"] and sample["sampled"] == 2
                _wait(lambda: c.get_profile_job(sample["job_id"])["job"]["status"] == "completed")
                assert c.get_profile("bob")["profile"] == {"instrument": None, "city": None, "weekly": False}
                assert c.get_profile("alice")["generation_count"] == 2
                assert called == set(PLATFORM_METHODS)
            service.close()

        # everything but the running jobs survives a restart
        with memkern.MemoryStore(tmp_path / "store", dim=64, metric="cos") as st:
            p = _service(st).platform
            assert p.project()["custom_instructions"] == "Answer briefly." and p.webhooks() == []
            assert p.profile("alice")["generation_count"] == 2 and p.feedback[int(ids[0])]["feedback"] == "POSITIVE"
            assert p.profile_settings()["enabled"] is True
        state = tmp_path / "store" / "server" / "platform.json"
        state.write_text("{not json")
        with memkern.MemoryStore(tmp_path / "store", dim=64, metric="cos") as st:
            with pytest.raises(memkern.StoreCorruptedError, match="platform.json"):
                _service(st)
    finally:
        hooks.close()


def test_async_memory_client_every_platform_method(tmp_path):
    hooks = Receiver()

    async def run(url, service):
        called = set()
        async with AsyncMemoryClient(api_key=KEY, host=url) as c:
            carol = {"user_id": "carol"}
            assert "custom_instructions" in await c.get_project()
            called.add("get_project")
            await c.update_project(custom_instructions="Short.")
            called.add("update_project")
            wh = await c.create_webhook(url=hooks.url, name="a", project_id=c.project_id,
                                        event_types=["memory_update"])
            called.add("create_webhook")
            await c.update_webhook(wh["webhook_id"], name="b")
            called.add("update_webhook")
            assert [w["name"] for w in await c.get_webhooks(project_id=c.project_id)] == ["b"]
            called.add("get_webhooks")
            mid = (await c.add("Carol plays the cello.", filters=carol, infer=False))["results"][0]["id"]
            await c.update(mid, text="Carol plays the cello daily.")
            assert service.platform.drain()
            assert [b["event_details"]["event"] for b in hooks.bodies] == ["UPDATE"]
            await c.delete_webhook(wh["webhook_id"])
            called.add("delete_webhook")
            assert (await c.feedback(mid, "VERY_NEGATIVE"))["feedback"] == "VERY_NEGATIVE"
            called.add("feedback")
            job = await c.create_memory_export(SCHEMA, filters=carol)
            called.add("create_memory_export")
            service.platform.wait()
            assert (await c.get_memory_export(memory_export_id=job["id"]))["instrument"] == "cello"
            called.add("get_memory_export")
            assert (await c.get_summary(filters=carol))["memory_count"] == 1
            called.add("get_summary")
            await c.update_profile_settings(enabled=True)
            called.add("update_profile_settings")
            assert (await c.get_profile_settings())["entities"]["user"]["schema"] is None
            called.add("get_profile_settings")
            r = await c.generate_profile("carol")
            called.add("generate_profile")
            s = await c.sample_profiles(limit=1)
            called.add("sample_profiles")
            assert s["entity_ids"] == ["carol"]
            service.platform.wait()
            assert (await c.get_profile_job(r["job_id"]))["job"]["status"] == "completed"
            called.add("get_profile_job")
            prof = await c.get_profile("carol")
            called.add("get_profile")
            assert prof["profile"] == "The user has 1 memories." and prof["generation_count"] == 2  # no schema: text
        return called

    try:
        with memkern.MemoryStore(tmp_path / "store", dim=64, metric="cos") as st:
            service = _service(st)
            with running(service) as url:
                assert asyncio.run(run(url, service)) == set(PLATFORM_METHODS)
    finally:
        hooks.close()


def test_platform_scopes_and_bad_input(tmp_path):
    """A key bound to a scope reaches its own exports / profiles / feedback only, and none of the
    project-wide settings; bad input is a 4xx naming the argument; failed webhook calls are counted."""
    with memkern.InMemoryStore(dim=64, metric="cos") as st:
        service = _service(st)
        service.platform._send = lambda url, body: (_ for _ in ()).throw(OSError("refused"))
        ring = KeyRing({KEY: None, "alice-key": Scope(user_id="alice")})
        with running(service, api_key=None, api_keys=ring) as url:
            admin, alice = MemoryClient(api_key=KEY, host=url), MemoryClient(api_key="alice-key", host=url)
            bob_id = admin.add("Bob's secret.", filters={"user_id": "bob"}, infer=False)["results"][0]["id"]
            alice.add("Alice's note.", infer=False)
            for call in (lambda: alice.update_project(custom_instructions="x"),
                         lambda: alice.create_webhook(url="http://127.0.0.1:9/", name="x", project_id="default",
                                                      event_types=["memory_add"]),
                         lambda: alice.get_webhooks(project_id="default"),
                         lambda: alice.update_profile_settings(enabled=True),
                         lambda: alice.sample_profiles()):
                with pytest.raises(Exception, match="no scope"):
                    call()
            with pytest.raises(MemoryNotFoundError):
                alice.feedback(bob_id, "POSITIVE")
            with pytest.raises(Exception, match="expected 'alice'"):
                alice.create_memory_export(SCHEMA, filters={"user_id": "bob"})
            job = admin.create_memory_export(SCHEMA, filters={"user_id": "bob"})
            service.platform.wait()
            with pytest.raises(MemoryNotFoundError):                      # another scope's export
                alice.get_memory_export(memory_export_id=job["id"])
            assert admin.get_memory_export(memory_export_id=job["id"])["city"] is None
            for call, word in ((lambda: admin.create_memory_export("{not json", filters={"user_id": "bob"}), "schema"),
                               (lambda: admin.create_memory_export({"type": "object"}, user_id="bob"),
                                "schema.properties"),
                               (lambda: admin.create_memory_export(SCHEMA), "filters"),
                               (lambda: admin.create_webhook(url="file:///etc/passwd", name="x", project_id="default",
                                                             event_types=["memory_add"]), "url"),
                               (lambda: admin.create_webhook(url="http://127.0.0.1:9/", name="x",
                                                             project_id="default", event_types=["memory_eat"]),
                                "event_types"),
                               (lambda: admin.create_webhook(url="http://127.0.0.1:9/", name="x",
                                                             project_id="other", event_types=["memory_add"]),
                                "project"),
                               (lambda: admin.update_project(multilingual="yes"), "multilingual"),
                               (lambda: admin.update_webhook(12345, name="y"), "webhook_id"),
                               (lambda: admin.update_profile_settings(schema={"properties": {"a": {"type": "string"}}}),
                                "description")):
                with pytest.raises(Exception, match=word):
                    call()
            wh = admin.create_webhook(url="http://127.0.0.1:9/", name="dead", project_id="default",
                                      event_types=["memory_add"])
            admin.add("One more.", filters={"user_id": "bob"}, infer=False)
            assert _wait(lambda: admin.get_webhooks(project_id="default")[0]["failed"] == 1)
            assert admin.get_webhooks(project_id="default")[0]["webhook_id"] == wh["webhook_id"]


def test_coerce_holds_values_to_the_schema():
    schema = {"$defs": {"Level": {"enum": ["low", "high"], "type": "string"}},
              "properties": {"level": {"$ref": "#/$defs/Level"}, "n": {"type": "integer", "default": 0},
                             "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}},
                             "name": {"anyOf": [{"type": "string", "minLength": 2}, {"type": "null"}]},
                             "inner": {"type": "object", "properties": {"x": {"type": "number"}}}}}
    got = coerce({"level": "high", "n": 3.0, "tags": ["abcd", 5, "x"], "name": "A", "inner": {"x": 1, "y": 2},
                  "junk": True}, {**schema, "type": "object"}, schema)
    assert got == {"level": "high", "n": 3, "tags": ["abc", "x"], "name": None, "inner": {"x": 1}}
    got = coerce({"level": "mid", "n": True, "inner": 4}, {**schema, "type": "object"}, schema)
    assert got == {"level": None, "n": 0, "tags": None, "name": None, "inner": None}


@pytest.mark.slow
def test_export_and_profile_with_the_real_chat_model(tmp_path):
    """The offline default chat model fills a schema from real memories: the answer has the
    schema's shape whatever the small model writes, and the prompt is within its context."""
    with memkern.InMemoryStore(dim=64, metric="cos") as st:
        service = MemoryService(st, embedder=HashEmbedder(64), chat_model=memkern.ChatModel())
        with running(service) as url:
            c = MemoryClient(api_key=KEY, host=url)
            c.add([{"role": "user", "content": "I play the cello every Sunday."},
                   {"role": "user", "content": "My sister lives in Lisbon."}], filters={"user_id": "alice"}, infer=False)
            job = c.create_memory_export(SCHEMA, filters={"user_id": "alice"})
            service.platform.wait(120)
            data = c.get_memory_export(memory_export_id=job["id"])
            assert set(data) == {"instrument", "city", "weekly"}
            assert "cello" in (data["instrument"] or "").lower() and "Lisbon" in (data["city"] or "")
            assert isinstance(data["weekly"], bool)
            summary = c.get_summary(filters={"user_id": "alice"})["summary"]
            assert isinstance(summary, str) and summary
