"""Shared helpers of the RMM commands (demo, ingest, ask, inspect, forget)."""
from __future__ import annotations

import argparse
import logging
import math
import os
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any

from ..errors import MemkernError, MemkernKeyError, bad_arg
from ..base.paths import check_namespace, default_store_path

#: The namespace rule, as the help texts show it (:data:`memkern.base.paths.NAMESPACE_PATTERN`).
NAMESPACE_RULE = "1-128 characters of A-Z a-z 0-9 _ - . @ :, not starting with '.', no '..'"

log = logging.getLogger("memkern")

DEFAULT_DIM = 384  # all-MiniLM-L6-v2, the offline default embedder




# ------------------------------------------------------------------------- argument types
# Each is an argparse ``type=``: a rejected value is a usage error (exit 2) naming the argument,
# raised before the command opens or creates anything.


def _arg_type(fn):
    """Wrap ``fn(text)`` so a memkern error becomes argparse's ``ArgumentTypeError`` (argparse then
    names the argument itself)."""
    def parse(text: str):
        try:
            return fn(text)
        except MemkernError as e:
            msg = str(e)
            raise argparse.ArgumentTypeError(msg.split(": ", 1)[1] if msg.startswith("value: ") else msg) from None
    parse.__name__ = fn.__name__
    return parse


@_arg_type
def turn_template(text: str) -> str:
    """A turn template pattern (:class:`memkern.text.template.TurnTemplate`), checked when parsed."""
    from ..text.template import TurnTemplate

    return TurnTemplate(text).template


@_arg_type
def namespace_name(text: str) -> str:
    """A namespace name (:func:`memkern.base.paths.check_namespace`: the one check of namespace names)."""
    return check_namespace(text, "value")


def _int(text: str, lo: int, what: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise bad_arg("value", what, text) from None
    if v < lo:
        raise bad_arg("value", what, text)
    return v


positive_int = _arg_type(lambda text: _int(text, 1, "an integer >= 1"))
positive_int.__name__ = "positive_int"
nonneg_int = _arg_type(lambda text: _int(text, 0, "an integer >= 0"))
nonneg_int.__name__ = "nonneg_int"


def _float(text: str, lo: float | None = None, hi: float | None = None, open_lo: bool = False) -> float:
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    ok = math.isfinite(v) and (lo is None or (v > lo if open_lo else v >= lo)) and (hi is None or v <= hi)
    if not ok:
        rng = "" if lo is None else (f" > {lo}" if open_lo else f" >= {lo}")
        rng += "" if hi is None else f" and <= {hi}"
        raise bad_arg("value", f"a finite number{rng}", text)
    return v


finite_float = _arg_type(lambda text: _float(text))
finite_float.__name__ = "finite_float"
positive_float = _arg_type(lambda text: _float(text, 0.0, open_lo=True))
positive_float.__name__ = "positive_float"
probability = _arg_type(lambda text: _float(text, 0.0, 1.0))
probability.__name__ = "probability"


@_arg_type
def input_file(text: str) -> str:
    """An existing regular file (read later by a loader that validates its content)."""
    p = Path(text).expanduser()
    if not p.exists():
        raise bad_arg("value", "an existing file", text)
    if not p.is_file():
        raise bad_arg("value", "a file", f"{text} (a directory)" if p.is_dir() else text)
    return str(p)


@_arg_type
def input_path(text: str) -> str:
    """An existing file or folder (read later by a loader that validates its content)."""
    p = Path(text).expanduser()
    if not p.exists():
        raise bad_arg("value", "an existing file or folder", text)
    return str(p)


@_arg_type
def nonempty_text(text: str) -> str:
    if not text.strip():
        raise bad_arg("value", "a non-empty text", text)
    return text


def add_store_args(p, namespace: str | None = "default") -> None:
    p.add_argument("--store", metavar="PATH", default=None,
                   help=f"store directory (default: $MEMKERN_STORE or {default_store_path()})")
    if namespace is not None:
        p.add_argument("--namespace", "-n", default=namespace, type=namespace_name,
                       help=f"memory namespace (default: {namespace}; {NAMESPACE_RULE})")


def add_model_args(p) -> None:
    p.add_argument("--chat-model", default=None, metavar="ID_OR_PATH",
                   help="chat model folder or id (default: the offline SmolLM2-135M-Instruct)")
    p.add_argument("--embedder", default=None, metavar="ID_OR_PATH",
                   help="embedding model folder or id (default: the offline all-MiniLM-L6-v2)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="seed of reranker sampling and generation")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch CPU threads (default: half the cores, 1 to 4; small models on busy "
                        "machines run much faster with few threads)")
    p.add_argument("--retrieval", choices=("auto", "topic", "turn+topic"), default="auto",
                   help="memory unit retrieved: 'auto' (default: turns scored with their topic, two-level "
                        "memory, on the MemoryStore), 'topic' (the paper's) or 'turn+topic'")
    p.add_argument("--alpha", type=finite_float, default=None,
                   help="weight of the topic score in two-level retrieval (default: RMMConfig's, 0.5)")
    p.add_argument("--template", default=None, type=turn_template,
                   help="turn template: how turns are embedded and shown (default '[{date}] {speaker}: {content}')")


def rmm_retrieval_kwargs(args) -> dict:
    """The RMM keyword arguments chosen by --retrieval / --alpha / --template."""
    kw = {"retrieval": args.retrieval}
    if getattr(args, "alpha", None) is not None:
        kw["alpha"] = args.alpha
    if getattr(args, "template", None) is not None:
        kw["template"] = args.template
    return kw


def store_path(args) -> Path:
    return Path(args.store).expanduser() if getattr(args, "store", None) else default_store_path()


def store_exists(path: Path) -> bool:
    """Whether ``path`` holds a memkern store (``--store`` naming a file is a usage error)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise bad_arg("--store", "a store directory", f"{path} (not a directory)")
    return path.is_dir() and any(path.iterdir())


def open_store(path: Path, dim: int | None = DEFAULT_DIM, create: bool = True, read_only: bool = False):
    """Open (or create with ``dim``) the store at ``path``; ``read_only``: an existing store as a
    reader, beside a process that may hold it for writing (``MemoryStore(read_only=True)``)."""
    from ..store.engine import MemoryStore

    path = Path(path)
    exists = store_exists(path)
    if not exists and (not create or read_only):
        raise bad_arg("--store", "an existing memkern store directory", str(path))
    if read_only:
        return MemoryStore(path=str(path), read_only=True)
    if exists:
        store = MemoryStore(path=str(path))
        if dim is not None and create and store.dim != dim:
            store.close()
            raise bad_arg("--embedder", f"an embedder of the store's dimension {store.dim} (store {path})", dim)
        return store
    return MemoryStore(path=str(path), dim=dim, metric="cos")


def get_record(store, rid: int, arg: str = "--id"):
    """``store.get(rid)``, an unknown id reported as a usage error naming ``arg``."""
    try:
        return store.get(rid)
    except KeyError:
        raise bad_arg(arg, f"the id of a record in {store.path}", rid, MemkernKeyError) from None


def set_threads(args, all_cores: bool = False) -> int:
    """Pin torch's CPU threads (``--threads``; default ``clamp(cores // 2, 1, 4)``, or
    ``clamp(cores, 1, 8)`` with ``all_cores``, as the server uses: its embedder batches concurrent
    requests and its idle model threads sleep)."""
    import torch

    cores = os.cpu_count() or 1
    n = getattr(args, "threads", None) or (max(1, min(8, cores)) if all_cores else max(1, min(4, cores // 2)))
    torch.set_num_threads(int(n))
    return int(n)


def build_models(args, need_chat: bool = True):
    """(chat_model, embedder) from the CLI options (None = offline default, built lazily)."""
    from ..models import ChatModel, Embedder

    set_threads(args)
    emb = Embedder(args.embedder) if getattr(args, "embedder", None) else Embedder()
    chat = None
    if need_chat:
        chat = ChatModel(args.chat_model) if getattr(args, "chat_model", None) else ChatModel()
    return chat, emb


def load_sessions(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Sessions from a JSON file, as ``[{"session_id", "date", "turns"}]``: the one session loader,
    :func:`memkern.data.sessions.load_sessions` (which validates the whole file first)."""
    from ..data.sessions import load_sessions as load

    return load(path)


