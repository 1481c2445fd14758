"""memkern.base.telemetry: spans through the OpenTelemetry API (recorded by the SDK's in-memory
exporter the test installs), nothing configured or sent by memkern itself, and a no-op path that
costs ~nothing (both with the API installed and no provider, and with OpenTelemetry off)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from memkern import MemkernKeyError, MemoryStore
from memkern.base import telemetry  # noqa: E402


def _run(code: str, env: dict | None = None) -> str:
    e = dict(os.environ, **(env or {}))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_nothing_is_configured_or_exported_by_default():
    # a fresh interpreter: memkern's calls run, but no provider is ever set (the API's proxy stays),
    # so every span is dropped; even OTEL_* exporter variables are not acted on by memkern.
    code = (
        "import numpy as np, memkern\n"
        "from opentelemetry import trace\n"
        "from memkern.base import telemetry\n"
        "s = memkern.MemoryStore(__import__('tempfile').mkdtemp() + '/s', dim=4)\n"
        "s.add('a', 'x', np.ones(4, np.float32)); s.search('a', np.ones(4, np.float32), k=1)\n"
        "print(type(trace.get_tracer_provider()).__name__, telemetry.enabled(), telemetry.tracer())\n"
    )
    out = _run(code, {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"})
    assert out == "ProxyTracerProvider False None"


def test_the_api_is_imported_only_once_the_application_imports_it():
    """``import memkern`` and its calls leave ``opentelemetry.trace`` unimported (no provider can be
    set without it); an application that imports it and sets an SDK provider after memkern was
    imported and used still gets memkern's spans."""
    code = (
        "import sys, tempfile, numpy as np, memkern\n"
        "s = memkern.MemoryStore(tempfile.mkdtemp() + '/s', dim=4)\n"
        "s.add('a', 'x', np.ones(4, np.float32)); s.search('a', np.ones(4, np.float32), k=1)\n"
        "print('opentelemetry.trace' in sys.modules)\n"
        "from opentelemetry import trace\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from opentelemetry.sdk.trace.export import SimpleSpanProcessor\n"
        "from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter\n"
        "ex = InMemorySpanExporter(); p = TracerProvider(); p.add_span_processor(SimpleSpanProcessor(ex))\n"
        "trace.set_tracer_provider(p)\n"
        "s.search('a', np.ones(4, np.float32), k=1)\n"
        "print([x.name for x in ex.get_finished_spans()])\n"
    )
    assert _run(code).splitlines() == ["False", "['memkern.store.search']"]


@pytest.fixture
def spans():
    """An SDK provider with an in-memory exporter for one test; afterwards the API's global state
    is put back to "no provider" (the API has no public reset: its two module globals are restored,
    so later tests run as an application without OpenTelemetry configured would)."""
    from opentelemetry.util._once import Once

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    saved = (trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE)
    trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = None, Once()
    trace.set_tracer_provider(provider)
    yield exporter
    trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = saved
    provider.shutdown()
    assert not telemetry.enabled()


def test_store_and_reranker_calls_make_spans(tmp_path, spans):
    import torch

    from memkern import Reranker

    assert telemetry.enabled()
    s = MemoryStore(tmp_path / "s", dim=8)
    rng = np.random.default_rng(0)
    ids = s.add_batch("user-1", ["a", "b", "c"], rng.standard_normal((3, 8)).astype(np.float32))
    s.search("user-1", rng.standard_normal((2, 8)).astype(np.float32), k=2)
    s.update(int(ids[0]), summary="a2")
    with pytest.raises(MemkernKeyError):
        s.delete(123456)
    rr = Reranker(8, top_m=2)
    q = torch.randn(1, 8)
    sel = rr.select(q, torch.randn(1, 4, 8), seed=0)
    rr.update(sel, torch.tensor([[1.0, -1.0]]))
    s.close()
    got = {sp.name: sp for sp in spans.get_finished_spans()}
    for name in ["memkern.store.add_batch", "memkern.store.search", "memkern.store.update", "memkern.store.delete",
                 "memkern.reranker.select", "memkern.reranker.update"]:
        assert name in got, (name, sorted(got))
    sp = got["memkern.store.search"]
    assert sp.attributes["memkern.namespace"] == "user-1"
    assert sp.attributes["memkern.k"] == 2 and sp.attributes["memkern.queries"] == "(2, 8)"
    assert got["memkern.store.add_batch"].attributes["memkern.summaries"] == 3
    assert got["memkern.reranker.select"].attributes["memkern.q"] == "(1, 8)"
    bad = got["memkern.store.delete"]
    assert bad.status.status_code.name == "ERROR"
    assert any(ev.name == "exception" for ev in bad.events)
    assert got["memkern.store.search"].instrumentation_scope.name == "memkern"
    # no memory text in any attribute
    for sp in got.values():
        assert all("a2" != v for v in sp.attributes.values())


