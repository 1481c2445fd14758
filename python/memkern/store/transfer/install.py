"""The atomic import of an export file (:func:`import_store`; format: :mod:`memkern.store.transfer`).

Atomicity: a failure or a kill at any point leaves the target as it was, at worst with a
``.<name>.import-*`` directory beside it (removable; never read).

* A new store (the path is absent or an empty directory): the whole store (records, a snapshot,
  the reranker files) is built in a hidden directory beside the target, fsynced and renamed into
  place.
* An existing store: the file's namespaces are *added* (a namespace the store already holds, or
  has reranker files for, is refused: an import never merges into a namespace). With the store
  held open (its lock keeps every other writer out), its files are copied beside it, the import
  goes into the copy, and the two directories are swapped in one step
  (``renameat2(RENAME_EXCHANGE)``, Linux); the old one is then removed. This costs a copy of the
  store. The store must not be open elsewhere (its lock is taken).
* An :class:`~memkern.InMemoryStore` that has never been written: the records are built into a
  fresh one that replaces its content in one step.

Ids: a new store takes the file's ids exactly (its ids are assigned in order, so the import fills
the id gaps left by deleted records with placeholder records that it deletes and compacts away);
should the gaps outnumber the records by far (more than ``4 * records + 4096``), ids are
renumbered in the file's order instead and every link (``topic_id``, ``turn_ids``) follows the
map, which :func:`import_store` returns. An existing store numbers the imported records after
its own (renumbered, links following).

What a round trip keeps exactly: namespaces, ids (see above), levels and topic <-> turn links,
``event_time``,
every version (number, op, summary, turns, meta, embedding bits), status and invalidation reason,
and the reranker files. (Metric ``"cos"``: a store normalises what it is given, so the import
gives it, for each unit vector, an input that normalises back to the same bits; the rare vector
with no such input, counted in ``ImportResult.inexact_vectors``, lands one ulp away.) What it does not: ``created_at`` / ``updated_at`` are the store's own
clock (a store sets them when a record is written), so imported records carry the import time;
the exported values stay in the file.
"""
from __future__ import annotations

import io
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...base.atomic import atomic_write, fsync_dir
from ...base.paths import check_outside_stores, reranker_file
from ...errors import MemkernError, MemkernTypeError, bad_arg
from ..engine import MemoryStore
from .format import RERANKER_FILES
from .parse import ParsedExport, parse
from .write import embed_missing, exact_inputs, write_records

__all__ = ["import_store", "ImportResult"]


@dataclass
class ImportResult:
    """What :func:`import_store` wrote.

    Attributes
    ----------
    records : int
        Records written (topic and turn records).
    namespaces : list of str
    id_map : dict[int, int]
        File id -> store id (the identity unless the ids had to be renumbered).
    renumbered : bool
    rerankers : list of str
        Reranker files written (``<namespace>.pt`` / ``<namespace>.buffer.pt``); none for an
        InMemoryStore (it keeps no files; ``rerankers_skipped`` lists them).
    path : str or None
    inexact_vectors : int
        Metric "cos" only: vectors stored one ulp away from the file's bits (no float32 input
        normalises to them exactly; about 1 in 500 at d <= 8, none seen at d >= 64).
    """

    records: int
    namespaces: list
    id_map: dict
    renumbered: bool
    rerankers: list
    rerankers_skipped: list
    path: str | None
    inexact_vectors: int = 0


_fsync_dir = fsync_dir


def _write_rerankers(root: Path, parsed: ParsedExport) -> list[str]:
    """The file's (checked) reranker files under ``root/rerankers/``, each by one atomic durable
    write; the store folder fsynced."""
    written = []
    for ns, kind, data in parsed.rerankers:
        p = reranker_file(root, ns, RERANKER_FILES[kind])
        p.parent.mkdir(exist_ok=True)
        atomic_write(p, data)
        written.append(p.name)
    if (root / "rerankers").is_dir():
        fsync_dir(root)
    return written


def _renameat2():
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def _exchange_available() -> None:
    if _renameat2() is None:
        raise MemkernError("store: importing into an existing store swaps two directories atomically "
                           "(renameat2 RENAME_EXCHANGE, Linux), which this system lacks; import into a new path")


def _exchange(a: Path, b: Path) -> None:
    """Swap directories ``a`` and ``b`` in one atomic step (``renameat2(RENAME_EXCHANGE)``)."""
    import ctypes

    at_fdcwd, rename_exchange = -100, 2
    if _renameat2()(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"exchange {a} and {b}: {os.strerror(err)}", str(b))


