"""Memories are private: every directory a store creates is 0700 and every file it writes 0600
(log, snapshot files, CURRENT, LOCK, the sharded store's manifests), whatever the umask allows."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

from memkern.store import MemoryStore

D = 8


@pytest.fixture
def open_umask():
    old = os.umask(0o022)  # the usual umask: without explicit modes, files would be 0644, folders 0755
    yield
    os.umask(old)


def _modes(root: Path) -> dict[str, int]:
    out = {".": stat.S_IMODE(root.stat().st_mode)}
    for p in root.rglob("*"):
        out[str(p.relative_to(root))] = stat.S_IMODE(p.stat().st_mode)
    return out


def _check_private(root: Path) -> dict[str, int]:
    modes = _modes(root)
    bad = {}
    for name, m in modes.items():
        want = 0o700 if (root / name).is_dir() else 0o600
        if m != want:
            bad[name] = oct(m)
    assert not bad, f"not private: {bad}"
    return modes


def test_every_file_and_folder_of_a_store_is_private(tmp_path, open_umask):
    p = tmp_path / "s"
    rng = np.random.default_rng(0)
    s = MemoryStore(p, dim=D, snapshot_every=0, flat_limit=4)  # a namespace past flat_limit: an HNSW file too
    s.add_batch("big", [f"r{i}" for i in range(10)], rng.standard_normal((10, D)).astype(np.float32))
    s.add("small", "x", rng.standard_normal(D).astype(np.float32))
    _check_private(p)                       # log, LOCK
    s.snapshot()
    modes = _check_private(p)               # + CURRENT, the snapshot folder and its files
    assert "CURRENT" in modes and any(n.startswith("snap-") for n in modes)
    s.add("small", "y", rng.standard_normal(D).astype(np.float32))
    s.close()                               # the snapshot close writes
    _check_private(p)
    with MemoryStore(p) as s2:
        assert s2.count("big") == 10 and s2.count("small") == 2
        s2.compact()
    _check_private(p)


def test_sharded_store_manifests_are_private(tmp_path, open_umask):
    from memkern.distributed.sharded.layout import write_json_atomic

    f = tmp_path / "manifest.json"
    write_json_atomic(f, {"format": 1})
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    write_json_atomic(f, {"format": 2})  # replacing keeps it private
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
