"""Shared helpers of the RMM commands (demo, ingest, ask, inspect, forget)."""
from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any

from ..errors import MemkernValueError, bad_arg

log = logging.getLogger("memkern")

DEFAULT_DIM = 384  # all-MiniLM-L6-v2, the offline default embedder


def default_store_path() -> Path:
    """The embedded default store: ``$MEMKERN_STORE`` if set, else the store's own default
    (:func:`memkern.store.default_store_path`, ``$XDG_DATA_HOME/memkern/default``)."""
    env = os.environ.get("MEMKERN_STORE")
    if env:
        return Path(env).expanduser()
    from ..store import default_store_path as store_default

    return Path(store_default())


def add_store_args(p, namespace: str | None = "default") -> None:
    p.add_argument("--store", metavar="PATH", default=None,
                   help=f"store directory (default: $MEMKERN_STORE or {default_store_path()})")
    if namespace is not None:
        p.add_argument("--namespace", "-n", default=namespace, help=f"memory namespace (default: {namespace})")


def add_model_args(p) -> None:
    p.add_argument("--chat-model", default=None, metavar="ID_OR_PATH",
                   help="chat model folder or id (default: the offline SmolLM2-135M-Instruct)")
    p.add_argument("--embedder", default=None, metavar="ID_OR_PATH",
                   help="embedding model folder or id (default: the offline all-MiniLM-L6-v2)")
    p.add_argument("--seed", type=int, default=0, help="seed of reranker sampling and generation")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: half the cores, 1 to 4; small models on busy "
                        "machines run much faster with few threads)")
    p.add_argument("--retrieval", choices=("topic", "turn+topic"), default="topic",
                   help="memory unit retrieved: topics (the paper's) or turns scored with their topic "
                        "(two-level memory; stores every turn as its own record)")
    p.add_argument("--alpha", type=float, default=1.0,
                   help="weight of the topic score in --retrieval turn+topic (default 1.0)")


def rmm_retrieval_kwargs(args) -> dict:
    """The RMM keyword arguments chosen by --retrieval / --alpha."""
    return {"retrieval": args.retrieval, "alpha": args.alpha}


def store_path(args) -> Path:
    return Path(args.store).expanduser() if getattr(args, "store", None) else default_store_path()


def open_store(path: Path, dim: int | None = DEFAULT_DIM, create: bool = True):
    """Open (or create with ``dim``) the store at ``path``."""
    from ..store import MemoryStore

    path = Path(path)
    exists = path.exists() and any(path.iterdir())
    if not exists and not create:
        raise bad_arg("--store", "an existing memkern store directory", str(path))
    if exists:
        return MemoryStore(path=str(path))
    return MemoryStore(path=str(path), dim=dim, metric="cos")


def namespace_ids(store, namespace: str) -> list[int]:
    from ..rmm import _namespace_ids

    return _namespace_ids(store, namespace)


def reset_namespace(store, namespace: str, compact: bool = True) -> int:
    """Delete every record of ``namespace`` (all versions, turns) and its reranker files, then
    compact the store so the deleted data leaves its files; returns the records deleted."""
    ids = namespace_ids(store, namespace)
    for i in ids:
        store.delete(int(i))
    if ids and compact and hasattr(store, "compact"):
        store.compact()
    store.flush()
    if getattr(store, "path", None):
        d = Path(store.path) / "rerankers"
        for name in (f"{namespace}.pt", f"{namespace}.buffer.pt"):
            f = d / name
            if f.exists():
                f.unlink()
    return len(ids)


def set_threads(args) -> int:
    """Pin torch's CPU threads (``--threads``, default ``clamp(cores // 2, 1, 4)``)."""
    import torch

    n = getattr(args, "threads", None) or max(1, min(4, (os.cpu_count() or 1) // 2))
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
    """Sessions from a JSON file, as ``[{"session_id", "date", "turns"}]``.

    Accepted layouts:

    - the bundled format: ``{"sessions": [{"session_id", "date", "turns": [...]}]}``;
    - a list of sessions, each a list of turns ``{"role", "content"}`` or a session dict;
    - LongMemEval: a list of questions with ``haystack_sessions`` (+ ``haystack_session_ids``,
      ``haystack_dates``); sessions shared by several questions are kept once, in order;
    - LoCoMo: samples with ``conversation`` holding ``session_N`` / ``session_N_date_time``
      (speaker ``speaker_a`` is taken as the user).
    """
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    out: list[dict[str, Any]] = []

    def add(turns, sid=None, date=None):
        if not isinstance(turns, list):
            raise MemkernValueError(f"{path}: expected a session as a list of turns, got {type(turns).__name__}")
        clean = []
        for t in turns:
            if not isinstance(t, dict):
                raise MemkernValueError(f"{path}: expected turn dicts, got {type(t).__name__}")
            if "content" not in t and "text" in t:
                t = dict(t, content=t["text"])
            if "role" not in t:
                t = dict(t, role="user")
            clean.append(t)
        out.append({"session_id": str(sid) if sid is not None else f"s{len(out) + 1}", "date": date, "turns": clean})

    if isinstance(data, dict) and isinstance(data.get("sessions"), list):
        for s in data["sessions"]:
            if isinstance(s, dict):
                add(s.get("turns", []), s.get("session_id"), s.get("date"))
            else:
                add(s)
        return out
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise bad_arg("FILE", "a JSON list of sessions or a {'sessions': [...]} object", type(data).__name__)
    if data and isinstance(data[0], dict) and "haystack_sessions" in data[0]:
        seen = set()
        for q in data:
            sids = q.get("haystack_session_ids") or [None] * len(q["haystack_sessions"])
            dates = q.get("haystack_dates") or [None] * len(q["haystack_sessions"])
            for sess, sid, date in zip(q["haystack_sessions"], sids, dates):
                key = sid if sid is not None else json.dumps(sess, sort_keys=True)[:2000]
                if key in seen:
                    continue
                seen.add(key)
                add([{"role": t.get("role", "user"), "content": t.get("content", "")} for t in sess], sid, date)
        return out
    if data and isinstance(data[0], dict) and "conversation" in data[0]:
        for sample in data:
            conv = sample["conversation"]
            a = conv.get("speaker_a")
            keys = sorted((k for k in conv if k.startswith("session_") and not k.endswith("date_time")),
                          key=lambda k: int(k.split("_")[1]) if k.split("_")[1].isdigit() else 0)
            for k in keys:
                turns = [{"role": "user" if t.get("speaker") == a else "assistant", "content": t.get("text", ""),
                          "dia_id": t.get("dia_id")} for t in conv[k]]
                add(turns, f"{sample.get('sample_id', 'c')}:{k}", conv.get(f"{k}_date_time"))
        return out
    for s in data:
        if isinstance(s, dict) and "turns" in s:
            add(s["turns"], s.get("session_id"), s.get("date"))
        else:
            add(s)
    return out


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
