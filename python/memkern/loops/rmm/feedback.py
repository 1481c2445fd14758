"""RMM's learning stage: citations -> rewards, the reward buffer, its save / load.

The model's answer cites the shown memories by number (:func:`parse_answer`); each cited memory
gets reward ``+1`` and each uncited one ``-1``. Rewards of ``batch_size`` responses are buffered
and fed to ``reranker.update`` at once (:meth:`FeedbackStage.flush`). The reranker state and the
not-yet-used buffer are persisted per namespace under ``<store.path>/rerankers/``
(:func:`memkern.base.paths.reranker_file`), each by one atomic durable write
(:func:`memkern.base.atomic.atomic_write`).

A persisted reranker file that is not a valid reranker of the store's dim (damaged, or written by
something else) never blocks the namespace: it is moved aside to ``<namespace>.pt.damaged`` (kept
for inspection, never read; ``memkern forget`` removes it), a warning is logged, and the namespace
continues with a fresh reranker. An unreadable reward buffer is dropped with a warning.

What the reranker learns from. :meth:`memkern.RMM.respond` shows the reranker's best memories
(``RMMConfig.explore=0``, the default), and the update is REINFORCE on that shown slate under the
reranker's stochastic policy (Plackett-Luce over ``prior + (q'.m' - q.m)`` at ``tau``): a cited
memory is pushed up, an uncited one down, and the probability the uncited ones lose goes to the
candidates that were not shown, in proportion to their probability. So exploration happens
without showing worse memories: a memory leaves the shown set only after it was shown and not
cited, and the next best candidate, never seen yet, takes its place. The model can only cite
what it was shown, so no other slate carries a signal about the unshown candidates: a hidden draw
scored by the shown memories' citations only re-weights the same labels, and importance weights
against the (deterministic) shown slate only shrink them. Showing sampled draws (a share
``RMMConfig.explore`` of the calls, logged as ``Response.explored``) buys labels on lower-ranked
candidates, mostly useless ones, at the price of worse memories for the user. The learning
section of ``bench/RESULTS.md`` measures each of these (``memkern eval memory learning``).

What the learning moves. The reranker scores memories; a turn budget read
(:meth:`memkern.RMM.retrieve` with ``turns=N``) returns turns. Each retrieved turn is scored by its
first-stage score plus its memory's learned residual (the reranker's score minus its prior), so a
memory the citations promoted brings its turns into the budget, and one they demoted gives way.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
from typing import Any, Sequence

import numpy as np

from ...errors import MemkernTypeError, StoreCorruptedError, bad_arg
from ...text.jsonrepair import JSONRepairError, coerce_int, parse_json
from ...base.atomic import atomic_write
from ...base.paths import reranker_file
from .aio import locked

log = logging.getLogger("memkern")

__all__ = ["parse_answer", "FeedbackStage", "default_reranker"]

_MARKER = re.compile(r"\[\s*(\d+(?:\s*,\s*\d+)*)\s*\]")


def parse_answer(text: str, n_memories: int) -> tuple[str, list[int], bool]:
    """Parse a cited answer: JSON ``{"answer", "citations"}`` (repaired) or ``[i]`` markers.

    Parameters
    ----------
    text : str
        Raw model output.
    n_memories : int
        Number of memories shown (valid citations are ``0..n_memories-1``; others dropped).

    Returns
    -------
    (answer, citations, parsed) : tuple[str, list[int], bool]
        ``citations`` sorted and unique; ``parsed`` False when the JSON could not be recovered.
    """
    answer, cites, parsed, _ = _parse_answer(text, n_memories)
    return answer, cites, parsed


def _parse_answer(text: str, n_memories: int) -> tuple[str, list[int], bool, bool]:
    """:func:`parse_answer` (same arguments) plus ``cited_at_all``: whether the output had a
    citations field or ``[i]`` markers at all."""
    answer: str | None = None
    cites: list[int] = []
    parsed = False
    has_field = False
    try:
        value = parse_json(text, dict)
        a = value.get("answer", value.get("response"))
        if a is not None:
            answer = a if isinstance(a, str) else str(a)
            parsed = True
            has_field = any(k in value for k in ("citations", "citation", "sources"))
            raw = value.get("citations", value.get("citation", value.get("sources", [])))
            if not isinstance(raw, list):
                raw = [raw]
            for x in raw:
                if isinstance(x, str) and "," in x:
                    cites += [c for c in (coerce_int(p) for p in x.split(",")) if c is not None]
                else:
                    c = coerce_int(x)
                    if c is not None:
                        cites.append(c)
    except JSONRepairError:
        pass
    if answer is None:
        # No usable JSON: the text before any JSON-looking debris is the answer.
        answer = text.split("{")[0].strip() or text.strip()
    for m in _MARKER.finditer(answer):
        has_field = True
        cites += [int(p) for p in m.group(1).split(",")]
    answer = " ".join(_MARKER.sub("", answer).split())
    cites = sorted({c for c in cites if 0 <= c < n_memories})
    return answer, cites, parsed, has_field


def citation_rewards(cites: Sequence[int], n_shown: int) -> list[float]:
    """Rewards aligned with the ``n_shown`` memories: ``+1`` cited, ``-1`` uncited."""
    return [1.0 if i in cites else -1.0 for i in range(n_shown)]


def default_reranker(dim: int, top_m: int, seed: int = 0, **overrides: Any) -> Any:
    """The fresh reranker an RMM builds for a namespace: ``Reranker.from_preset("rmm", dim,
    top_m=top_m, seed=seed)`` (``overrides``: further :class:`memkern.Reranker` settings).

    The ``"rmm"`` preset is the stable setting with a larger step and a tighter trust region
    (SGD lr 0.2, adapters projected on ``||(Wq, Wm)|| <= 1``) and no replay: a namespace sees few
    citations (each question asked about once or so), and its reranker must learn from them
    without drifting far from the first stage (module doc; measured in ``bench/RESULTS.md``,
    learning section)."""
    from ...score.reranker import Reranker

    return Reranker.from_preset("rmm", dim, top_m=top_m, seed=seed, **overrides)


class FeedbackStage:
    """The reward buffer and reranker persistence of :class:`memkern.RMM` (a mixin: it uses the
    RMM's ``store``, ``namespace``, ``config`` fields and ``_reranker``)."""

    _buffer: list[tuple[Any, np.ndarray]]
    _reranker: Any

    @locked
    def _record_rewards(self, sel: Any, cites: Sequence[int], n_shown: int) -> list[float]:
        """Rewards of one response (:func:`citation_rewards`); buffered with the reranker's
        selection ``sel`` (``None``: nothing was chosen, nothing to learn) and flushed every
        ``batch_size`` responses."""
        rewards = citation_rewards(cites, n_shown)
        self.n_responses += 1
        if sel is not None:
            self._buffer_rewards(sel, np.asarray(rewards, dtype=np.float32))
        return rewards

    @locked
    def _buffer_rewards(self, sel: Any, rewards: np.ndarray) -> None:
        """Buffer one response's draw ``sel`` with its ``rewards`` (float32 ``[M]``); flush every
        ``batch_size`` buffered responses."""
        self._buffer.append((sel, rewards))
        if len(self._buffer) >= self.batch_size:
            self.flush()

    @property
    def pending(self) -> int:
        """Responses whose rewards wait in the buffer."""
        return len(self._buffer)

    @locked
    def feedback(self, response: Any, rewards: Sequence[float]) -> bool:
        """Train the reranker on explicit feedback about an earlier response of this RMM.

        Parameters
        ----------
        response : memkern.loops.rmm.Response
            What :meth:`respond` returned (its ``selection`` is the draw being rewarded).
        rewards : sequence of float
            One reward in ``[-1, 1]`` per memory shown, aligned with ``response.memory_ids``
            (``+1`` useful, ``-1`` not). They are buffered like the citation rewards (the
            response's own citation rewards stay buffered too) and reach ``reranker.update`` at
            the next flush (every ``batch_size`` buffered responses).

        Returns
        -------
        bool
            ``False`` when the response had no reranker choice (every candidate was shown), so
            there is nothing to learn.
        """
        ids = getattr(response, "memory_ids", None)
        if not isinstance(ids, list):
            raise bad_arg("response", "a memkern.loops.rmm.Response", type(response).__name__, MemkernTypeError)
        if (isinstance(rewards, (str, bytes)) or not isinstance(rewards, Sequence) or len(rewards) != len(ids)
                or not all(not isinstance(r, bool) and isinstance(r, (int, float, np.floating)) and -1.0 <= float(r) <= 1.0
                           for r in rewards)):
            raise bad_arg("rewards", f"{len(ids)} numbers in [-1, 1] (one per memory shown)", rewards)
        sel = getattr(response, "selection", None)
        if sel is None:
            return False
        self._buffer_rewards(sel, np.asarray([float(r) for r in rewards], dtype=np.float32))
        return True

    @locked
    def flush(self) -> dict | None:
        """Feed the buffered rewards to ``reranker.update`` now (also called every ``batch_size``)."""
        if not self._buffer:
            return None
        import torch

        sels = [s for s, _ in self._buffer]
        rewards = torch.from_numpy(np.stack([r for _, r in self._buffer]).astype(np.float32))
        sel = _cat_selections(sels)
        stats = self.reranker.update(sel, rewards)
        self._buffer.clear()
        self.n_updates += 1
        self.last_update_stats = dict(stats or {})
        if self.n_updates % self.save_every == 0:
            self.save()
        log.debug("rmm: reranker update %d on %d responses: %s", self.n_updates, rewards.shape[0], self.last_update_stats)
        return self.last_update_stats

    def _reranker_path(self, suffix: str = ".pt") -> str | None:
        path = self.store.path  # Store protocol: None for a store that is not on disk
        if not path or not self.persist:
            return None
        return os.fspath(reranker_file(path, self.namespace, suffix))

    @property
    def reranker(self) -> Any:
        """The namespace's reranker: the one given, the one persisted under
        ``<store.path>/rerankers/``, or a fresh ``Reranker(store.dim, top_m=top_m, seed=seed)``."""
        if self._reranker is None:
            from ...score.reranker import Reranker

            path = self._reranker_path()
            if path and os.path.exists(path):
                try:
                    self._reranker = Reranker.load_checked(path, self.store.dim)
                    log.info("rmm: loaded the reranker of namespace %r from %s", self.namespace, path)
                except StoreCorruptedError as e:
                    damaged = self._reranker_path(".pt.damaged")
                    try:
                        os.replace(path, damaged)
                    except OSError:  # e.g. a read-only store: the next save replaces it
                        damaged = path
                    log.warning("rmm: %s; kept as %s, namespace %r continues with a fresh reranker",
                                e, damaged, self.namespace)
            if self._reranker is None:
                self._reranker = default_reranker(self.store.dim, self.top_m, self.seed)
                log.info("rmm: fresh reranker for namespace %r (dim %d, top_m %d, seed %d)", self.namespace,
                         self.store.dim, self.top_m, self.seed)
        return self._reranker

    def _buffer_path(self) -> str | None:
        return self._reranker_path(".buffer.pt")

    @locked
    def save(self) -> None:
        """Persist the reranker and the pending reward buffer under ``<store.path>/rerankers/``."""
        path = self._reranker_path()
        if path is None:
            return
        import torch

        os.makedirs(os.path.dirname(path), exist_ok=True)
        if self._reranker is not None:
            self._reranker.save(path)  # atomic and durable
        bpath = self._buffer_path()
        if self._buffer:
            data = [(_selection_to_dict(s), torch.as_tensor(np.asarray(r, np.float32))) for s, r in self._buffer]
            atomic_write(bpath, lambda f: torch.save(data, f))
        elif os.path.exists(bpath):
            os.remove(bpath)

    def _load_buffer(self) -> None:
        bpath = self._buffer_path()
        if not bpath or not os.path.exists(bpath):
            return
        from ...score.reranker import read_buffer_bytes

        try:
            with open(bpath, "rb") as f:
                self._buffer = read_buffer_bytes(f.read(), self.store.dim, bpath)
        except Exception as exc:  # a stale buffer must never block the memory
            log.warning("rmm: ignoring unreadable reward buffer %s (%s)", bpath, exc)
            self._buffer = []

    @locked
    def close(self) -> None:
        """Persist the reranker and any pending rewards (call at the end of a process)."""
        if self._buffer or self._reranker is not None:
            self.save()


def _selection_to_dict(sel: Any) -> dict:
    """A :class:`memkern.Selection`'s fields (tensors detached), as ``Selection(**d)`` reloads it."""
    return {f.name: _detach(getattr(sel, f.name)) for f in dataclasses.fields(sel)}


def _detach(v: Any) -> Any:
    return v.detach() if hasattr(v, "detach") else v


def _cat_selections(sels: Sequence[Any]) -> Any:
    """Concatenate per-response :class:`memkern.Selection` s along the batch dimension (tensor
    fields of rank >= 1; the scalar fields of the first)."""
    if len(sels) == 1:
        return sels[0]
    import torch

    first = sels[0]
    values = {}
    for name in (f.name for f in dataclasses.fields(first)):
        vals = [getattr(s, name) for s in sels]
        if isinstance(vals[0], torch.Tensor) and vals[0].dim() >= 1:
            values[name] = torch.cat(vals, 0)
        else:
            values[name] = vals[0]
    return type(first)(**values)
