"""Type stubs of the native module ``memkern._store`` (built from ``csrc/``).

Use :class:`memkern.MemoryStore`; this layer expects validated, C-contiguous float32 input.
"""
from typing import Any

import numpy as np
import numpy.typing as npt

class Store:
    simd_kernel: str  # distance kernel picked at load time: "avx2+fma" or "scalar"
    pad_score: float  # score beside -1 padding ids (lowest finite float32)
    # Limits checked (overflow-safe) before anything is allocated; MemoryStore checks the same.
    max_k: int  # 2**20
    max_ef: int  # 2**20
    max_candidates: int  # 2**20
    max_results: int  # 2**26 result slots (B * k) per call
    max_norm: float  # 1e18: largest L2 norm of a stored vector or a query
    max_alpha: float  # 100: largest |alpha| of search_turn_topic
    default_flat_limit: int  # 1024
    max_flat_limit: int  # 2**24
    def __init__(
        self,
        path: str | bytes,
        dim: int,
        metric: str,
        M: int,
        ef_construction: int,
        fsync: str,
        fsync_interval_s: float,
        snapshot_every: int,
        num_threads: int = 1,
        flat_limit: int = 1024,
    ) -> None: ...
    @property
    def dim(self) -> int: ...
    @property
    def metric(self) -> str: ...
    @property
    def M(self) -> int: ...
    @property
    def ef_construction(self) -> int: ...
    @property
    def path(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    @property
    def generation(self) -> int: ...
    @property
    def replayed_entries(self) -> int: ...
    @property
    def recovered_torn_tail(self) -> bool: ...
    @property
    def store_id(self) -> int: ...  # random id in CURRENT and the log header (0: an old store, until its next snapshot)
    @property
    def last_snapshot_error(self) -> str: ...  # why the last automatic snapshot failed ("" if none)
    @property
    def snapshot_failures(self) -> int: ...
    @property
    def poisoned(self) -> str: ...  # why writes are refused until a reopen ("" if they are not)
    def add(
        self,
        namespace: str,
        summaries: list[str],
        turns_json: list[str],
        metas_json: list[str],
        embeddings: npt.NDArray[np.float32],
        levels: npt.NDArray[np.uint8],
        parents: npt.NDArray[np.int64],
        event_times: npt.NDArray[np.float64] = ...,  # [n] unix seconds, NaN = none; empty = none for all
    ) -> npt.NDArray[np.int64]: ...
    def new_version(
        self,
        id: int,
        op: int,
        summary: str | None,
        embedding: npt.NDArray[np.float32] | None,
        turns_json: str | None,
        meta_json: str | None,
        child_summaries: list[str],
        child_turns_json: list[str],
        child_metas_json: list[str],
        child_embeddings: npt.NDArray[np.float32],
        replace_children: bool,
        event_time: float | None = None,  # None keeps the record's event time
        child_event_times: npt.NDArray[np.float64] = ...,
    ) -> tuple[int, npt.NDArray[np.int64]]: ...
    def invalidate(self, id: int, reason: str) -> None: ...
    def delete(self, id: int) -> list[int]: ...
    def contains(self, id: int) -> bool: ...
    # Record dicts carry "embedding": a float32 [dim] copy of the current vector, and "event_time"
    # (float or None).
    def get(self, id: int) -> dict[str, Any]: ...
    def get_batch(self, ids: npt.NDArray[np.int64]) -> list[dict[str, Any]]: ...
    def history(self, id: int) -> list[dict[str, Any]]: ...
    def embeddings(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]: ...
    def search(
        self,
        namespace: str,
        queries: npt.NDArray[np.float32],
        k: int,
        ef: int,
        include_invalidated: bool,
        level: int,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]: ...
    # Lexical / hybrid search, filters, time range, recency prior (MemoryStore.search validates).
    # mode 0 dense, 1 lexical, 2 hybrid; fusion 0 rrf, 1 weighted; clauses: [(key, sorted canonical
    # values as bytes)] (memkern/filter.h); time_field 0 event, 1 created, 2 updated; half_life 0 = no prior.
    def search_ex(
        self,
        namespace: str,
        queries: npt.NDArray[np.float32],
        texts: list[str],
        k: int,
        ef: int,
        include_invalidated: bool,
        level: int,
        mode: int,
        fusion: int,
        lexical_weight: float,
        clauses: list[tuple[str, list[bytes]]],
        has_time: bool,
        t_lo: float,
        t_hi: float,
        time_field: int,
        half_life: float,
        recency_weight: float,
        now: float,
        candidates: int,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]: ...
    def search_turn_topic(
        self,
        namespace: str,
        queries: npt.NDArray[np.float32],
        k: int,
        ef: int,
        include_invalidated: bool,
        alpha: float,
        candidates: int,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]: ...
    def namespaces(self) -> list[str]: ...
    def ids(self, namespace: str, include_invalidated: bool, level: int) -> npt.NDArray[np.int64]: ...
    def count(self, namespace: str, include_invalidated: bool, level: int) -> int: ...
    def flush(self) -> None: ...
    def snapshot(self) -> None: ...
    def compact(self) -> None: ...
    def close(self) -> None: ...
    def memory_bytes(self) -> int: ...
    # "flat" (exact scan), "hnsw", or "" when the namespace has no index at that level (0 topic, 1 turn).
    def index_kind(self, namespace: str, level: int) -> str: ...

# Test-only hooks (csrc/include/memkern/io.h); not part of the API.
def _test_set_fault(spec: str) -> None: ...  # "write|short|fsync|rename:N[+]", comma-separated; "" = off
def _test_io_counters() -> dict[str, int]: ...  # writes, syncs, renames, faults (process-wide)
def _test_set_lexical(on: bool) -> None: ...  # derived BM25 + meta indexes maintained (bench_lexical.py)
# The store's C++ tokeniser (twin of memkern.lexical.tokenize; tests). Invalid UTF-8 bytes raise.
def _tokenize(text: str | bytes, keep_stop_words: bool = False) -> list[str]: ...
