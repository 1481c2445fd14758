"""``memkern eval memory EXPERIMENT``: retrieval experiments on generated data or benchmark files.

Experiments: ``granularity``, ``turn-in-topic``, ``reflection``, ``collapse``, ``rmm``,
``retrieval`` (issue 13: content-only vs templated turns, fixed windows, TextTiling topics,
turn + alpha * parent, and the default RMM's ``RMM.retrieve``, at 5/10/20-turn budgets), ``all``
(all but ``rmm`` and ``retrieval``). Each run prints a table and writes one JSON per experiment (config, dataset
hash, metrics, timings) under ``--out``.

On generated data each ``--seeds`` value generates its own dataset (and seeds the experiment);
the JSON then holds every seed's result and the mean / std over seeds. On a benchmark file the
seeds vary only the experiment's randomness (splits, sampling, citations).

Examples::

    memkern eval memory granularity --users 12 --sessions 40 --seeds 0 1 2
    memkern eval memory granularity --data dialogues --users 6 --sessions 20
    memkern eval memory reflection --longmemeval longmemeval_s.json --limit 200
    memkern eval memory granularity --granularities turn session topic-llm --llm-conversations 1
    memkern eval memory retrieval --data dialogues --users 6 --sessions 20 --seeds 0 1 2 3 4
    memkern eval memory granularity --seeds 0 1 2 3 --ray     # seeds as Ray tasks
"""
from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from . import _common as C

log = logging.getLogger("memkern")


@C._arg_type
def _fraction(text: str) -> float:
    """A number strictly between 0 and 1."""
    v = C._float(text, 0.0, 1.0, open_lo=True)
    if v >= 1.0:
        raise C.bad_arg("value", "a finite number > 0.0 and < 1.0", text)
    return v

