"""``memkern import``: load a ``memkern export`` file into a store, atomically.

Every line is checked before anything is written. A new ``--store`` (absent or empty) is built
beside its path and renamed into place; into an existing store the file's namespaces are added
(a namespace the store already holds is refused) in a copy that is swapped in with one atomic
exchange. Either way a failure (or a kill) leaves ``--store`` as it was. A file exported with
``--no-embeddings`` is embedded again with ``--embedder`` (default: the offline
all-MiniLM-L6-v2). Details in :mod:`memkern.store.transfer`.
"""
from __future__ import annotations

import argparse
import json

from . import common as C


def configure(p: argparse.ArgumentParser) -> None:
    C.add_store_args(p, namespace=None)
    p.add_argument("--in", dest="input", required=True, type=C.input_file, metavar="FILE.jsonl",
                   help="export file to read")
    p.add_argument("--embedder", default=None, metavar="ID_OR_PATH",
                   help="for a file exported with --no-embeddings: the model that embeds the texts again "
                        "(default: the offline all-MiniLM-L6-v2)")


def _needs_embedder(path: str) -> bool:
    """Whether the file's header says it carries no vectors (the full check comes in the import)."""
    try:
        with open(path, encoding="utf-8") as f:
            header = json.loads(f.readline())
        return isinstance(header, dict) and header.get("embeddings") is False
    except (ValueError, OSError):
        return False  # the import itself reports what is wrong with the file


def run(args: argparse.Namespace) -> int:
    from ..store.transfer import import_store

    path = C.store_path(args)
    embedder = C.build_models(args, need_chat=False)[1] if _needs_embedder(args.input) else None
    res = import_store(path, args.input, embedder=embedder)
    print(f"imported {res.records} records in {len(res.namespaces)} namespace(s) and {len(res.rerankers)} reranker "
          f"file(s) into {path}" + (" (ids renumbered: see the id map of memkern.import_store)" if res.renumbered
                                   else ""))
    return 0