def _import_into_existing(path: Path, tmp: Path, parsed: ParsedExport, store_kwargs: dict) -> tuple[dict, list]:
    """Add the file's namespaces to the store at ``path``, atomically: with the store held open (its
    lock keeps every other writer out), copy its files beside it, import into the copy (ids
    renumbered after the store's own), then swap the two directories in one step."""
    with MemoryStore(path) as live:
        if (live.dim, live.metric) != (parsed.dim, parsed.metric):
            raise bad_arg("store", f"a store of dim={parsed.dim}, metric={parsed.metric!r} (the file's)",
                          f"dim={live.dim}, metric={live.metric!r} (dim mismatch)" if live.dim != parsed.dim
                          else f"metric={live.metric!r}")
        clash = sorted(set(parsed.namespaces) & set(live.namespaces()))
        clash += [ns for ns in parsed.namespaces if ns not in clash and any(
            _has_reranker(path, ns, suffix) for suffix in RERANKER_FILES.values())]
        if clash:
            raise bad_arg("namespaces", "namespaces the store does not hold yet (an import adds namespaces, it "
                          "never merges into one)", clash)
        if getattr(live.native, "replayed_entries", 0):
            # The copy must be one snapshot, and closing `live` after the swap must write nothing
            # (it would write into the new store's folder): a snapshot now leaves it nothing to do.
            live.snapshot()
        shutil.copytree(path, tmp, ignore=shutil.ignore_patterns("LOCK", "*.tmp"))
        with MemoryStore(tmp, fsync="never", snapshot_every=0, **store_kwargs) as s:
            id_map, _ = write_records(s, parsed, renumber=True)
            s.snapshot()
        written = _write_rerankers(tmp, parsed)
        _exchange(tmp, path)
        _fsync_dir(path.parent)
    return id_map, written


def _has_reranker(root: Path, ns: str, suffix: str) -> bool:
    try:
        return reranker_file(root, ns, suffix).exists()
    except MemkernError:
        return False


def import_store(target: str | os.PathLike | MemoryStore, source: str | os.PathLike | io.TextIOBase, *,
                 embedder: Any = None, **store_kwargs: Any) -> ImportResult:
    """Import an export file (:func:`export_store`) into a new store, atomically.

    Parameters
    ----------
    target : str, os.PathLike or InMemoryStore
        A store directory: new (absent or empty; built beside it and renamed into place) or an
        existing store (the file's namespaces are added to a copy that is swapped in). Or an
        :class:`~memkern.InMemoryStore` that was never written to. See the module docstring.
    source : str, os.PathLike or text file object
        The JSON Lines file.
    embedder : Embedder, optional
        Needed for a file written without embeddings: every version's text is embedded
        (``kind="passage"``).
    store_kwargs
        Passed to :class:`~memkern.MemoryStore` (e.g. ``M``, ``ef_construction``) for a path.

    Returns
    -------
    ImportResult

    Raises
    ------
    MemkernValueError / MemkernTypeError
        The file fails a check (named by line and field; nothing was written), or the target is
        not a new store.
    """
    from ..memory import InMemoryStore

    if isinstance(target, InMemoryStore):
        n = target.native
        if n.next_id != 0 or target._id_range is not None:
            raise bad_arg("target", "an InMemoryStore without id_range that was never written to (import builds a "
                          "new store)", f"one holding ids up to {n.next_id - 1}" if n.next_id else
                          f"one with id_range={target._id_range}")
        parsed = parse(source)
        if parsed.dim != target.dim or parsed.metric != target.metric:
            raise bad_arg("target", f"a store of dim={parsed.dim}, metric={parsed.metric!r} (the file's)",
                          f"dim={target.dim}, metric={target.metric!r} (dim mismatch)" if parsed.dim != target.dim
                          else f"metric={target.metric!r}")
        embed_missing(parsed, embedder)
        inexact = exact_inputs(parsed)
        fresh = InMemoryStore(parsed.dim, parsed.metric, **target._options)
        id_map, renumbered = write_records(fresh, parsed)
        target._native, fresh._native = fresh._native, None  # one step: the target shows all of it or none
        return ImportResult(len(parsed.records), parsed.namespaces, id_map, renumbered, [],
                            [f"{ns}{RERANKER_FILES[k]}" for ns, k, _ in parsed.rerankers], None, inexact)
    if isinstance(target, MemoryStore):
        raise bad_arg("target", "a path for a new store or an empty InMemoryStore (import never writes into an "
                      "open store)", repr(target))
    if not isinstance(target, (str, os.PathLike)):
        raise bad_arg("target", "a store directory path or an InMemoryStore", type(target).__name__,
                      MemkernTypeError)
    path = check_outside_stores(target, arg="store", folder=True)
    existing = path.is_dir() and ((path / "CURRENT").exists() or (path / "wal.log").exists())
    if path.exists() and not existing and (not path.is_dir() or any(path.iterdir())):
        raise bad_arg("store", "a memkern store directory, or a new one (absent or empty)", str(path))
    if existing:
        _exchange_available()
    parsed = parse(source)
    embed_missing(parsed, embedder)
    inexact = exact_inputs(parsed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.import-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        if existing:
            id_map, written = _import_into_existing(path, tmp, parsed, store_kwargs)
            renumbered = True
        else:
            with MemoryStore(tmp, dim=parsed.dim, metric=parsed.metric, fsync="never", snapshot_every=0,
                             **store_kwargs) as s:
                id_map, renumbered = write_records(s, parsed)
                s.snapshot()  # everything durable in one snapshot before the rename
            written = _write_rerankers(tmp, parsed)
            os.rename(tmp, path)  # atomic; replaces an empty directory
            _fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if existing:
        shutil.rmtree(tmp, ignore_errors=True)  # the store as it was before (swapped out); never read
    return ImportResult(len(parsed.records), parsed.namespaces, id_map, renumbered, written, [], str(path), inexact)
