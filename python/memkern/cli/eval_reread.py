"""``memkern eval reread``: MemReread vs MemAgent (max_rereads=0) on long-context QA.

Data: ``--data FILE`` (the published ``context`` / ``input`` / ``answers`` format, JSON or JSONL,
e.g. HotpotQA / 2WikiMultiHopQA files) or, by default, items generated over the Paul Graham
essays at ``--lengths``. Prints EM, F1, ``contains`` and mean rereads per length and per task,
saves a PNG plot and, with ``--json``, every row.
"""
from __future__ import annotations

import argparse
import json
import os

from . import common as C


def _ints(text: str) -> list[int]:
    """``"8k,32000"`` -> ``[8192, 32000]`` (positive token counts; ``k`` = 1024)."""
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        mult = 1024 if part.endswith("k") else 1
        try:
            v = int(part[:-1] if part.endswith("k") else part) * mult
        except ValueError:
            v = 0
        if v < 1:
            raise argparse.ArgumentTypeError(f"expected comma-separated token counts such as 8k,32k, got {text!r}")
        out.append(v)
    return out


def configure(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("data")
    g.add_argument("--data", type=C.input_file, help="long-context QA file (context/input/answers; JSON or JSONL)")
    g.add_argument("--limit", type=C.positive_int, default=None, help="first N records of --data")
    g.add_argument("--lengths", type=_ints, default="8k,16k", help="generated data: lengths in tokens, e.g. 8k,32k,128k")
    g.add_argument("--tasks", default="single,multihop2,multihop3,count,sum",
                   help="generated data: task kinds (comma separated)")
    g.add_argument("--n-per-cell", type=C.positive_int, default=1, help="generated items per (length, task)")
    g.add_argument("--seed", type=C.nonneg_int, default=0)
    m = parser.add_argument_group("model")
    m.add_argument("--model", default=None,
                   help="chat model: default = SmolLM2-135M-Instruct (offline); 'tiny' = random 2-layer test "
                        "model; or a local folder / model id / .gguf file")
    m.add_argument("--openai-url", default=None, help="use an OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1")
    m.add_argument("--openai-model", default=None, help="model name on that server")
    m.add_argument("--device", default=None)
    r = parser.add_argument_group("MemReread")
    r.add_argument("--max-rereads", type=C.nonneg_int, default=3)
    r.add_argument("--no-baseline", action="store_true", help="skip the max_rereads=0 (MemAgent) run")
    r.add_argument("--chunk-tokens", type=C.positive_int, default=5000)
    r.add_argument("--memory-tokens", type=C.positive_int, default=1024)
    r.add_argument("--max-new-tokens", type=C.positive_int, default=None, help="memory write length (default memory-tokens)")
    r.add_argument("--answer-tokens", type=C.positive_int, default=64)
    r.add_argument("--decompose-tokens", type=C.positive_int, default=96)
    r.add_argument("--batch-size", type=C.positive_int, default=8, help="items per batched answer_batch call")
    o = parser.add_argument_group("output")
    o.add_argument("--plot", default="memreread_eval.png", help="PNG path ('' for none)")
    o.add_argument("--json", dest="json_out", default=None, help="write the full report (every row) here")
    o.add_argument("--quiet", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ..eval.reread import evaluate_reread, format_report, plot_report

    progress = not args.quiet
    if args.openai_url and not args.openai_model:
        raise C.bad_arg("--openai-model", "a model name with --openai-url", None)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not args.data and not tasks:
        raise C.bad_arg("--tasks", "comma-separated task kinds", args.tasks)
    items = None
    if args.data:  # the file is validated before any model is built
        from ..data.longqa import load_longqa

        items = load_longqa(args.data, limit=args.limit)
        if not items:
            raise C.bad_arg("--data", "a file with at least one record", args.data)
    if args.openai_url:
        from ..models import OpenAIChatModel

        chat = OpenAIChatModel(args.openai_url, args.openai_model)
        tokenizer = None
    elif args.model == "tiny":
        from ..models import tiny_chat_model

        chat = tiny_chat_model(device=args.device)
        tokenizer = chat.tokenizer
    else:
        from ..models import ChatModel

        chat = ChatModel(args.model, device=args.device)
        tokenizer = chat.tokenizer
    if items is None:
        from ..data.haystack import generate_haystack_qa

        lengths = args.lengths if isinstance(args.lengths, list) else _ints(args.lengths)
        items = generate_haystack_qa(n_per_cell=args.n_per_cell, lengths=lengths, tasks=tasks,
                                     seed=args.seed, tokenizer=tokenizer, progress=progress)
    report = evaluate_reread(items, chat, max_rereads=args.max_rereads, baseline=not args.no_baseline,
                             batch_size=args.batch_size, progress=progress, chunk_tokens=args.chunk_tokens,
                             memory_tokens=args.memory_tokens, max_new_tokens=args.max_new_tokens,
                             answer_tokens=args.answer_tokens, decompose_tokens=args.decompose_tokens)
    print(format_report(report))
    if args.plot:
        print(f"plot saved to {plot_report(report, args.plot)}")
    if args.json_out:
        from ..base.atomic import atomic_write

        atomic_write(args.json_out, json.dumps(report, indent=1, default=str))
        print(f"report saved to {args.json_out}")
    return 0
