"""Start-up model loading and the health routes: `/health/live` answers while the models load,
`/health/ready` is a JSON 503 with the reason until they are loaded (or when the load failed or the
store is closed), `/health` stays what it was; the first request after ready costs what later ones
do (the real command with the MiniLM embedder)."""
from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import memkern  # noqa: E402
from memkern.server import MemoryService  # noqa: E402

from fakes_rmm import HashEmbedder  # noqa: E402
from serve_common import running  # noqa: E402

BENCH = Path(__file__).resolve().parents[2] / "bench"


class GatedEmbedder(HashEmbedder):
    """A HashEmbedder whose encode waits for ``gate`` (a model still loading) or raises ``fail``."""

    def __init__(self, dim=64, fail: Exception | None = None):
        super().__init__(dim)
        self.gate = threading.Event()
        self.fail = fail

    def encode(self, texts, kind="passage", **kw):
        assert self.gate.wait(30)
        if self.fail is not None:
            raise self.fail
        return super().encode(texts, kind, **kw)


@pytest.fixture
def store(tmp_path):
    with memkern.MemoryStore(tmp_path / "store", dim=64, metric="cos") as st:
        yield st


def _wait_ready(http, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        r = http.get("/health/ready")
        if r.status_code == 200:
            return r
        time.sleep(0.01)
    raise AssertionError(f"not ready: {r.text}")


def test_live_at_once_ready_after_the_models_load_and_requests_wait_for_them(store):
    emb = GatedEmbedder()
    svc = MemoryService(store, embedder=emb)
    with running(svc, api_key=None) as url, httpx.Client(base_url=url, timeout=30) as http:
        assert http.get("/health/live").json() == {"status": "live"}
        health = http.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok" and health.json()["dim"] == 64
        r = http.get("/health/ready")
        assert r.status_code == 503 and r.headers["content-type"] == "application/json"
        body = r.json()
        assert body["status"] == "loading" and body["error"] == "NotReady"
        assert body["detail"].startswith("models: expected loaded, got still loading")
        with ThreadPoolExecutor(1) as pool:  # a request that needs the embedder waits for the load
            pending = pool.submit(http.post, "/v1/memories", json={"messages": "I play the cello", "user_id": "a",
                                                                     "infer": False})
            time.sleep(0.3)
            assert not pending.done() and http.get("/health/ready").status_code == 503
            emb.gate.set()
            assert pending.result(10).status_code == 200
        ready = _wait_ready(http).json()
        assert ready["status"] == "ready" and ready["load_seconds"] >= 0.3
    # the load ran the embedder first (the request's passage may share a batch with its second text)
    assert emb.calls[0] == (["warm-up"], "query")
    assert sorted(t for texts, kind in emb.calls[1:] if kind == "passage" for t in texts) == ["I play the cello",
                                                                                            "warm-up"]
    svc.close()


def test_models_load_without_any_request(store):
    emb = HashEmbedder(64)
    svc = MemoryService(store, embedder=emb)
    with running(svc) as url, httpx.Client(base_url=url, timeout=30) as http:
        _wait_ready(http)  # health routes need no key
        assert [kind for _, kind in emb.calls] == ["query", "passage"]
    svc.close()


def test_a_failed_load_and_a_closed_store_are_not_ready(tmp_path):
    with memkern.MemoryStore(tmp_path / "s", dim=64, metric="cos") as st:
        emb = GatedEmbedder(fail=RuntimeError("weights missing"))
        emb.gate.set()
        svc = MemoryService(st, embedder=emb)
        with running(svc, api_key=None) as url, httpx.Client(base_url=url, timeout=30) as http:
            assert svc.readiness.wait(10)
            r = http.get("/health/ready")
            assert r.status_code == 503 and r.json()["status"] == "failed"
            assert r.json()["detail"] == "models: expected loaded, got a failed load (RuntimeError: weights missing)"
            assert http.get("/health/live").status_code == 200
        emb2 = HashEmbedder(64)
        svc2 = MemoryService(st, embedder=emb2)
        svc2.load()
        assert svc2.start_loading() and svc2.readiness.wait(5) and svc2.ready() == (True, "ready")
    assert svc2.ready() == (False, "store: expected open, got closed")
    with memkern.MemoryStore(tmp_path / "s2", dim=64, metric="cos") as st2:
        svc3 = MemoryService(st2, embedder=HashEmbedder(64))
        assert svc3.ready() == (False, "models: expected loaded, got not started")


def test_the_default_embedder_is_built_by_the_load_not_by_a_request(store, monkeypatch):
    built, options = [], []

    class Default(HashEmbedder):
        def __init__(self, **kw):
            built.append(threading.current_thread().name)
            options.append(kw)
            super().__init__(64)

    monkeypatch.setattr("memkern.models.Embedder", Default)
    svc = MemoryService(store)  # no embedder: the offline default
    assert svc.start_loading() and not svc.start_loading()  # once
    assert svc.readiness.wait(10) and svc.readiness.state == "ready"
    assert built == ["memkern-load"]
    assert options == [{"query_cache": 4096}]  # repeated queries are answered from the exact cache
    svc.search("x", user_id="a")
    assert len(built) == 1
    MemoryService(store, embedder_options={"query_cache": 0, "backend": "torch"}).load()
    assert options[1] == {"query_cache": 0, "backend": "torch"}


def test_mcp_server_starts_loading(store):
    pytest.importorskip("mcp")
    from memkern.server.mcp import build_server

    emb = HashEmbedder(64)
    svc = MemoryService(store, embedder=emb)
    build_server(svc)
    assert svc.readiness.wait(10) and svc.ready() == (True, "ready")
    assert [kind for _, kind in emb.calls] == ["query", "passage"]


@pytest.mark.slow
def test_first_request_after_ready_is_as_fast_as_later_ones():
    """The real `memkern serve` with the offline MiniLM embedder (bench/serve_first_request.py)."""
    sys.path.insert(0, str(BENCH))
    try:
        from serve_first_request import measure
    finally:
        sys.path.remove(str(BENCH))
    out = measure(sys.executable, later=5)
    assert out["live_s"] <= out["ready_s"]
    for kind in ("add", "search"):
        first, later = out[kind]["first_s"], out[kind]["later_median_s"]
        assert first < 3 * later + 0.1, out


def test_a_serving_load_freezes_what_it_built_and_a_library_load_does_not(store):
    """``start_loading(freeze_gc=True)`` (what ``memkern serve`` calls) moves every object the
    process holds, the models included, out of the collector's reach once the load succeeded, so
    a full collection under load does not walk them; a service used as a library leaves the
    collector alone."""
    import gc

    gc.unfreeze()
    lib, served = MemoryService(store, embedder=HashEmbedder(64)), MemoryService(store, embedder=HashEmbedder(64))
    try:
        assert lib.start_loading() and lib.readiness.wait(30) and lib.readiness.state == "ready"
        assert gc.get_freeze_count() == 0
        assert served.start_loading(freeze_gc=True) and served.readiness.wait(30)
        assert served.readiness.state == "ready" and gc.get_freeze_count() > 1000
        assert not served.start_loading()  # once: create_app's own start is a no-op
    finally:
        gc.unfreeze()
        lib.close()
        served.close()
