"""Type stubs of the native module ``memkern._store`` (built from ``csrc/``).

Use :class:`memkern.MemoryStore`; this layer expects validated, C-contiguous float32 input.
"""
import enum

import numpy as np
import numpy.typing as npt

# The enums are pybind11 enums (int-valued; ``.name`` gives "topic", "active", "merge", ...).
class Level(enum.IntEnum):
    """Index level of a record: a topic, or a turn linked to its topic."""

    topic = 0
    turn = 1

class Status(enum.IntEnum):
    active = 0
    invalidated = 1

class Op(enum.IntEnum):
    """How a version of a record came to be."""

    add = 0
    merge = 1
    update = 2

class StoredRecord:
    """A copy of one record's current state (read-only; stored text is decoded on access)."""

    @property
    def id(self) -> int: ...
    @property
    def namespace(self) -> str: ...
    @property
    def level(self) -> Level: ...
    @property
    def parent(self) -> int: ...  # topic id of a turn record, -1 for a topic
    @property
    def status(self) -> Status: ...
    @property
    def version(self) -> int: ...
    @property
    def op(self) -> Op: ...
    @property
    def created_at(self) -> float: ...
    @property
    def updated_at(self) -> float: ...
    @property
    def event_time(self) -> float | None: ...  # unix seconds; None: no event time
    @property
    def summary(self) -> str: ...
    @property
    def turns_json(self) -> str: ...
    @property
    def meta_json(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def children(self) -> list[int]: ...  # turn record ids of a topic, oldest first
    @property
    def embedding(self) -> npt.NDArray[np.float32]: ...  # [dim], a fresh copy on every access

class StoredVersion:
    """One version of a record (read-only; ``Store.history`` lists them, oldest first)."""

    @property
    def version(self) -> int: ...
    @property
    def op(self) -> Op: ...
    @property
    def updated_at(self) -> float: ...
    @property
    def summary(self) -> str: ...
    @property
    def turns_json(self) -> str: ...
    @property
    def meta_json(self) -> str: ...
    @property
    def embedding(self) -> npt.NDArray[np.float32]: ...  # [dim]

class Store:
    # An open MemoryStore's instance is its public ``MemoryStore.native`` property.
    simd_kernel: str  # distance kernel picked at load time: "avx512", "avx2+fma" or "scalar" (env MEMKERN_SIMD=avx2 / scalar caps it)
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
        id_base: int = 0,  # the ids this store hands out: [id_base, id_end) (not stored)
        id_end: int = 2**63 - 1,
    ) -> None: ...
    @staticmethod
    def in_memory(
        dim: int,
        metric: str,
        M: int = 16,
        ef_construction: int = 200,
        num_threads: int = 1,
        flat_limit: int = 2**24,
        id_base: int = 0,
        id_end: int = 2**63 - 1,
    ) -> Store: ...  # the same engine with persistence off: no directory, log, snapshot or lock
    @staticmethod
    def open_read_only(path: str | bytes, dim: int = 0, metric: str = "", num_threads: int = 1) -> Store: ...
    # a read-only view while another process may write: no LOCK, nothing written, writes raise ValueError
    def refresh(self) -> int: ...  # log entries applied since the last refresh; -1: reopen; 0 for a writer
    @property
    def read_only(self) -> bool: ...
    @property
    def in_memory_mode(self) -> bool: ...  # True for a Store.in_memory(...) (its path is "")
    @property
    def next_id(self) -> int: ...  # the id the next add gets
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
    def commit_groups(self) -> int: ...  # group commits under fsync "always" (one fdatasync each)
    @property
    def grouped_writes(self) -> int: ...  # the writes those groups held
    @property
    def poisoned(self) -> str: ...  # why writes are refused until a reopen ("" if they are not)
    @property
    def log_files(self) -> list[str]: ...  # the log chain, oldest first (the last one takes the appends)
    @property
    def last_snapshot_stats(self) -> dict[str, float]: ...  # lock hold times and sizes of the last snapshot
    def add(
        self,
        namespace: str,
        summaries: list[str],
        turns_json: list[str],
        metas_json: list[str],
        embeddings: npt.NDArray[np.float32],
        levels: npt.NDArray[np.uint8],  # Level values, one per row
        parents: npt.NDArray[np.int64],
        event_times: npt.NDArray[np.float64] = ...,  # [n] unix seconds, NaN = none; empty = none for all
    ) -> npt.NDArray[np.int64]: ...
    def new_version(
        self,
        id: int,
        op: Op,  # Op.merge or Op.update
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
    def import_records(  # records with their own ids, histories and timestamps; one atomic log entry
        self,
        namespace: str,
        ids: npt.NDArray[np.int64],
        levels: npt.NDArray[np.uint8],
        parents: npt.NDArray[np.int64],  # -1 for a topic; a turn's topic (in the namespace or earlier here)
        statuses: npt.NDArray[np.uint8],  # 0 active, 1 invalidated
        reasons: list[str],
        created_at: npt.NDArray[np.float64],
        updated_at: npt.NDArray[np.float64],
        event_times: npt.NDArray[np.float64],  # NaN = none
        versions: list[list[tuple[int, str, str, str, float]]],  # per record, oldest first: (op, summary, turns_json, meta_json, updated_at)
        embeddings: npt.NDArray[np.float32],  # [sum of versions, dim], in the order of `versions`
    ) -> None: ...
    # distinct values of a top-level meta key among a namespace's records at `level` (the derived meta index)
    def meta_values(self, namespace: str, key: str, level: int = 0) -> list[str | float | bool]: ...
    def invalidate(self, id: int, reason: str) -> None: ...
    def delete(self, id: int) -> list[int]: ...
    def contains(self, id: int) -> bool: ...
    def get(self, id: int) -> StoredRecord: ...
    def get_batch(self, ids: npt.NDArray[np.int64]) -> list[StoredRecord]: ...
    def history(self, id: int) -> list[StoredVersion]: ...  # oldest first, the current version last
    def embeddings(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]: ...
    def search(
        self,
        namespace: str,
        queries: npt.NDArray[np.float32],
        k: int,
        ef: int,
        include_invalidated: bool,
        level: Level,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]: ...
    # Lexical / hybrid search, filters, time range, recency prior (MemoryStore.search validates).
    # mode 0 dense, 1 lexical, 2 hybrid; fusion 0 rrf, 1 weighted, 2 coverage (memkern/fusion.h); clauses: [(key, sorted canonical
    # values as bytes)] (memkern/filter.h); time_field 0 event, 1 created, 2 updated; half_life 0 = no prior.
    def search_ex(
        self,
        namespace: str,
        queries: npt.NDArray[np.float32],
        texts: list[str],
        k: int,
        ef: int,
        include_invalidated: bool,
        level: Level,
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
    # Two-level search with a first stage (mode / fusion / filter / recency as in search_ex) and
    # context terms (TurnSearchSpec in memkern/store.h); group_key "" : the topic is the group.
    def search_turn_topic_ex(
        self,
        namespace: str,
        queries: npt.NDArray[np.float32],
        texts: list[str],
        k: int,
        ef: int,
        include_invalidated: bool,
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
        alpha: float,
        neighbour_weight: float,
        group_weight: float,
        group_key: str,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]: ...
    def parents(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]: ...  # topic id of each record, -1 for topics
    def namespaces(self) -> list[str]: ...
    def ids(self, namespace: str, include_invalidated: bool, level: Level) -> npt.NDArray[np.int64]: ...
    def count(self, namespace: str, include_invalidated: bool, level: Level) -> int: ...
    def flush(self) -> None: ...
    def snapshot(self) -> None: ...
    def snapshot_async(self) -> None: ...  # hand a snapshot to the background thread, return at once
    def compact(self) -> None: ...
    def wait_snapshot(self) -> None: ...  # until the background snapshot in progress (if any) ends
    def close(self) -> None: ...
    def memory_bytes(self) -> int: ...
    # "flat" (exact scan), "hnsw", or "" when the namespace has no index at that level.
    def index_kind(self, namespace: str, level: Level) -> str: ...

def all_finite(a: npt.NDArray[np.float32]) -> bool: ...  # C-contiguous float32: no NaN / inf (the query check)
def stored_rows_ok(a: npt.NDArray[np.float32]) -> bool: ...  # non-empty, finite, every row's norm <= max_norm

# The reranker's fused CPU path (csrc/score/rerank.cpp; called by memkern.score.ops.native).
def rerank_kernel() -> str: ...  # "avx512", "avx2+fma" or "scalar"
def rerank_philox(seed: int, offset: int) -> float: ...  # Philox4x32-10 uniform (triton.language.rand's bits)
def rerank_select(
    q: npt.NDArray[np.float32], Wq: npt.NDArray[np.float32], Wm: npt.NDArray[np.float32],
    dense: npt.NDArray[np.float32] | None, table: npt.NDArray[np.float32] | None, ids: npt.NDArray[np.int64] | None,
    mask: npt.NDArray[np.bool_] | None, prior: npt.NDArray[np.float32] | None, K: int, m: int, tau: float, seed: int,
    offset: int, greedy: bool, plackett_luce: bool,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32], npt.NDArray[np.float32], npt.NDArray[np.float32],
           npt.NDArray[np.float32] | None, float]: ...  # idx, logp, scores, q', drawn scores, |Wq|^2 + |Wm|^2
def rerank_step(
    Wq: npt.NDArray[np.float32], Wm: npt.NDArray[np.float32], q: npt.NDArray[np.float32],
    dense: npt.NDArray[np.float32] | None, table: npt.NDArray[np.float32] | None, ids: npt.NDArray[np.int64] | None,
    mask: npt.NDArray[np.bool_] | None, idx: npt.NDArray[np.int64], R: npt.NDArray[np.float32],
    prior: npt.NDArray[np.float32] | None, qp_cached: npt.NDArray[np.float32] | None,
    s_cached: npt.NDArray[np.float32] | None, w_sq_cached: float, pick: npt.NDArray[np.int64] | None,
    replay_size: int, replay_len: int, replay_seed: int, replay_draws: int, ring: tuple | None, use_P: bool,
    write_ring: bool, rpos: int, baseline_mode: int, baseline: float, running: npt.NDArray[np.float32] | None,
    running_first: bool, momentum: float, normalize: bool, tau: float, plackett_luce: bool,
    gWq: npt.NDArray[np.float32], gWm: npt.NDArray[np.float32], apply: bool, clip: float, lr: float, decay: float,
    max_norm: float, scale: bool, win: npt.NDArray[np.float32] | None, loss: npt.NDArray[np.float32] | None = None,
) -> tuple[float, float, float, float, float, bool, bool, float]: ...  # grad_norm, adapter_norm, baseline, n_pos, n_valid, finite, grads_written, loss

# Test-only hooks (csrc/include/memkern/io.h); not part of the API.
def _test_set_fault(spec: str) -> None: ...  # "write|short|fsync|rename:N[+]", comma-separated; "" = off
def _test_io_counters() -> dict[str, int]: ...  # writes, syncs, renames, faults, sync_ns (process-wide)
def _test_set_lexical(on: bool) -> None: ...  # derived BM25 + meta indexes maintained (bench_lexical.py)
def _test_snapshot_gate(point: str) -> None: ...  # hold the next snapshot at "created" / "rotated" / "copied" / "written" / "switched"
def _test_wait_snapshot_gate(timeout_s: float) -> bool: ...  # whether a snapshot reached the gate in time
def _test_release_snapshot_gate() -> None: ...
# The store's C++ tokeniser (twin of memkern.store.reference.tokenize; tests). Invalid UTF-8 bytes raise.
def _tokenize(text: str | bytes, keep_stop_words: bool = False) -> list[str]: ...
