"""memkern.base.atomic: the one atomic durable write (temp -> fsync -> rename -> fsync folder, mode 0600),
and that the reranker state, a user's learned memory, survives a kill or a failure at every step."""
from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
import textwrap

import pytest
import torch

from memkern.base import atomic
from memkern.base.atomic import atomic_path, atomic_write, temp_files

D = 8


def _leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name)


def test_steps_in_order_and_mode(tmp_path, monkeypatch):
    """The file is fsynced before the rename and the folder after it; the file is 0600."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"))
        return real_fsync(fd)

    def replace(a, b):
        events.append(("rename", os.path.basename(b)))
        return real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    old = os.umask(0)  # the mode is exactly 0600 whatever the umask
    try:
        atomic_write(tmp_path / "a.bin", b"payload")
    finally:
        os.umask(old)
    assert events == [("fsync", "file"), ("rename", "a.bin"), ("fsync", "dir")]
    assert (tmp_path / "a.bin").read_bytes() == b"payload"
    assert stat.S_IMODE((tmp_path / "a.bin").stat().st_mode) == 0o600
    events.clear()
    with atomic_path(tmp_path / "b.bin") as tmp:
        tmp.write_bytes(b"by path")  # a writer that needs a path (recreating the file is fine)
    assert events == [("fsync", "file"), ("rename", "b.bin"), ("fsync", "dir")]
    assert (tmp_path / "b.bin").read_bytes() == b"by path"
    assert stat.S_IMODE((tmp_path / "b.bin").stat().st_mode) == 0o600
    atomic_write(tmp_path / "c.txt", "text ✓", mode=0o644)
    assert (tmp_path / "c.txt").read_text(encoding="utf-8") == "text ✓"
    assert stat.S_IMODE((tmp_path / "c.txt").stat().st_mode) == 0o644
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("fail", ["fsync", "write", "writer"])
def test_failure_never_leaves_a_torn_file(tmp_path, monkeypatch, fail):
    """A failed fsync, a failed write (full disk) or a failing writer: the old file stays, whole,
    and no temporary file is left."""
    target = tmp_path / "state.pt"
    atomic_write(target, b"old state")

    def boom(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    if fail == "fsync":
        monkeypatch.setattr(os, "fsync", boom)
        data = b"new state"
    elif fail == "write":
        def data(f):
            f.write(b"half of the new st")
            boom()
    else:
        def data(f):
            raise RuntimeError("writer failed")
    with pytest.raises((OSError, RuntimeError)):
        atomic_write(target, data)
    assert target.read_bytes() == b"old state"
    assert _leftovers(tmp_path) == []


def test_full_disk_rlimit_leaves_the_old_file(tmp_path):
    """A real short write: RLIMIT_FSIZE makes the kernel refuse the bytes past 4 KiB (EFBIG), as a
    full disk refuses them; the old file stays whole and nothing is left beside it."""
    target = tmp_path / "big.bin"
    target.write_bytes(b"old")
    code = textwrap.dedent(f"""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
        from memkern.base.atomic import atomic_write
        try:
            atomic_write({str(target)!r}, b"x" * 100_000)
        except OSError as e:
            print("refused", e.errno)
            sys.exit(0)
        print("written")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "refused"
    assert target.read_bytes() == b"old"
    assert _leftovers(tmp_path) == []


_KILL = textwrap.dedent("""
    import os, signal, sys
    import torch
    from memkern import Reranker; from memkern.base import atomic
    path, point = sys.argv[1], sys.argv[2]
    new = Reranker({D}, seed=1)
    with torch.no_grad():
        new.Wq.fill_(0.25)
    def hook(at, p):
        if at == point:
            os.kill(os.getpid(), signal.SIGKILL)
    atomic._test_hook = hook
    new.save(path)
    print("saved")
""").replace("{D}", str(D))


@pytest.mark.slow
@pytest.mark.parametrize("point", ["written", "synced", "renamed"])
def test_reranker_state_survives_a_kill_between_write_and_rename(tmp_path, point):
    """SIGKILL at each step of ``Reranker.save``: before the rename the old state loads whole,
    after it the new one does; never a torn or missing file."""
    from memkern import Reranker

    path = tmp_path / "rerankers" / "u.pt"
    old = Reranker(D, seed=0)
    with torch.no_grad():
        old.Wq.fill_(-0.5)
    old.save(path)
    out = subprocess.run([sys.executable, "-c", _KILL, str(path), point], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == -9, (out.returncode, out.stderr[-2000:])
    got = Reranker.load_checked(path, D)
    want = -0.5 if point in ("written", "synced") else 0.25
    assert torch.equal(got.Wq, torch.full((D, D), want))
    left = temp_files(path)
    assert len(left) == (0 if point == "renamed" else 1)  # a killed write leaves only its temp file
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_feedback_save_is_atomic_and_private(tmp_path, monkeypatch):
    """RMM's reranker and reward-buffer saves go through the helper (file fsynced before rename)."""
    import numpy as np

    from fakes_rmm import HashEmbedder
    from memkern import RMM, MemoryStore

    calls = []
    real = atomic.atomic_write

    def spy(path, data, **kw):
        calls.append(os.path.basename(os.fspath(path)))
        return real(path, data, **kw)

    monkeypatch.setattr(atomic, "atomic_write", spy)
    import memkern.score.reranker as rr_mod
    import memkern.loops.rmm.feedback as fb_mod

    monkeypatch.setattr(rr_mod, "atomic_write", spy)
    monkeypatch.setattr(fb_mod, "atomic_write", spy)
    emb = HashEmbedder(16)
    with MemoryStore(tmp_path / "s", dim=16) as st:
        st.add("u", "x", np.ones(16, np.float32))
        rmm = RMM(st, embedder=emb, namespace="u")
        _ = rmm.reranker
        rmm._buffer = []
        rmm.save()
        assert calls == ["u.pt"]
        folder = tmp_path / "s" / "rerankers"
        assert stat.S_IMODE((folder / "u.pt").stat().st_mode) == 0o600
