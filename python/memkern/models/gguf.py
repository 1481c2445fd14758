"""GGUF conversion: a ``.gguf`` chat model de-quantised and saved once as a transformers folder
in the model cache (:func:`convert_gguf`), under a file lock, renamed into place."""
from __future__ import annotations

import contextlib
import json as _json
import logging
import os
import shutil
import time
from pathlib import Path

from ..errors import bad_arg, require
from .paths import (SMOLLM2_CACHE_NAME, SMOLLM2_TOKENIZER_CACHE_NAME, _SOURCE_MARKER, _cached_folder_ok, _file_lock,
                    _gguf_source_info, _transformers_progress, default_chat_gguf_path, model_cache_dir)

log = logging.getLogger("memkern")

__all__ = ["convert_gguf", "default_chat_model_path", "default_tokenizer_path"]


#: how many times :func:`convert_gguf` had gguf parse a file (one per conversion; a test counts them)
GGUF_PARSES = 0


@contextlib.contextmanager
def _one_gguf_parse():
    """Share one ``gguf.GGUFReader`` per file while this block runs.

    transformers parses the file anew for the tokenizer, the config and the weights; each parse of
    SmolLM2's 49k-token vocabulary takes ~6 s in gguf's Python field reader, most of the conversion.
    The reader is read-only (a memory map), so the three loads can share it."""
    import gguf as gguf_pkg

    original, readers = gguf_pkg.GGUFReader, {}

    def shared_reader(path, mode="r"):
        global GGUF_PARSES
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = original(path, mode)
            GGUF_PARSES += 1
        return readers[key]

    gguf_pkg.GGUFReader = shared_reader
    try:
        yield
    finally:
        gguf_pkg.GGUFReader = original


def convert_gguf(gguf: str | os.PathLike, name: str | None = None, progress: bool = True,
                 tokenizer_only: bool = False) -> Path:
    """Convert a GGUF chat model once into a transformers folder in :func:`model_cache_dir`.

    The quantised weights are de-quantised to float32 by transformers (``gguf_file=...``), copied
    into a plain model built from the same config and written with ``save_pretrained`` (the
    GGUF-loaded model itself refuses to serialise). Conversion runs under a file lock and writes to
    a temporary folder renamed into place, so concurrent callers convert once and never see a
    half-written folder. Later calls return the cached folder at once.

    Parameters
    ----------
    gguf : path of the ``.gguf`` file.
    name : cache sub-folder name (default: the file's stem, lower-cased).
    progress : show progress messages/bars (conversion takes ~20-40 s on one CPU core).
    tokenizer_only : convert only the tokenizer (~8 s), e.g. for :func:`tiny_chat_model`.

    Returns
    -------
    Path of the converted folder (loadable with ``from_pretrained``).
    """
    gguf = Path(gguf).expanduser()
    if not gguf.is_file():
        raise bad_arg("gguf", "an existing .gguf file", str(gguf))
    info = _gguf_source_info(gguf)
    name = name or gguf.stem.lower()
    folder = model_cache_dir() / name
    if _cached_folder_ok(folder, info, need_model=not tokenizer_only):
        return folder
    with _file_lock(model_cache_dir() / f".{name}.lock"):
        if _cached_folder_ok(folder, info, need_model=not tokenizer_only):
            return folder
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        require("models", "torch", "transformers", "gguf", feature="converting a GGUF chat model")
        from transformers import AutoModelForCausalLM, AutoTokenizer

        what = "tokenizer of " if tokenizer_only else ""
        msg = f"memkern: converting {what}{gguf.name} once into {folder} (later loads take ~1 s)"
        log.info(msg)
        if progress:
            print(msg, flush=True)
        t0 = time.perf_counter()
        tmp = folder.parent / f"{folder.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            with _transformers_progress(progress), _one_gguf_parse():
                tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
                tok.save_pretrained(str(tmp))
                if not tokenizer_only:
                    q = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                             local_files_only=True)
                    cfg = q.config
                    if hasattr(cfg, "quantization_config"):
                        delattr(cfg, "quantization_config")
                    plain = AutoModelForCausalLM.from_config(cfg)
                    plain.load_state_dict(q.state_dict(), strict=True)
                    plain.save_pretrained(str(tmp))
                    del q, plain
                (tmp / _SOURCE_MARKER).write_text(_json.dumps(info, indent=1))
                if folder.exists():
                    shutil.rmtree(folder)
                os.replace(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        msg = f"memkern: converted {gguf.name} in {time.perf_counter() - t0:.1f} s"
        log.info(msg)
        if progress:
            print(msg, flush=True)
    return folder


def default_chat_model_path(progress: bool = True) -> Path:
    """Folder of the converted default chat model (converting it once if needed)."""
    return convert_gguf(default_chat_gguf_path(), name=SMOLLM2_CACHE_NAME, progress=progress)


def default_tokenizer_path(progress: bool = True) -> Path:
    """Folder holding the SmolLM2 tokenizer (the converted model's folder when it exists)."""
    gguf = default_chat_gguf_path()
    full = model_cache_dir() / SMOLLM2_CACHE_NAME
    if _cached_folder_ok(full, _gguf_source_info(gguf)):
        return full
    return convert_gguf(gguf, name=SMOLLM2_TOKENIZER_CACHE_NAME, progress=progress, tokenizer_only=True)
