"""``memkern ingest FILE``: add dialogue sessions from a JSON file to a store (prospective reflection).

Accepted files: the bundled format (``{"sessions": [{"session_id", "date", "turns"}]}``), a list of
sessions (each a list of ``{"role", "content"}`` turns), LongMemEval (questions with
``haystack_sessions``; shared sessions ingested once) and LoCoMo (``conversation.session_N``).
"""
from __future__ import annotations

import argparse
import os
from collections import Counter

from . import _common as C


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="JSON file of sessions")
    C.add_store_args(p)
    C.add_model_args(p)
    p.add_argument("--extractor", choices=("llm", "embedding"), default="embedding",
                   help="how memories are built: 'embedding' (default: LLM-free topic segmentation and "
                        "similarity-based updates; fast) or 'llm' (the paper's way: the chat model extracts "
                        "topics and decides updates; slow on CPU, best with --chat-model BIGGER_MODEL)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="ingest only the first N sessions")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    sessions = C.load_sessions(args.file)
    if args.limit is not None:
        sessions = sessions[: max(0, args.limit)]
    need_chat = args.extractor == "llm"
    chat, emb = C.build_models(args, need_chat=need_chat)
    path = C.store_path(args)
    store = C.open_store(path, dim=emb.dim)
    try:
        return _run(args, store, path, sessions, chat, emb)
    finally:
        store.close()


def _run(args, store, path, sessions, chat, emb) -> int:
    from ..rmm import RMM

    rmm = RMM(store, chat_model=chat, embedder=emb, namespace=args.namespace, extractor=args.extractor, seed=args.seed,
              **C.rmm_retrieval_kwargs(args))
    bar = C.progress_bar(len(sessions), "ingest", not args.no_progress)
    actions: Counter = Counter()
    for start in range(0, len(sessions), 4):
        chunk = sessions[start : start + 4]
        results = rmm.end_sessions([s["turns"] for s in chunk], [s["session_id"] for s in chunk],
                                   [s.get("date") for s in chunk], progress=lambda _n: bar.update(1))
        for res in results:
            actions.update(r.action for r in res)
    bar.close()
    store.flush()
    print(f"ingested {len(sessions)} sessions into {path} namespace {args.namespace!r}: "
          + ", ".join(f"{a} {actions[a]}" for a in ("ADD", "MERGE", "UPDATE", "INVALIDATE", "NOOP")))
    print(f"namespace now holds {store.count(args.namespace)} active memories")
    return 0
