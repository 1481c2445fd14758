"""The ``memkern`` command line.

Each command lives in ``memkern/commands/<name>.py`` and exposes ``configure(parser)`` (adds its
arguments) and ``run(args) -> int``. Modules are imported only when their command runs, so
``memkern --help`` is fast.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

# (command words, module, one-line help)
COMMANDS: list[tuple[tuple[str, ...], str, str]] = [
    (("demo",), "memkern.commands.demo", "run RMM on the bundled sample conversation (the main job)"),
    (("ingest",), "memkern.commands.ingest", "add dialogue sessions from a JSON file to a store"),
    (("ask",), "memkern.commands.ask", "ask a question answered from a store's memories"),
    (("inspect",), "memkern.commands.inspect", "print a store's memory bank"),
    (("forget",), "memkern.commands.forget", "delete a namespace or a record"),
    (("models",), "memkern.commands.models", "set up / list the offline default models"),
    (("eval", "memory"), "memkern.commands.eval_memory", "retrieval experiments (LongMemEval/LoCoMo/generated)"),
    (("eval", "reread"), "memkern.commands.eval_reread", "MemReread vs MemAgent on long-context QA"),
    (("bench",), "memkern.commands.bench", "run the benchmark suite; writes bench/REPORT.md and charts"),
]


def build_parser(load: str | None = None) -> argparse.ArgumentParser:
    """Build the parser; only the module of command ``load`` (a dotted module path) is imported."""
    parser = argparse.ArgumentParser(prog="memkern", description="memkern: long-term memory for LLM agents")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction] = {}
    for words, module, help_ in COMMANDS:
        target = sub
        for w in words[:-1]:
            if w not in groups:
                gp = sub.add_parser(w, help=f"{w} commands")
                groups[w] = gp.add_subparsers(dest=f"{w}_command", metavar="COMMAND")
            target = groups[w]
        p = target.add_parser(words[-1], help=help_, description=help_)
        p.set_defaults(_module=module)
        if module == load:
            importlib.import_module(module).configure(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # First pass: find which command is asked for, without its options.
    probe = build_parser()
    known, _ = probe.parse_known_args([a for a in argv if a not in ("-h", "--help")])
    module = getattr(known, "_module", None)
    if module is None:
        probe.parse_args(argv)  # prints help / usage errors for groups such as `memkern eval`
        probe.print_help()
        return 0 if not argv else 2
    args = build_parser(load=module).parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    return int(importlib.import_module(module).run(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