def sample_conversation_path() -> Path:
    """The bundled sample conversation (package data)."""
    from importlib import resources

    return Path(str(resources.files("memkern") / "data" / "sample_conversation.json"))


def progress_bar(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="session", disable=not enabled, file=sys.stderr, leave=True)


def wrap(text: str, width: int = 100, indent: str = "    ") -> str:
    return textwrap.fill(" ".join(str(text).split()), width=width, initial_indent=indent, subsequent_indent=indent)


def print_bank(rmm, out=None, width: int | None = None, history: bool = False) -> None:
    """Print the memory bank of ``rmm``'s namespace (id, version, status, sessions, summary)."""
    out = out or sys.stdout
    width = width or max(60, min(140, shutil.get_terminal_size((100, 20)).columns))
    bank = rmm.inspect()
    active = sum(1 for r in bank if r["status"] == "active")
    print(f"Memory bank of namespace {rmm.namespace!r}: {len(bank)} records ({active} active)", file=out)
    print(f"  {'id':>4} {'ver':>3} {'status':<11} {'sessions':<14} summary", file=out)
    for r in bank:
        sess = ",".join(str(s) for s in r["sessions"])[:14]
        head = f"  {r['id']:>4} {r['version']:>3} {r['status']:<11} {sess:<14} "
        room = max(20, width - len(head))
        summ = r["summary"] if len(r["summary"]) <= room else r["summary"][: room - 3] + "..."
        print(head + summ, file=out)
        if history and r["version"] > 1 and hasattr(rmm.store, "history"):
            for old in rmm.store.history(r["id"])[:-1]:
                print(f"  {'':>4} v{getattr(old, 'version', '?'):<2} {'(previous)':<11} {'':<14} "
                      f"{str(old.summary)[: room - 3]}", file=out)


def print_response(resp, rmm, out=None, expected: str | None = None) -> None:
    out = out or sys.stdout
    print(f"  answer: {resp.answer or '(empty)'}", file=out)
    if expected:
        print(f"  expected: {expected}", file=out)
    if resp.memory_ids:
        for i, mid in enumerate(resp.memory_ids):
            mark = "cited" if i in resp.citations else "     "
            summ = rmm.store.get(mid).summary
            print(f"    [{i}] {mark} #{mid}: {summ[:90] + ('...' if len(summ) > 90 else '')}", file=out)
    else:
        print("    (no memories in this namespace)", file=out)
    t = resp.timings
    print("  timings (ms): " + ", ".join(f"{k} {t[k] * 1000:.1f}" for k in ("embed", "retrieve", "rerank", "generate", "update") if k in t), file=out)
