"""``memkern export``: write a store (or some of its namespaces) to a JSON Lines file.

Records with every version, turns, meta, timestamps, status and links, the embeddings (exact
float32, unless ``--no-embeddings``) and the namespaces' reranker state; format in
:mod:`memkern.store.transfer`. ``memkern import`` reads it back.
"""
from __future__ import annotations

import argparse

from . import common as C


def configure(p: argparse.ArgumentParser) -> None:
    C.add_store_args(p, namespace=None)
    p.add_argument("--out", required=True, metavar="FILE.jsonl", help="file to write (replaced atomically)")
    p.add_argument("--namespace", "-n", action="append", default=None, type=C.namespace_name, metavar="NS",
                   help=f"export only this namespace (repeatable; default: all; {C.NAMESPACE_RULE})")
    p.add_argument("--no-embeddings", action="store_true",
                   help="leave the vectors out (smaller file; an import then embeds the texts again)")


def run(args: argparse.Namespace) -> int:
    from ..store.transfer import export_store

    path = C.store_path(args)
    with C.open_store(path, create=False, read_only=True) as store:  # a backup of a live store too
        stats = export_store(store, args.out, namespaces=args.namespace, embeddings=not args.no_embeddings)
    print(f"exported {stats['records']} records from {len(stats['namespaces'])} namespace(s) and "
          f"{len(stats['rerankers'])} reranker file(s) of {path} to {args.out}")
    return 0
