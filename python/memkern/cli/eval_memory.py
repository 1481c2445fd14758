"""``memkern eval memory EXPERIMENT``: retrieval experiments on generated data or benchmark files.

Experiments: ``granularity``, ``turn-in-topic``, ``reflection``, ``collapse``, ``rmm``,
``retrieval`` (issue 13: content-only vs templated turns, fixed windows, TextTiling topics,
turn + alpha * parent, and the default RMM's ``RMM.retrieve``, at 5/10/20-turn budgets),
``learning`` (the reranker learning through ``RMM.respond`` from simulated citations: held-out
R@5 before / after, what the user was shown, each exploration scheme; :mod:`memkern.eval.learning`),
``all`` (all but ``rmm``, ``retrieval`` and ``learning``). Each run prints a table and writes one JSON per experiment (config, dataset
hash, metrics, timings) under ``--out``.

On generated data each ``--seeds`` value generates its own dataset (and seeds the experiment);
the JSON then holds every seed's result and the mean / std over seeds. On a benchmark file the
seeds vary only the experiment's randomness (splits, sampling, citations).

Every (experiment, seed) is cut into (configuration, conversations) tasks
(:mod:`memkern.eval.tasks`, ``--task-conversations`` per task); the local run runs them one after
the other, ``--ray`` as Ray tasks, and both merge them the same way (the same JSON).

On LoCoMo (``--locomo`` a file or a folder of per-conversation files, ``--conversations`` the
sample ids to use) the ``retrieval`` experiment adds the ablation rows of the RMM default
(``--ablations``, default all there) and ``--write-section`` writes its table into the
repository's ``bench/sections/retrieval-locomo.md`` and reassembles ``bench/RESULTS.md``.

Examples::

    memkern eval memory granularity --users 12 --sessions 40 --seeds 0 1 2
    memkern eval memory granularity --data dialogues --users 6 --sessions 20
    memkern eval memory reflection --longmemeval longmemeval_s.json --limit 200
    memkern eval memory granularity --granularities turn session topic-llm --llm-conversations 1
    memkern eval memory retrieval --data dialogues --users 6 --sessions 20 --seeds 0 1 2 3 4
    memkern eval memory retrieval --locomo locomo/ --conversations conv-26,conv-30,conv-41 --seeds 0
    memkern eval memory learning --locomo locomo/ --conversations conv-26,conv-30,conv-41 --seeds 0
    memkern eval memory granularity --seeds 0 1 2 3 --ray     # seeds x granularities x conversations as Ray tasks
"""
from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from . import common as C

log = logging.getLogger("memkern")


@C._arg_type
def _fraction(text: str) -> float:
    """A number strictly between 0 and 1."""
    v = C._float(text, 0.0, 1.0, open_lo=True)
    if v >= 1.0:
        raise C.bad_arg("value", "a finite number > 0.0 and < 1.0", text)
    return v

EXPERIMENTS = ("granularity", "turn-in-topic", "reflection", "collapse", "rmm", "retrieval", "learning", "all")


