"""Where memkern writes: the default store, the cache root (converted models, eval embeddings),
and the checks that keep every path built from a user-given name (a namespace) inside its folder."""
from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import MemkernTypeError, bad_arg


def cache_dir(*parts: str) -> Path:
    """``$MEMKERN_CACHE/<parts>``, else ``$XDG_CACHE_HOME/memkern/<parts>``, else
    ``~/.cache/memkern/<parts>`` (not created here)."""
    root = os.environ.get("MEMKERN_CACHE")
    if root:
        return Path(root).expanduser().joinpath(*parts)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base.joinpath("memkern", *parts)


def default_store_path() -> Path:
    """The embedded default store, the one definition used by ``MemoryStore(path=None)`` and the
    CLI: ``$MEMKERN_STORE`` if set, else ``$XDG_DATA_HOME/memkern/default`` (``~/.local/share/
    memkern/default`` when ``XDG_DATA_HOME`` is unset)."""
    env = os.environ.get("MEMKERN_STORE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "memkern" / "default"


# ----------------------------------------------------------------------------- namespace names
#: Allowed namespace names: 1-128 characters of ASCII letters, digits and ``_ - . @ :``, not
#: starting with ``.`` and without ``..`` (so a name is always one plain file-name component:
#: never a path, never hidden, never ``.``/``..``). The reranker files of a namespace are
#: ``<store>/rerankers/<name>.pt`` / ``<name>.buffer.pt``.
NAMESPACE_PATTERN = r"[A-Za-z0-9_@:-][A-Za-z0-9_.@:-]{0,127}"
_NAMESPACE_RE = re.compile(NAMESPACE_PATTERN)


def check_namespace(name: object, arg: str = "namespace") -> str:
    """Return ``name`` if it is a valid namespace name (:data:`NAMESPACE_PATTERN`, no ``..``),
    else raise :class:`~memkern.MemkernValueError` (:class:`~memkern.MemkernTypeError` for a
    non-str) naming ``arg``.

    The one check of namespace names: every command and every piece of code that builds a file
    path from a namespace calls it before building the path.
    """
    if not isinstance(name, str):
        raise bad_arg(arg, "a namespace name (str)", type(name).__name__, MemkernTypeError)
    if not _NAMESPACE_RE.fullmatch(name) or ".." in name:
        raise bad_arg(arg, "a namespace name of 1-128 characters from A-Z a-z 0-9 _ - . @ :, "
                      "not starting with '.' and without '..'", name)
    return name


def path_in(root: str | os.PathLike, *parts: str, arg: str = "path") -> Path:
    """``root/parts...`` after checking that it resolves (symbolic links followed) inside ``root``.

    Every path that memkern writes or deletes inside a store folder is built with this, so no
    file outside the folder is ever touched, whatever the names or links in it. Raises
    :class:`~memkern.MemkernValueError` naming ``arg`` otherwise.
    """
    base = os.path.realpath(os.fspath(root))
    for p in parts:
        if not isinstance(p, str) or not p or "\x00" in p:
            raise bad_arg(arg, "non-empty path components without NUL", p)
    target = os.path.realpath(os.path.join(base, *parts))
    if os.path.commonpath([base, target]) != base or target == base:
        raise bad_arg(arg, f"a path inside {base}", target)
    return Path(target)


#: The files a namespace owns under ``<store>/rerankers/`` (state, pending rewards, a damaged
#: state moved aside, and the temporary files older versions wrote through).
RERANKER_SUFFIXES = (".pt", ".buffer.pt", ".pt.damaged", ".pt.tmp", ".buffer.pt.tmp")


def reranker_file(store_path: str | os.PathLike, namespace: str, suffix: str = ".pt") -> Path:
    """``<store_path>/rerankers/<namespace><suffix>``: the namespace checked first
    (:func:`check_namespace`), the result checked to resolve inside ``store_path``
    (:func:`path_in`)."""
    ns = check_namespace(namespace)
    if suffix not in RERANKER_SUFFIXES:
        raise bad_arg("suffix", f"one of {RERANKER_SUFFIXES}", suffix)
    return path_in(store_path, "rerankers", ns + suffix, arg="namespace")


# ----------------------------------------------------------------------------- outside the store
def _is_store_dir(d: str) -> bool:
    return os.path.isfile(os.path.join(d, "CURRENT")) or os.path.isfile(os.path.join(d, "wal.log"))


def _identity(p: str) -> tuple[int, int] | None:
    try:
        st = os.stat(p)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def check_outside_stores(target: str | os.PathLike, store: str | os.PathLike | None = None,
                         arg: str = "path", *, folder: bool = False) -> Path:
    """``target`` as a :class:`~pathlib.Path` if writing a file there cannot touch a store's files,
    else a :class:`~memkern.MemkernValueError` naming ``arg``.

    Refused: a path inside the folder of ``store`` (symbolic links resolved; folders and files
    compared by device and inode, so case folding, bind mounts and hard links to a store file are
    caught), a path inside any other memkern store folder (one holding ``CURRENT`` or
    ``wal.log``), and an existing directory (with ``folder=True``, ``target`` is a folder to
    create or replace, e.g. an import's new store: only the folders above it are checked).
    """
    raw = os.fspath(target)
    if not isinstance(raw, str) or not raw or "\x00" in raw:
        raise bad_arg(arg, "a file path without NUL characters", raw)
    path = Path(raw).expanduser()
    if folder:
        path = Path(os.path.abspath(path))
    elif path.is_dir():
        raise bad_arg(arg, "a file path (not a directory)", str(path))
    dirs: set = set()
    files: set = set()
    root = None
    if store is not None:
        root = os.path.realpath(os.fspath(store))
        for here, _subdirs, names in os.walk(root):
            ident = _identity(here)
            if ident is not None:
                dirs.add(ident)
            for n in names:
                ident = _identity(os.path.join(here, n))
                if ident is not None:
                    files.add(ident)
    why = f"a path outside the store folder {root}" if root else "a path outside every memkern store folder"
    # The folder the file would land in, and every folder above it (the real ones).
    starts = {os.path.realpath(str(path.parent)), str(path.absolute().parent)}
    if not folder:
        starts.add(os.path.dirname(os.path.realpath(str(path))))  # where a link at `path` points
    for start in starts:
        here = start
        while True:
            if _identity(here) in dirs or (os.path.isdir(here) and _is_store_dir(here)):
                raise bad_arg(arg, why + (" (a store is never created inside another)" if folder else
                                          " (export never writes into a store)"), str(path))
            up = os.path.dirname(here)
            if up == here:
                break
            here = up
    if os.path.lexists(path):
        if _identity(str(path)) in files:
            raise bad_arg(arg, why + " (it is a store file, or a link to one)", str(path))
        real = os.path.realpath(str(path))
        if root is not None and os.path.commonpath([root, real]) == root:
            raise bad_arg(arg, why + " (a link into the store)", str(path))
    return path