def test_span_context_manager_and_nesting(spans):
    with telemetry.span("memkern.test.outer", turns=3, shape=np.zeros((2, 5))) as outer:
        assert outer is not None
        with telemetry.span("memkern.test.inner"):
            pass
    got = {sp.name: sp for sp in spans.get_finished_spans()}
    assert got["memkern.test.inner"].parent.span_id == got["memkern.test.outer"].context.span_id
    assert got["memkern.test.outer"].attributes["memkern.turns"] == 3
    assert got["memkern.test.outer"].attributes["memkern.shape"] == "(2, 5)"


def test_model_calls_are_traced():
    from memkern import models

    assert getattr(models.Embedder.encode, "__memkern_traced__", None) == "memkern.embedder.encode"
    assert getattr(models.ChatModel.generate, "__memkern_traced__", None) == "memkern.chat.generate"


def _per_call(fn, n=20000, rounds=5):
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn(1)
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def test_noop_path_costs_about_nothing():
    def plain(x):
        return x

    # API installed, spans off (this check runs before or after the SDK tests: force "off")
    wrapped = telemetry.traced("memkern.test.cost", args=("x",))(plain)
    was = telemetry.enabled
    telemetry.enabled = lambda: False
    try:
        overhead = _per_call(wrapped) - _per_call(plain)
    finally:
        telemetry.enabled = was
    assert overhead < 1e-6, f"no-op span check costs {overhead * 1e6:.2f} us per call"
    # the real check when no provider is set (fresh interpreter): enabled() reads the global provider
    code = (
        "import time\nfrom memkern.base import telemetry\n"
        "def plain(x): return x\n"
        "w = telemetry.traced('memkern.t', args=('x',))(plain)\n"
        "def per(f, n=20000):\n"
        "    b = 1e9\n"
        "    for _ in range(5):\n"
        "        t0 = time.perf_counter()\n"
        "        for _ in range(n): f(1)\n"
        "        b = min(b, (time.perf_counter() - t0) / n)\n"
        "    return b\n"
        "print(per(w) - per(plain), telemetry.enabled())\n"
    )
    cost, on = _run(code).split()
    assert on == "False" and float(cost) < 1e-6, cost
    # with MEMKERN_OTEL=0 (or no opentelemetry installed) the decorator returns the function itself
    out = _run("from memkern.base import telemetry\n"
               "def f(x): return x\n"
               "print(telemetry.traced('memkern.t')(f) is f, telemetry.enabled())", {"MEMKERN_OTEL": "0"})
    assert out == "True False"


def test_without_opentelemetry_installed_everything_is_a_noop(tmp_path):
    # hide the package: memkern must import, trace nothing and run normally
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'opentelemetry' or name.startswith('opentelemetry.'):\n"
        "            raise ImportError('hidden for the test')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import numpy as np, memkern\n"
        "from memkern.base import telemetry; from memkern import store\n"
        "s = memkern.MemoryStore(%r, dim=4)\n"
        "s.add('a', 'x', np.ones(4, np.float32))\n"
        "with telemetry.span('memkern.x') as sp: pass\n"
        "print(telemetry._trace is None, sp, hasattr(store.MemoryStore.search, '__wrapped__'))\n"
    ) % str(tmp_path / "s")
    assert _run(code) == "True None False"