@C._arg_type
def _id_list(text: str) -> list[str]:
    """A comma-separated list of non-empty names."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise C.bad_arg("value", "comma-separated names (e.g. conv-26,conv-30)", text)
    return parts


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("experiment", choices=EXPERIMENTS, help="which experiment to run")
    d = p.add_argument_group("data")
    src = d.add_mutually_exclusive_group()
    src.add_argument("--longmemeval", metavar="PATH", type=C.input_file, help="a LongMemEval JSON file")
    src.add_argument("--locomo", metavar="PATH", type=C.input_path,
                     help="a LoCoMo JSON file, or a folder of per-conversation files (conv-26.json, ...)")
    d.add_argument("--conversations", type=_id_list, default=None, metavar="IDS",
                   help="LoCoMo: comma-separated sample ids to use (e.g. conv-26,conv-30,conv-41); default all")
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
                   help="run the tasks (seed x configuration x conversations) as Ray tasks (local Ray, or the "
                        "cluster at $RAY_ADDRESS); same JSON as the local run (needs memkern[ray])")
    o.add_argument("--task-conversations", type=C.nonneg_int, default=4, metavar="N",
                   help="conversations per task (default 4; 0: one task per configuration and seed); the "
                        "result does not depend on it")
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
    t.add_argument("--ablations", type=_id_list, default=None, metavar="NAMES",
                   help="comma-separated ablation rows of the RMM default ('all', 'none', or names such as "
                        "'rmm: no neighbours'); default all with --locomo, none otherwise")
    t.add_argument("--bootstrap", type=C.positive_int, default=2000, help="resamples of the 95%% intervals")
    t.add_argument("--write-section", action="store_true",
                   help="with --locomo: write the table to bench/sections/retrieval-locomo.md and reassemble "
                        "bench/RESULTS.md (needs a source checkout)")
    t.add_argument("--bench-dir", default=None, help="the repository's bench/ folder for --write-section (found "
                   "automatically for a source checkout)")
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
    lg = p.add_argument_group("learning (simulated citations; also uses --test-frac, --k, --rmm-batch-size)")
    lg.add_argument("--learning-arms", nargs="+", default=None, metavar="ARM",
                    help="greedy explore=<share> hidden swap-last direct (default: greedy explore=0.05 explore=1 "
                         "hidden swap-last direct)")
    lg.add_argument("--learning-splits", type=C.positive_int, default=3,
                    help="random train / held-out splits per seed (default 3)")
    lg.add_argument("--learning-pool", action="store_true",
                    help="one reranker for every conversation (default: one per conversation)")
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

    if args.conversations is not None and not args.locomo:
        raise C.bad_arg("--conversations", "--locomo PATH as well (conversation ids of a LoCoMo file)",
                        ",".join(args.conversations))
    if args.longmemeval:
        ds = load_dataset("longmemeval", args.longmemeval, limit=args.limit)
        return [(s, ds) for s in args.seeds]
    if args.locomo:
        ds = load_dataset("locomo", args.locomo, limit=args.limit, conversations=args.conversations)
        return [(s, ds) for s in args.seeds]
    return [(s, load_dataset(args.data, users=args.users, sessions=args.sessions, seed=s)) for s in args.seeds]


def make_experiment(exp: str, seed: int, args, out: str, tag: str):
    """The :class:`memkern.eval.tasks.Experiment` of one experiment on one seed: its tasks are
    what the local loop runs one after the other and what ``--ray`` runs as Ray tasks (same
    plan, same merge: the same result)."""
    from ..eval.collapse import CollapseExperiment
    from ..eval.granularity import granularity_experiment
    from ..eval.reflection import ReflectionExperiment
    from ..eval.retrieval import retrieval_experiment
    from ..eval.rmm_loop import RMMExperiment
    from ..eval.turn_in_topic import turn_in_topic_experiment

    out = Path(out)
    overrides = {k: v for k, v in (("lr", args.lr), ("optimizer", args.optimizer)) if v is not None}
    if exp == "granularity":
        return granularity_experiment(args.granularities, topic_threshold=args.topic_threshold,
                                      llm_conversations=args.llm_conversations,
                                      llm_max_new_tokens=args.llm_max_new_tokens,
                                      max_questions=args.max_questions, seed=seed)
    if exp == "turn-in-topic":
        return turn_in_topic_experiment(args.alphas, args.parents, topic_threshold=args.topic_threshold,
                                        max_questions=args.max_questions, seed=seed)
    if exp == "retrieval":
        abl = args.ablations
        if abl is None:
            abl = ["all"] if args.locomo and not args.no_rmm else []
        elif abl == ["none"]:
            abl = []
        from ..eval.retrieval import LOCOMO_TYPES

        return retrieval_experiment(alphas=[a for a in args.alphas if a > 0] or [1.0], template=args.template,
                                    window=args.window, texttiling={"target_turns": args.topic_turns},
                                    rmm=not args.no_rmm, max_questions=args.max_questions, seed=seed,
                                    ablations=abl, bootstrap=args.bootstrap,
                                    question_types=LOCOMO_TYPES if args.locomo else None)
    if exp == "learning":
        from ..eval.learning import ARMS, learning_experiment

        return learning_experiment(arms=args.learning_arms or ARMS, splits=args.learning_splits,
                                   test_frac=args.test_frac, pool=args.learning_pool,
                                   batch_size=args.rmm_batch_size, k=args.k, seed=seed)
    if exp == "reflection":
        return ReflectionExperiment(
            presets=tuple(args.presets or ["default", "paper"]), seed=seed,
            plot=str(out / f"reflection{tag}-seed{seed}.png"),
            kwargs=dict(k=args.k, top_m=args.top_m, batch_size=args.batch_size, passes=args.passes,
                        p_useful=args.p_useful, p_useless=args.p_useless, test_frac=args.test_frac, split=args.split,
                        seeds=[seed], eval_every=args.eval_every, reranker_overrides=overrides or None,
                        max_questions=args.max_questions))
    if exp == "collapse":
        return CollapseExperiment(
            presets=tuple(args.presets or ["default"]), optimizers=tuple(args.optimizers), lrs=tuple(args.lrs),
            seed=seed, plot=str(out / f"collapse{tag}-seed{seed}.png"),
            kwargs=dict(steps=args.steps, k=args.k, top_m=args.top_m, batch_size=args.batch_size,
                        p_useful=args.p_useful, p_useless=args.p_useless, test_frac=args.test_frac, seeds=[seed],
                        eval_every=args.eval_every, max_questions=args.max_questions))
    kw = dict(top_k=args.rmm_top_k, top_m=args.rmm_top_m, batch_size=args.rmm_batch_size,
              answer_max_new_tokens=args.answer_max_new_tokens,
              extract_max_new_tokens=args.extract_max_new_tokens,
              decide_max_new_tokens=args.decide_max_new_tokens,
              embedding_threshold=args.embedding_threshold, seed=seed)
    if args.decider:
        kw["decider"] = args.decider
    return RMMExperiment(seed=seed, chat_model=args.chat_model,
                         kwargs=dict(conversations=args.rmm_conversations, sessions=args.rmm_sessions,
                                     questions=args.rmm_questions, extractor=args.extractor, rmm_kwargs=kw))


def _command_line(args) -> str:
    """The command that reproduces this run's retrieval table (for the section)."""
    cmd = ["memkern eval memory retrieval", "--locomo PATH"]
    if args.conversations:
        cmd.append(f"--conversations {','.join(args.conversations)}")
    cmd.append(f"--seeds {' '.join(map(str, args.seeds))}")
    if args.ablations is not None:
        cmd.append(f"--ablations {','.join(args.ablations)!r}")
    cmd.append("--write-section")
    return "OMP_NUM_THREADS=1 " + " ".join(cmd)


