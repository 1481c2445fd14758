"""``memkern demo``: RMM end to end on the bundled sample conversation (the package's main job).

Sets up the offline default models on first use, resets the demo namespace of the default
store, ingests the bundled eight-session conversation (prospective reflection, with a progress
bar), prints the memory bank (topics, versions, status) and answers a few questions with their
citations (retrospective reflection; the reranker learns from the citations).
"""
from __future__ import annotations

import argparse
import logging
import os
import time
from collections import Counter

from . import common as C

log = logging.getLogger("memkern")


def configure(p: argparse.ArgumentParser) -> None:
    C.add_store_args(p, namespace="demo")
    C.add_model_args(p)
    p.add_argument("--extractor", choices=("llm", "embedding", "window", "sentences"), default="embedding",
                   help="how memories are built: 'embedding' (default: LLM-free topic segmentation and "
                        "update decisions by similarity; fast and deterministic) or 'llm' (the paper's way: "
                        "the chat model extracts topics and decides updates; slow on CPU, and the 135M "
                        "default model writes poor summaries: use it with --chat-model BIGGER_MODEL)")
    p.add_argument("--sessions", type=C.positive_int, default=None, metavar="N", help="ingest only the first N sessions")
    p.add_argument("--questions", type=C.nonneg_int, default=None, metavar="N", help="ask only the first N questions")
    p.add_argument("--quick", action="store_true", help="shorter run: 4 sessions and 2 questions")
    p.add_argument("--explore", action="store_true",
                   help="let the reranker sample the memories it shows (the paper's exploration) instead of "
                        "showing its top-5 by score")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--file", default=None, metavar="JSON", type=C.input_file, help="another conversation file instead of the bundled one")


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ..data.sessions import load_session_file
    from ..models import setup_default_models

    progress = not args.no_progress
    extractor = args.extractor
    n_questions = args.questions if args.questions is not None else (2 if args.quick else None)
    if args.quick and args.sessions is None:
        args.sessions = 4
    t_start = time.perf_counter()
    # Everything the user gave is checked before models are set up or the store is touched: the
    # namespace (by its argparse type), the store path and the whole conversation file.
    path = C.store_path(args)
    C.store_exists(path)
    conv = load_session_file(args.file or str(C.sample_conversation_path()))

    print("== memkern demo: Reflective Memory Management on a multi-session conversation ==")
    if not (args.chat_model and args.embedder):
        print("Setting up the offline default models (once; later runs reuse the cache)...")
        setup_default_models(progress=progress)
    chat, emb = C.build_models(args)
    store = C.open_store(path, dim=emb.dim)
    try:
        return _run(args, store, path, chat, emb, extractor, n_questions, progress, t_start, conv)
    finally:
        store.close()


def _run(args, store, path, chat, emb, extractor, n_questions, progress, t_start, conv) -> int:
    from ..store.bank import Bank
    from ..loops.rmm import RMM

    removed = Bank(store, args.namespace).reset()
    print(f"Store: {path}  namespace {args.namespace!r} (reset: {removed} old records removed)")

    sessions, questions = conv.sessions, conv.questions
    if args.sessions is not None:
        sessions = sessions[: args.sessions]
    if n_questions is not None:
        questions = questions[:n_questions]
    user = conv.user or "the user"
    print(f"Conversation: {len(sessions)} sessions with {user}, {sum(len(s['turns']) for s in sessions)} turns; "
          f"extractor {extractor!r}")

    rmm = RMM(store, chat_model=chat, embedder=emb, namespace=args.namespace, extractor=extractor, seed=args.seed,
              explore=args.explore, **C.rmm_retrieval_kwargs(args))

    # ---------------------------------------------------------------- prospective reflection
    print("\n-- Prospective reflection: each finished session becomes topic memories --")
    bar = C.progress_bar(len(sessions), "ingest", progress)
    actions: Counter = Counter()
    t_ing = {"extract": 0.0, "embed": 0.0, "decide": 0.0, "update": 0.0}
    for start in range(0, len(sessions), 4):
        chunk = sessions[start : start + 4]
        results = rmm.end_sessions([s["turns"] for s in chunk], [s["session_id"] for s in chunk],
                                   [s.get("date") for s in chunk], progress=lambda _n: bar.update(1))
        for s, res in zip(chunk, results):
            acts = ", ".join(f"{r.action}#{r.id}" for r in res) or "nothing"
            bar.write(f"  session {s['session_id']} ({s.get('date') or '-'}): {acts}")
            actions.update(r.action for r in res)
            if res:
                for k in t_ing:
                    t_ing[k] += res[0].timings.get(k, 0.0)
    bar.close()
    store.flush()
    print("  decisions: " + ", ".join(f"{a} {actions[a]}" for a in ("ADD", "MERGE", "UPDATE", "INVALIDATE", "NOOP")))
    n = max(1, len(sessions))
    print("  per session (s): " + ", ".join(f"{k} {v / n:.2f}" for k, v in t_ing.items()))

    print()
    C.print_bank(rmm, history=True)

    # ---------------------------------------------------------------- retrospective reflection
    if questions:
        print("\n-- Retrospective reflection: answers cite memories; citations train the reranker --")
    for i, q in enumerate(questions):
        resp = rmm.respond(q["question"])
        print(f"\nQ{i + 1}: {q['question']}")
        C.print_response(resp, rmm, expected=q.get("answer"))
    if rmm.pending:
        rmm.flush()
    rmm.close()
    store.flush()
    st = rmm.stats()
    print(f"\nReranker: {st['reranker_updates']} update(s) from {st['responses']} responses "
          f"(state saved under {path / 'rerankers'})")
    print(f"Done in {time.perf_counter() - t_start:.0f} s. Try: memkern ask --store {path} -n {args.namespace} "
          f"\"What is my job now?\"   |   memkern inspect --store {path} -n {args.namespace}")
    return 0
