"""OpenTelemetry spans around store, reranker and model calls; a no-op without OpenTelemetry.

memkern only *creates* spans, through the OpenTelemetry API (``pip install memkern[otel]`` gives
``opentelemetry-api``). It never configures a tracer provider, an exporter or a collector address:
until the application installs an SDK ``TracerProvider`` with its own exporter, the API's default
provider drops every span and nothing is sent anywhere. Without ``opentelemetry-api`` installed,
:func:`traced` returns the function unchanged and :func:`span` is an empty context manager.

Span names are ``memkern.<object>.<method>`` (``memkern.store.search``, ``memkern.reranker.select``,
``memkern.embedder.encode``, ...), from the tracer ``"memkern"``; attributes hold sizes and
settings only (``memkern.namespace``, ``memkern.k``, ``memkern.batch``, ...), never memory text or
vectors. A call that raises records the exception and sets the span status to ERROR.

Cost: with the API installed and no SDK provider set, a decorated call reads the global provider
once (~0.1-0.3 us) and creates no span; ``MEMKERN_OTEL=0`` in the environment (read at import) turns
even that off. ``tests/base/test_telemetry.py`` measures both.

Usage in memkern's modules (one line per call site)::

    @traced("memkern.store.search", args=("namespace", "k"))
    def search(self, namespace, queries, k=20, ...): ...

    with span("memkern.rmm.respond", turns=len(turns)):
        ...
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import os
import sys
from typing import Any, Callable, Iterator, TypeVar

__all__ = ["traced", "span", "enabled", "tracer"]

F = TypeVar("F", bound=Callable[..., Any])

_INSTRUMENTATION = "memkern"

# The API (``opentelemetry.trace``) is imported only once something else has imported it (an
# application that sets a provider does) or the environment names a provider to load: until then
# no provider can be set, spans are off, and ``import memkern`` does not pay its ~5 ms.
_trace: Any = None
_Proxy: Any = ()
_NoOp: Any = ()
_FAST = False
_OFF = os.environ.get("MEMKERN_OTEL", "1").strip().lower() in ("0", "false", "no", "off")


def _bind() -> bool:
    """Import the API and bind what :func:`enabled` reads; ``False`` when it is missing."""
    global _trace, _Proxy, _NoOp, _FAST
    try:
        from opentelemetry import trace
        from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider
    except ImportError:
        return False
    # The API keeps the global provider in ``trace._TRACER_PROVIDER`` (None until one is set).
    # Reading it directly costs ~0.1 us; ``get_tracer_provider()`` also looks up an environment
    # variable on every call (~1-2 us here). The public call is used when that variable names a
    # provider to load, or when the attribute is missing (another API version).
    _FAST = hasattr(trace, "_TRACER_PROVIDER") and "OTEL_PYTHON_TRACER_PROVIDER" not in os.environ
    _Proxy, _NoOp = ProxyTracerProvider, NoOpTracerProvider
    _trace = trace
    return True


def _api_installed() -> bool:
    try:
        return importlib.util.find_spec("opentelemetry.trace") is not None
    except (ImportError, ValueError):
        return False


if _OFF:
    _API = False
elif "OTEL_PYTHON_TRACER_PROVIDER" in os.environ or "opentelemetry.trace" in sys.modules:
    _API = _bind()
else:
    _API = _api_installed()


def enabled() -> bool:
    """Whether spans can be recorded now: the API is installed and the application has set an SDK
    tracer provider (memkern never sets one)."""
    t = _trace
    if t is None:
        if not _API or "opentelemetry.trace" not in sys.modules or not _bind():
            return False  # (not imported by anyone: no provider can have been set)
        t = _trace
    p = t._TRACER_PROVIDER if _FAST else t.get_tracer_provider()
    return p is not None and not isinstance(p, (_Proxy, _NoOp))


def tracer() -> Any:
    """The ``"memkern"`` tracer of the application's provider, or ``None`` when :func:`enabled` is false."""
    if not enabled():
        return None
    from .version import __version__

    return _trace.get_tracer(_INSTRUMENTATION, __version__)


def _attr(v: Any) -> Any:
    if isinstance(v, (bool, int, float, str)):
        return v
    shape = getattr(v, "shape", None)
    if shape is not None:
        return str(tuple(int(s) for s in shape))
    if isinstance(v, (list, tuple)):
        return len(v)
    return None


@contextlib.contextmanager
def span(name: str, **attributes: Any) -> Iterator[Any]:
    """A span ``name`` with ``attributes`` (``memkern.`` is prefixed to each key) around the block;
    yields the span, or ``None`` when spans are off."""
    t = tracer()
    if t is None:
        yield None
        return
    with t.start_as_current_span(name) as sp:
        for k, v in attributes.items():
            a = _attr(v)
            if a is not None:
                sp.set_attribute(f"memkern.{k}", a)
        yield sp


def traced(name: str, args: tuple[str, ...] = ()) -> Callable[[F], F]:
    """Decorator: run the function inside a span ``name``; ``args`` names parameters recorded as
    attributes (ints, floats, str and bools as they are; arrays as their shape; lists as their
    length). Without the OpenTelemetry API the function is returned unchanged."""

    def deco(fn: F) -> F:
        if not _API:
            return fn
        sig = inspect.signature(fn) if args else None

        @functools.wraps(fn)
        def wrapper(*a: Any, **kw: Any) -> Any:
            if not enabled():
                return fn(*a, **kw)
            t = _trace.get_tracer(_INSTRUMENTATION)
            with t.start_as_current_span(name) as sp:
                if sig is not None:
                    try:
                        bound = sig.bind_partial(*a, **kw).arguments
                    except TypeError:    # the call itself will raise the real error
                        bound = {}
                    for k in args:
                        if k in bound:
                            v = _attr(bound[k])
                            if v is not None:
                                sp.set_attribute(f"memkern.{k}", v)
                return fn(*a, **kw)

        wrapper.__memkern_traced__ = name  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return deco
