"""The one atomic, durable file write: every file memkern writes goes through :func:`atomic_write`.

Steps: create a unique temporary file beside the target (mode ``0600`` unless asked otherwise),
write it, ``fsync`` it, ``rename`` it over the target, ``fsync`` the folder. A reader therefore
sees the old file or the new one, never a torn one; once the call returns the new file survives a
crash or power loss. Any failure (a full disk, a failed ``fsync``, an interrupt) removes the
temporary file and leaves the target as it was; a kill leaves at worst a ``.<name>.tmp-*`` file
beside it, which nothing reads.

``_test_hook``: tests set it to a callable ``hook(point, path)`` called at ``"written"`` (data
written, not yet fsynced), ``"synced"`` (fsynced, before the rename) and ``"renamed"`` (before the
folder fsync), to inject a kill or a failure between the steps.
"""
from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

__all__ = ["atomic_write", "atomic_path", "append_durably", "private_dir", "fsync_dir", "temp_files", "FILE_MODE"]

#: Mode of the files memkern writes (a user's memory is readable by that user only).
FILE_MODE = 0o600

_test_hook: Callable[[str, Path], None] | None = None


def _hook(point: str, path: Path) -> None:
    if _test_hook is not None:
        _test_hook(point, path)


def fsync_dir(path: str | os.PathLike) -> None:
    """``fsync`` a folder (makes a rename or a new file in it durable)."""
    fd = os.open(os.fspath(path), os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


def temp_files(path: str | os.PathLike) -> list[Path]:
    """Temporary files a killed :func:`atomic_write` of ``path`` may have left beside it."""
    path = Path(path)
    return sorted(path.parent.glob(f".{glob_escape(path.name)}.tmp-*")) if path.parent.is_dir() else []


def glob_escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def atomic_write(path: str | os.PathLike, data: bytes | str | Callable[[BinaryIO], Any], *,
                 mode: int = FILE_MODE) -> Path:
    """Replace ``path`` with new content, atomically and durably (module docstring).

    Parameters
    ----------
    path : str or os.PathLike
        The target; its folder must exist.
    data : bytes, str (written as UTF-8) or callable
        The content, or ``write(f)`` that writes it to the binary file object ``f`` (e.g.
        ``lambda f: torch.save(obj, f)``). Its return value is ignored.
    mode : int
        Permission bits of the new file (default ``0o600``).

    Returns
    -------
    pathlib.Path
        ``path``.
    """
    path = Path(path)
    tmp = _temp_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)  # exactly `mode`, whatever the umask
            if callable(data):
                data(f)
            else:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            _hook("written", path)
            os.fsync(f.fileno())
        _commit(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, mode: int = FILE_MODE) -> Iterator[Path]:
    """A temporary file path beside ``path`` for a writer that needs a path (e.g.
    ``torch.onnx.export``); on leaving the block the file is fsynced, renamed over ``path`` and
    the folder fsynced. An exception inside the block removes the temporary file."""
    path = Path(path)
    tmp = _temp_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode)
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        yield tmp
        os.chmod(tmp, mode)  # the writer may have recreated the file
        fd = os.open(tmp, os.O_RDONLY)
        try:
            _hook("written", path)
            os.fsync(fd)  # the fsync of any descriptor flushes the file
        finally:
            os.close(fd)
        _commit(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def private_dir(path: str | os.PathLike) -> None:
    """Create the folder ``path`` (mode ``0700``) if it is missing, durably (its parent fsynced)."""
    if not os.path.isdir(path):
        os.makedirs(path, mode=0o700, exist_ok=True)
        fsync_dir(os.path.dirname(os.path.abspath(path)))


def append_durably(path: str | os.PathLike, data: bytes) -> None:
    """Append ``data`` to ``path`` (created with mode ``0600``, its folder with :func:`private_dir`)
    and fsync it, and its folder when the file is new, before returning. One ``write`` call: a
    crash leaves at worst a torn last record, which readers skip."""
    folder = os.path.dirname(os.path.abspath(path))
    private_dir(folder)
    new = not os.path.exists(path)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    if new:  # the new file's directory entry
        fsync_dir(folder)


def _commit(tmp: Path, path: Path) -> None:
    """Rename the fsynced ``tmp`` over ``path`` and fsync the folder."""
    _hook("synced", path)
    os.replace(tmp, path)
    _hook("renamed", path)
    fsync_dir(path.parent)
