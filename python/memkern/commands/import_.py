"""``memkern import``: build a new store from a ``memkern export`` file, atomically.

Every line is checked before anything is written; the store is built beside ``--store`` and
renamed into place, so a failure (or a kill) leaves ``--store`` as it was. ``--store`` must not
hold a store yet (absent or an empty directory). Details in :mod:`memkern.transfer`.
"""
from __future__ import annotations

import argparse

from . import _common as C


def configure(p: argparse.ArgumentParser) -> None:
    C.add_store_args(p, namespace=None)
    p.add_argument("--in", dest="input", required=True, metavar="FILE.jsonl", help="export file to read")


def run(args: argparse.Namespace) -> int:
    from ..errors import bad_arg
    from ..transfer import import_store

    path = C.store_path(args)
    if C.store_exists(path):
        raise bad_arg("--store", "a new store directory (absent or empty; import never writes into an existing "
                      "store, to stay atomic)", str(path))
    res = import_store(path, args.input)
    print(f"imported {res.records} records in {len(res.namespaces)} namespace(s) and {len(res.rerankers)} reranker "
          f"file(s) into {path}" + (" (ids renumbered)" if res.renumbered else ""))
    return 0
