"""The ``memkern`` command line.

Each command lives in ``memkern/cli/<name>.py`` and exposes ``configure(parser)`` (adds its
arguments) and ``run(args) -> int``. Modules are imported only when their command runs, so
``memkern --help`` is fast.

Errors: every failure is one line on stderr, ``memkern: error: <what, naming the argument>``, with
exit code 2 for bad usage (rejected arguments or input) and 1 for failures (I/O, corrupted store,
model failure, a missing optional package: the line names the extra to install); ``--debug`` also
prints the traceback.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys
import traceback
from typing import NoReturn

# (command words, module, one-line help)
COMMANDS: list[tuple[tuple[str, ...], str, str]] = [
    (("demo",), "memkern.cli.demo", "run RMM on the bundled sample conversation (the main job)"),
    (("ingest",), "memkern.cli.ingest", "add dialogue sessions from a JSON file to a store"),
    (("ask",), "memkern.cli.ask", "ask a question answered from a store's memories"),
    (("inspect",), "memkern.cli.inspect", "print a store's memory bank"),
    (("forget",), "memkern.cli.forget", "delete a namespace or a record"),
    (("export",), "memkern.cli.export", "write a store's records and reranker state to a JSONL file"),
    (("import",), "memkern.cli.import_", "load a 'memkern export' file into a new or existing store (atomic)"),
    (("models",), "memkern.cli.models", "set up / list the offline default models"),
    (("eval", "memory"), "memkern.cli.eval_memory", "retrieval experiments (LongMemEval/LoCoMo/generated)"),
    (("eval", "reread"), "memkern.cli.eval_reread", "MemReread vs MemAgent on long-context QA"),
    (("bench",), "memkern.cli.bench", "run the benchmark suite; writes bench/REPORT.md and charts"),
    (("serve",), "memkern.cli.serve", "serve a store over HTTP (mem0-shaped routes; memkern[serve])"),
    (("mcp",), "memkern.cli.mcp", "serve a store as MCP tools over stdio (memkern[serve])"),
]

#: the extra a command's optional packages come from (the store commands need none)
COMMAND_EXTRAS = {
    "memkern.cli.demo": "models", "memkern.cli.ingest": "models", "memkern.cli.ask": "models",
    "memkern.cli.models": "models", "memkern.cli.eval_memory": "eval",
    "memkern.cli.eval_reread": "eval", "memkern.cli.bench": "bench",
    "memkern.cli.serve": "serve", "memkern.cli.mcp": "serve",
}


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line (``memkern: error: ...``, exit 2)."""

    def error(self, message: str) -> NoReturn:
        # error_line adds the one "memkern: error: " prefix; the hint names the command
        raise UsageError(f"{message} (see '{self.prog} --help')")


class UsageError(Exception):
    """A command line the parser rejects (exit code 2)."""


#: exit codes: 0 success, 1 failure (I/O, corrupted store, model or other runtime failure),
#: 2 bad usage (rejected arguments or input), 130 interrupted.
EXIT_FAILURE, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


def exit_code(exc: BaseException) -> int:
    """The exit code of a command that raised ``exc``.

    2 (bad usage): parser errors and memkern's input-validation errors (``MemkernValueError``,
    ``MemkernTypeError``, ``MemkernKeyError`` and their subclasses, e.g. a malformed input file,
    an invalid namespace, an unknown record id). 1 (failure): everything else: I/O errors, a
    corrupted or locked store, an unavailable backend, a failing model.
    """
    from ..errors import MemkernKeyError, MemkernTypeError, MemkernValueError

    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(exc, (UsageError, MemkernValueError, MemkernTypeError, MemkernKeyError)):
        return EXIT_USAGE
    return EXIT_FAILURE


def error_line(exc: BaseException) -> str:
    """One line naming the problem: ``memkern: error: <message>``."""
    from ..errors import MemkernError

    if isinstance(exc, KeyboardInterrupt):
        msg = "interrupted"
    else:
        # KeyError's str() adds quotes; take the message itself.
        msg = exc.args[0] if isinstance(exc, KeyError) and len(exc.args) == 1 else str(exc)
        msg = str(msg)
        if isinstance(exc, OSError) and exc.filename is not None and str(exc.filename) not in msg:
            msg = f"{msg}: {exc.filename}"
        if not isinstance(exc, (MemkernError, UsageError, OSError)):
            msg = f"{type(exc).__name__}: {msg}"  # not one of memkern's own errors: say what it was
    msg = " ".join(msg.split()) or type(exc).__name__
    return f"memkern: error: {msg}"


def build_parser(load: str | None = None) -> argparse.ArgumentParser:
    """Build the parser; only the module of command ``load`` (a dotted module path) is imported."""
    from ..base.version import __version__

    parser = _Parser(prog="memkern", description="memkern: long-term memory for LLM agents")
    parser.add_argument("--version", action="version", version=f"memkern {__version__}",
                        help="print the version of memkern and exit")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    parser.add_argument("--debug", action="store_true",
                        help="on an error, also print its traceback (errors are otherwise one line)")
    # --debug is accepted after the command word too (e.g. `memkern ingest F --debug`).
    common = _Parser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction] = {}
    for words, module, help_ in COMMANDS:
        target = sub
        for w in words[:-1]:
            if w not in groups:
                gp = sub.add_parser(w, help=f"{w} commands", parents=[common])
                groups[w] = gp.add_subparsers(dest=f"{w}_command", metavar="COMMAND")
            target = groups[w]
        p = target.add_parser(words[-1], help=help_, description=help_, parents=[common])
        p.set_defaults(_module=module)
        if module == load:
            importlib.import_module(module).configure(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit code. Errors are printed as one line on stderr
    (``memkern: error: ...``; with ``--debug`` after their traceback), never raised."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        return _main(argv)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - every error becomes one line and an exit code
        if debug:
            traceback.print_exc()
        print(error_line(exc), file=sys.stderr)
        return exit_code(exc)


def _main(argv: list[str]) -> int:
    # First pass: find which command is asked for, without its options.
    probe = build_parser()
    known, _ = probe.parse_known_args([a for a in argv if a not in ("-h", "--help")])
    module = getattr(known, "_module", None)
    if module is None:
        probe.parse_args(argv)  # usage errors for groups such as `memkern eval frob`
        probe.print_help()
        if argv:  # e.g. `memkern eval`: a group without its command
            raise UsageError(f"expected a command after 'memkern {' '.join(argv)}' (see the list above)")
        return 0
    try:
        args = build_parser(load=module).parse_args(argv)
        level = logging.WARNING - 10 * min(args.verbose, 2)
        logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
        return int(importlib.import_module(module).run(args) or 0)
    except ModuleNotFoundError as exc:  # an optional package is missing: name the extra that brings it
        from ..errors import missing_dependency

        words = next(" ".join(w) for w, m, _ in COMMANDS if m == module)
        err = missing_dependency(exc, f"memkern {words}", COMMAND_EXTRAS.get(module))
        if err is None:
            raise
        raise err from exc


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
