"""Checks of reranker files read from untrusted bytes (a file given to :meth:`memkern.Reranker.load_checked`,
an imported store's reranker states and reward buffers): loading with ``weights_only=True`` (no code
runs), then the keys, shapes, dtypes and values of a saved state (:func:`check_state_dict`) and of
each item of a saved reward buffer (:func:`check_buffer_item`). Building the reranker from what
passed is :func:`memkern.score.reranker.read_state_bytes` / ``read_buffer_bytes``."""
from __future__ import annotations

import io
import math
import warnings
from dataclasses import fields
from typing import Any

from ..errors import require

require("reranker", "torch", feature="memkern.Reranker")  # names the extra when a package is missing
import torch

from ..errors import MemkernValueError, bad_arg
from .selection import Selection

__all__ = ["load_bytes", "check_state_dict", "check_buffer_item"]

#: Largest replay ring a loaded state may make the trainer allocate (bytes).
_MAX_RING_BYTES = 1 << 30
_STATE_KEYS = frozenset({"Wq", "Wm", "_extra_state"})


def _tensors(obj: Any, limit: int = 1 << 16):
    """Every tensor inside nested dicts / lists / tuples of ``obj`` (iterative; at most ``limit``
    containers and values, else a MemkernValueError)."""
    stack, seen = [obj], 0
    while stack:
        o = stack.pop()
        seen += 1
        if seen > limit:
            raise MemkernValueError(f"more than {limit} values")
        if isinstance(o, torch.Tensor):
            yield o
        elif isinstance(o, dict):
            stack.extend(o.values())
        elif isinstance(o, (list, tuple)):
            stack.extend(o)


def _finite(t: torch.Tensor, allow_neg_inf: bool = False) -> bool:
    if not t.is_floating_point():
        return True
    if allow_neg_inf:
        return bool(torch.all(torch.isfinite(t) | (t == -math.inf)))
    return bool(torch.isfinite(t).all())


