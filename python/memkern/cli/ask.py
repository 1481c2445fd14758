"""``memkern ask QUESTION``: answer from a store's memories, with citations (retrospective reflection).

The citations are rewards for the namespace's reranker: they are buffered (persisted between
calls) and applied every ``--batch-size`` questions; the reranker is saved with the store.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from . import common as C


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("question", metavar="QUESTION", type=C.nonempty_text, help="the question")
    C.add_store_args(p)
    C.add_model_args(p)
    p.add_argument("--top-k", type=C.positive_int, default=20, help="memories retrieved (default 20)")
    p.add_argument("--top-m", type=C.positive_int, default=5, help="memories shown to the model (default 5)")
    p.add_argument("--batch-size", type=C.positive_int, default=4, help="responses per reranker update (default 4)")
    p.add_argument("--max-new-tokens", type=C.positive_int, default=64, help="answer budget (default 64)")
    p.add_argument("--explore", action="store_true", help="the reranker samples the memories shown (paper's exploration)")
    p.add_argument("--json", action="store_true", help="print the response as JSON")
    p.add_argument("--no-learn", action="store_true",
                   help="answer only: open the store read-only (beside a running server too), keep no rewards")


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    if args.top_m > args.top_k:
        raise C.bad_arg("--top-m", f"<= --top-k ({args.top_k})", args.top_m)
    path = C.store_path(args)
    with C.open_store(path, create=False, read_only=args.no_learn) as store:
        return _run(args, store)


def _run(args: argparse.Namespace, store) -> int:
    from ..loops.rmm import RMM

    chat, emb = C.build_models(args)
    rmm = RMM(store, chat_model=chat, embedder=emb, namespace=args.namespace, top_k=args.top_k, top_m=args.top_m,
              batch_size=args.batch_size, seed=args.seed, answer_max_new_tokens=args.max_new_tokens, explore=args.explore,
              persist=not args.no_learn, **C.rmm_retrieval_kwargs(args))
    if rmm.two_level and args.no_learn:
        from ..ingest.apply import has_all_turn_records
        from ..store.bank import namespace_ids

        if not all(has_all_turn_records(store.get(i)) for i in namespace_ids(store, args.namespace)):
            raise C.bad_arg("--no-learn", "a bank whose turns are indexed (run `memkern ask` once without it)",
                            "topics without turn records")
    elif rmm.two_level:
        n = rmm.index_turns()  # a bank written in topic mode gets its turn records once
        if n:
            print(f"(indexed the turns of {n} topics for turn+topic retrieval)", file=sys.stderr)
    resp = rmm.respond(args.question)
    if not args.no_learn:
        rmm.close()
        store.flush()
    if args.json:
        print(json.dumps({"answer": resp.answer, "memory_ids": resp.memory_ids, "citations": resp.citations,
                          "rewards": resp.rewards, "timings": resp.timings}, indent=1))
    else:
        print(f"Q: {args.question}")
        C.print_response(resp, rmm)
        if rmm.pending:
            print(f"  ({rmm.pending} response(s) of rewards buffered; the reranker updates every {args.batch_size})")
    return 0