EXPERIMENTS = ("granularity", "turn-in-topic", "reflection", "collapse", "rmm", "retrieval", "all")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("experiment", choices=EXPERIMENTS, help="which experiment to run")
    d = p.add_argument_group("data")
    src = d.add_mutually_exclusive_group()
    src.add_argument("--longmemeval", metavar="PATH", type=C.input_file, help="a LongMemEval JSON file")
    src.add_argument("--locomo", metavar="PATH", type=C.input_file, help="a LoCoMo JSON file")
    d.add_argument("--limit", type=C.positive_int, default=None, help="first N questions (LongMemEval) / samples (LoCoMo)")
    d.add_argument("--data", choices=("generated", "dialogues"), default="generated",
                   help="generated data: 'generated' (one user and an assistant, LongMemEval-like; default) or "
                        "'dialogues' (LoCoMo-like multi-party dialogues with paraphrased questions; --users = "
                        "conversations, --sessions >= 6)")
    d.add_argument("--users", type=C.positive_int, default=12, help="generated data: simulated users (default 12)")
    d.add_argument("--sessions", type=C.positive_int, default=40, help="generated data: sessions per user (default 40)")
    d.add_argument("--seeds", type=C.nonneg_int, nargs="+", default=[0, 1, 2], help="seeds (default 0 1 2)")
    d.add_argument("--max-questions", type=C.positive_int, default=None, help="evaluate only the first N questions")
    o = p.add_argument_group("output")
    o.add_argument("--out", default="eval-results", help="folder for JSON results and plots (default eval-results)")
    o.add_argument("--tag", default="", help="suffix for result file names")
    o.add_argument("--quiet", action="store_true", help="no progress bars")
    o.add_argument("--ray", action="store_true",
                   help="run every (experiment, seed) as a Ray task (local Ray, or the cluster at $RAY_ADDRESS); "
                        "same JSON as the local run (needs memkern[ray])")
    o.add_argument("--threads", type=C.positive_int, default=1,
                   help="torch CPU threads (default 1: on shared 2-core machines more threads thrash)")
    o.add_argument("--cache-dir", default="default",
                   help="embedding cache folder ('none' to disable; default: $MEMKERN_CACHE or ~/.cache/memkern)")
    g = p.add_argument_group("granularity / turn-in-topic")
    g.add_argument("--granularities", nargs="+", default=["turn", "session", "mix", "chunk4", "topic-embedding"],
                   choices=("turn", "session", "mix", "chunk4", "topic-embedding", "topic-llm"), metavar="NAME",
                   help="turn session mix chunk4 topic-embedding topic-llm")
    g.add_argument("--topic-threshold", type=C.finite_float, default=0.3,
                   help="the 'sentences' extractor's similarity threshold")
    g.add_argument("--llm-conversations", type=C.positive_int, default=1, help="conversations given to the LLM extractor")
    g.add_argument("--llm-max-new-tokens", type=C.positive_int, default=160)
    g.add_argument("--alphas", type=C.finite_float, nargs="+", default=[0.0, 0.5, 1.0, 2.0], help="turn-in-topic weights")
    g.add_argument("--parents", nargs="+", default=["chunk4", "topic-embedding"],
                   choices=("chunk4", "session", "topic-embedding"), metavar="NAME", help="chunk4 session topic-embedding")
    t = p.add_argument_group("retrieval (also uses --alphas > 0)")
    t.add_argument("--template", default=None, type=C.turn_template,
                   help="turn template (default '[{date}] {speaker}: {content}'; fields content, speaker, date, role)")
    t.add_argument("--window", type=C.positive_int, default=4, help="fixed window size (turns)")
    t.add_argument("--topic-turns", type=C.positive_float, default=4.0, help="TextTiling target topic size (turns)")
    t.add_argument("--no-rmm", action="store_true", help="skip the rmm-default row (RMM.retrieve on a store)")
    r = p.add_argument_group("reflection / collapse")
    r.add_argument("--k", type=C.positive_int, default=20, help="candidates from the retriever")
    r.add_argument("--top-m", type=C.positive_int, default=5, help="memories selected")
    r.add_argument("--presets", nargs="+", default=None, help="reranker presets: default paper (reflection: both)")
    r.add_argument("--batch-size", type=C.positive_int, default=8)
    r.add_argument("--passes", type=C.positive_float, default=1.0, help="online passes over the training stream")
    r.add_argument("--p-useful", type=C.probability, default=0.9, help="P(cited | useful memory)")
    r.add_argument("--p-useless", type=C.probability, default=0.1, help="P(cited | useless memory)")
    r.add_argument("--test-frac", type=_fraction, default=0.5, help="held-back fraction")
    r.add_argument("--split", choices=["question", "conversation"], default="question")
    r.add_argument("--eval-every", type=C.positive_int, default=None, help="learning-curve step (default: ~20 points)")
    r.add_argument("--optimizers", nargs="+", default=["adam", "sgd"], help="collapse: optimizers")
    r.add_argument("--lrs", type=C.positive_float, nargs="+", default=[1e-4, 1e-3, 1e-2], help="collapse: learning rates")
    r.add_argument("--steps", type=C.positive_int, default=10_000, help="collapse: updates per run")
    r.add_argument("--lr", type=C.positive_float, default=None, help="reflection: override the presets' learning rate")
    r.add_argument("--optimizer", default=None, help="reflection: override the presets' optimizer")
    m = p.add_argument_group("rmm (real chat model; slow on CPU)")
    m.add_argument("--rmm-conversations", type=C.positive_int, default=1)
    m.add_argument("--rmm-sessions", type=C.positive_int, default=4)
    m.add_argument("--rmm-questions", type=C.positive_int, default=3)
    m.add_argument("--extractor", choices=["llm", "embedding", "window", "sentences"], default="llm")
    m.add_argument("--decider", choices=["llm", "embedding", "add"], default=None,
                   help="default: llm for the llm extractor, add for embedding/window, embedding for sentences")
    m.add_argument("--chat-model", default=None, help="local model folder (default: the offline SmolLM2)")
    m.add_argument("--rmm-top-k", type=C.positive_int, default=20)
    m.add_argument("--rmm-top-m", type=C.positive_int, default=5)
    m.add_argument("--rmm-batch-size", type=C.positive_int, default=4, help="responses per reranker update")
    m.add_argument("--answer-max-new-tokens", type=C.positive_int, default=64)
    m.add_argument("--extract-max-new-tokens", type=C.positive_int, default=160)
    m.add_argument("--decide-max-new-tokens", type=C.positive_int, default=64)
    m.add_argument("--embedding-threshold", type=C.finite_float, default=0.25)


def _datasets(args):
    from ..eval.data import load_dataset

    if args.longmemeval:
        ds = load_dataset("longmemeval", args.longmemeval, limit=args.limit)
        return [(s, ds) for s in args.seeds]
    if args.locomo:
        ds = load_dataset("locomo", args.locomo, limit=args.limit)
        return [(s, ds) for s in args.seeds]
    return [(s, load_dataset(args.data, users=args.users, sessions=args.sessions, seed=s)) for s in args.seeds]