def load_bytes(data: bytes, name: str, what: str) -> Any:
    """The object ``torch.load`` reads from ``data`` with ``weights_only=True`` (tensors and plain
    Python values only), on the CPU; MemkernValueError naming ``name`` and ``what`` if it cannot."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise bad_arg(name, f"the bytes of {what}", type(data).__name__)
    try:  # weights_only: tensors and plain Python values only, no code runs
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's notes on odd pickles: the file is refused or read
            return torch.load(io.BytesIO(bytes(data)), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - whatever the unpickler refuses
        raise bad_arg(name, what, f"an unreadable file ({type(e).__name__}: {' '.join(str(e).split())[:120]})") from None


def check_state_dict(sd: Any, dim: int | None, name: str, what: str) -> int:
    """Check a loaded reranker ``state_dict`` (see :func:`memkern.score.reranker.read_state_bytes`)
    and return its ``dim``: exactly the keys ``Wq``, ``Wm``, ``_extra_state``, floating ``[dim, dim]``
    weights, every tensor finite (``-inf`` allowed outside the weights), a replay ring within
    bounds. MemkernValueError naming ``name`` otherwise."""
    if not isinstance(sd, dict) or set(sd) != _STATE_KEYS:
        got = sorted(map(str, sd))[:6] if isinstance(sd, dict) else type(sd).__name__
        raise bad_arg(name, f"{what} with the keys {sorted(_STATE_KEYS)}", got)
    extra = sd["_extra_state"]
    cfg = extra.get("config") if isinstance(extra, dict) else None
    d = cfg.get("dim") if isinstance(cfg, dict) else None
    if isinstance(d, bool) or not isinstance(d, int) or d < 1:
        raise bad_arg(f"{name}['_extra_state']['config']['dim']", "a positive int", type(d).__name__ if not isinstance(d, int) else d)
    if dim is not None and d != dim:
        raise bad_arg(name, f"a reranker of dim {dim} (the store's)", f"dim {d}")
    for key in ("Wq", "Wm"):
        w = sd[key]
        if not isinstance(w, torch.Tensor) or not w.is_floating_point() or tuple(w.shape) != (d, d):
            got = f"{w.dtype} {tuple(w.shape)}" if isinstance(w, torch.Tensor) else type(w).__name__
            raise bad_arg(f"{name}[{key!r}]", f"a floating tensor [{d}, {d}]", got)
    try:
        tensors = list(_tensors(sd))
    except MemkernValueError as e:
        raise bad_arg(name, what, str(e)) from None
    for t in tensors:
        if not _finite(t, allow_neg_inf=True):
            raise bad_arg(name, "finite values", "NaN or inf in a tensor")
    if not (_finite(sd["Wq"]) and _finite(sd["Wm"])):
        raise bad_arg(name, "finite weights", "NaN or inf")
    rp = extra.get("replay")
    cap = cfg.get("replay_capacity", 0)
    if isinstance(rp, dict) and isinstance(cap, int) and not isinstance(cap, bool):
        C, idx = rp.get("C"), rp.get("idx")
        if isinstance(C, torch.Tensor) and isinstance(idx, torch.Tensor) and C.dim() >= 2 and idx.dim() >= 2:
            ring = cap * (d + C.shape[1] * (d + 1) + 2 * idx.shape[1]) * 4
            if ring > _MAX_RING_BYTES:
                raise bad_arg(f"{name}['_extra_state']['config']['replay_capacity']",
                              f"a replay ring of at most {_MAX_RING_BYTES} bytes", f"{ring} bytes")
    return d


_SELECTION_FIELDS = {f.name for f in fields(Selection)}


def check_buffer_item(item: Any, dim: int, where: str) -> tuple[Selection, torch.Tensor, tuple]:
    """Check one loaded reward-buffer item (see :func:`memkern.score.reranker.read_buffer_bytes`):
    a Selection of tensors with ``dim``-d queries and candidates, finite values and rewards in
    [-1, 1] of its shape. Returns ``(selection, rewards, signature)``, the signature being the
    trailing shapes that every item of one buffer must share. MemkernValueError naming ``where``."""
    if not (isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], dict)
            and isinstance(item[1], torch.Tensor)):
        raise bad_arg(where, "a (selection dict, rewards tensor) pair", type(item).__name__)
    d, r = item
    if not set(d) <= _SELECTION_FIELDS:
        raise bad_arg(where, f"selection fields {sorted(_SELECTION_FIELDS)}", sorted(map(str, d))[:6])
    try:
        sel = Selection(**d)
    except TypeError as e:
        raise bad_arg(where, "a complete selection", str(e)) from None
    tens = [getattr(sel, f) for f in ("indices", "scores", "logp", "q", "candidates", "ids", "mask")]
    if any(t is not None and not isinstance(t, torch.Tensor) for t in tens) or not all(
            isinstance(getattr(sel, f), torch.Tensor) for f in ("indices", "scores", "logp", "q", "candidates")):
        raise bad_arg(where, "a selection of tensors", "other values")
    if sel.q.shape[-1:] != (dim,) or sel.candidates.shape[-1:] != (dim,):
        raise bad_arg(where, f"queries and candidates of dim {dim}", (tuple(sel.q.shape), tuple(sel.candidates.shape)))
    if not all(_finite(t, allow_neg_inf=True) for t in tens if t is not None) or not (
            _finite(sel.q) and _finite(sel.candidates)):
        raise bad_arg(where, "finite values", "NaN or inf")
    if not r.is_floating_point() or r.dim() != 1 or tuple(r.shape) != tuple(sel.indices.shape[-1:]) \
            or not bool(((r >= -1) & (r <= 1)).all()):
        raise bad_arg(f"{where} rewards", "float rewards in [-1, 1], one per selected slot", tuple(r.shape))
    sig = tuple((f, None if getattr(sel, f) is None else tuple(getattr(sel, f).shape[1:]))
                for f in ("indices", "scores", "logp", "q", "candidates", "ids", "mask"))
    return sel, r, sig
