"""``memkern forget``: delete a whole namespace or one record (for users who ask to be forgotten).

Deleting a namespace removes every record in it (all versions and raw turns) and its reranker
state; deleting a record removes it and its history. The store is then compacted, so the deleted
data is no longer in its files.
"""
from __future__ import annotations

import argparse

from . import common as C


def configure(p: argparse.ArgumentParser) -> None:
    C.add_store_args(p, namespace=None)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--namespace", "-n", default=None, type=C.namespace_name,
                   help=f"delete this whole namespace ({C.NAMESPACE_RULE})")
    g.add_argument("--id", type=C.nonneg_int, default=None, help="delete this record")


def run(args: argparse.Namespace) -> int:
    path = C.store_path(args)
    with C.open_store(path, create=False) as store:
        return _run(args, store, path)


def _run(args: argparse.Namespace, store, path) -> int:
    if args.id is not None:
        rec = C.get_record(store, args.id)
        store.delete(args.id)
        store.compact()  # the deleted record leaves the store's files
        store.flush()
        print(f"deleted record #{args.id} (namespace {rec.namespace!r}, {len(rec.turns or [])} turns) from {path}")
    else:
        from ..store.bank import Bank

        n = Bank(store, args.namespace).reset()
        print(f"deleted namespace {args.namespace!r}: {n} records and its reranker state, from {path}")
    return 0