def run_job(exp: str, seed: int, ds, args, out: str, tag: str, *, emb) -> dict:
    """One experiment on one seed's dataset: what the local loop runs per (experiment, seed) and what
    ``--ray`` runs as one Ray task (same function, same arguments: the same result)."""
    import torch

    from ..eval import collapse, granularity, reflection, rmm_loop, turn_in_topic

    torch.set_num_threads(max(1, int(args.threads)))
    progress = not args.quiet and not getattr(args, "ray", False)
    out = Path(out)
    if getattr(args, "ray", False):
        emb.path = None  # a Ray task's own copy of the embedder: the driver alone writes the cache file
    overrides = {k: v for k, v in (("lr", args.lr), ("optimizer", args.optimizer)) if v is not None}
    if exp == "granularity":
        r = granularity.run_granularity(ds, args.granularities, emb=emb, topic_threshold=args.topic_threshold,
                                        llm_conversations=args.llm_conversations,
                                        llm_max_new_tokens=args.llm_max_new_tokens,
                                        max_questions=args.max_questions, progress=progress, seed=seed)
    elif exp == "turn-in-topic":
        r = turn_in_topic.run_turn_in_topic(ds, args.alphas, args.parents, emb=emb,
                                            topic_threshold=args.topic_threshold,
                                            max_questions=args.max_questions, progress=progress, seed=seed)
    elif exp == "retrieval":
        from ..eval import retrieval

        r = retrieval.run_retrieval(ds, emb=emb, alphas=[a for a in args.alphas if a > 0] or [1.0],
                                    template=args.template, window=args.window,
                                    texttiling={"target_turns": args.topic_turns}, rmm=not args.no_rmm,
                                    max_questions=args.max_questions, progress=progress, seed=seed)
    elif exp == "reflection":
        r = reflection.run_reflection(ds, emb=emb, k=args.k, top_m=args.top_m,
                             presets=args.presets or ["default", "paper"], batch_size=args.batch_size,
                             passes=args.passes, p_useful=args.p_useful, p_useless=args.p_useless,
                             test_frac=args.test_frac, split=args.split, seeds=[seed],
                             eval_every=args.eval_every, reranker_overrides=overrides or None,
                             max_questions=args.max_questions, progress=progress,
                             plot=out / f"reflection{tag}-seed{seed}.png")
    elif exp == "collapse":
        r = collapse.run_collapse(ds, emb=emb, optimizers=args.optimizers, lrs=args.lrs,
                           presets=args.presets or ["default"], steps=args.steps, k=args.k,
                           top_m=args.top_m, batch_size=args.batch_size, p_useful=args.p_useful,
                           p_useless=args.p_useless, test_frac=args.test_frac, seeds=[seed],
                           eval_every=args.eval_every,
                           max_questions=args.max_questions, progress=progress,
                           plot=out / f"collapse{tag}-seed{seed}.png")
    else:
        chat = None
        if args.chat_model:
            from ..models import ChatModel

            chat = ChatModel(args.chat_model)
        kw = dict(top_k=args.rmm_top_k, top_m=args.rmm_top_m, batch_size=args.rmm_batch_size,
                  answer_max_new_tokens=args.answer_max_new_tokens,
                  extract_max_new_tokens=args.extract_max_new_tokens,
                  decide_max_new_tokens=args.decide_max_new_tokens,
                  embedding_threshold=args.embedding_threshold, seed=seed)
        if args.decider:
            kw["decider"] = args.decider
        r = rmm_loop.run_rmm(ds, conversations=args.rmm_conversations, sessions=args.rmm_sessions,
                      questions=args.rmm_questions, extractor=args.extractor, chat_model=chat,
                      embedder=emb.embedder, rmm_kwargs=kw, progress=progress)
    return r


def run(args) -> int:
    import torch

    from ..errors import MemkernError
    from ..eval import report
    from ..eval.units import CachedEmbedder

    torch.set_num_threads(max(1, int(args.threads)))
    log.info("eval memory: torch threads = %d", torch.get_num_threads())
    progress = not args.quiet
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cache = None if args.cache_dir == "none" else args.cache_dir
    emb = CachedEmbedder(cache_dir=cache, progress=progress)
    datasets = _datasets(args)
    for _, ds in datasets[:1]:
        print(ds.summary())
    exps = ["granularity", "turn-in-topic", "reflection", "collapse"] if args.experiment == "all" else [args.experiment]
    tag = f"-{args.tag}" if args.tag else ""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    status = 0
    jobs = {exp: [(exp, seed, ds, args, str(out), tag) for seed, ds in datasets] for exp in exps}
    if getattr(args, "ray", False):
        # every (experiment, seed) is one Ray task running run_job; the embedder (with its cache)
        # travels once through the object store
        from ..distributed.evaluate import JobFailed, run_jobs

        flat = [j for exp in exps for j in jobs[exp]]
        got = run_jobs(run_job, flat, shared={"emb": emb}, return_exceptions=True, progress=progress)
        done = {}
        for j, r in zip(flat, got):
            done.setdefault(j[0], []).append(r)
    for exp in exps:
        try:
            if getattr(args, "ray", False):
                results = []
                for r in done[exp]:
                    if isinstance(r, JobFailed):
                        raise r.error
                    results.append(r)
            else:
                results = [run_job(*j, emb=emb) for j in jobs[exp]]
        except MemkernError as e:
            print(f"{exp}: skipped: {e}")
            status = 1
            continue
        agg = report.aggregate(results)
        path = report.write_result(agg, out / f"{exp}{tag}-{stamp}.json")
        print(f"\n== {exp} ({len(results)} run(s)); result: {path}")
        print(report.format_aggregate(agg) if len(results) > 1 else report.format_table(results[0]))
    emb.flush()
    return status