def _locomo_headline(res: dict) -> list[list[str]]:
    """RESULTS.md's rows for the LoCoMo section: the RMM default against the baseline at each
    budget, formatted as the section's table prints them."""
    m, base = res.get("metrics", {}), res.get("config", {}).get("baseline")
    rows = []
    for b in res.get("config", {}).get("budgets", (5, 10, 20)):
        d, r, k = m.get("rmm-default", {}), m.get(base, {}), f"recall@{b}turns"
        if k in d and k in r and f"delta_{k}" in d:
            rows.append([f"rmm-default, R@{b}", f"{d[k]:.3f}", f"{base} {r[k]:.3f}",
                         f"{100 * d[f'delta_{k}']:+.1f} points"])
    return rows


def _write_locomo_section(args, result, path) -> int:
    """Write the LoCoMo retrieval table to bench/sections/retrieval-locomo.md and reassemble
    RESULTS.md (1 with a one-line message when it cannot)."""
    import sys

    from ..eval.retrieval import locomo_section
    from .bench import find_bench_dir

    if not args.locomo:
        print("eval memory: --write-section: expected --locomo (the section records real-data figures), got none")
        return 1
    bench_dir = find_bench_dir(getattr(args, "bench_dir", None))
    if bench_dir is None:
        print("eval memory: --write-section: expected a source checkout with bench/report.py, got none")
        return 1
    import importlib.util

    spec = importlib.util.spec_from_file_location("memkern_bench_report", bench_dir / "report.py")
    bench_report = importlib.util.module_from_spec(spec)
    if str(bench_dir) not in sys.path:
        sys.path.insert(0, str(bench_dir))  # report.py imports harness.py beside it
    spec.loader.exec_module(bench_report)

    res = result.to_dict() if hasattr(result, "to_dict") else result
    body = locomo_section(res)
    p = bench_report.write_section("retrieval-locomo", "Retrieval on real conversations (LoCoMo development split)",
                                   body, _command_line(args), raw_json=f"<--out>/{path.name}",
                                   sections_dir=bench_dir / "sections", headline=_locomo_headline(res))
    bench_report.write_results(bench_dir)
    print(f"wrote {p} and reassembled {bench_dir / 'RESULTS.md'}")
    return 0


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
    from ..eval.tasks import run_experiments

    # every (experiment, seed) is cut into (configuration, conversations) tasks; the same tasks run
    # here one after the other or as Ray tasks, and are merged the same way
    runs = [(make_experiment(exp, seed, args, str(out), tag), ds) for exp in exps for seed, ds in datasets]
    got = run_experiments(runs, emb, conversations_per_task=args.task_conversations,
                          use_ray=bool(getattr(args, "ray", False)), threads=args.threads, progress=progress)
    for exp in exps:
        mine = [r for (e, _), r in zip(runs, got) if e.name == exp]
        try:
            results = []
            for r in mine:
                if isinstance(r, BaseException):
                    raise r
                results.append(r)
        except MemkernError as e:
            print(f"{exp}: skipped: {e}")
            status = 1
            continue
        agg = report.aggregate(results)
        path = report.write_result(agg, out / f"{exp}{tag}-{stamp}.json")
        print(f"\n== {exp} ({len(results)} run(s)); result: {path}")
        print(report.format_aggregate(agg) if len(results) > 1 else report.format_table(results[0]))
        if exp == "retrieval" and getattr(args, "write_section", False):
            status = max(status, _write_locomo_section(args, results[0], path))
    emb.flush()
    return status
