"""``memkern inspect``: print a store's memory bank (topics, versions, status)."""
from __future__ import annotations

import argparse
import json

from . import common as C


def configure(p: argparse.ArgumentParser) -> None:
    C.add_store_args(p)
    p.add_argument("--id", type=C.nonneg_int, default=None, help="show one record in full, with its versions and turns")
    p.add_argument("--history", action="store_true", help="also show previous versions")
    p.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    path = C.store_path(args)
    with C.open_store(path, create=False, read_only=True) as store:  # beside a running writer too
        return _run(args, store, path)


def _run(args: argparse.Namespace, store, path) -> int:
    if args.id is not None:
        rec = C.get_record(store, args.id)
        versions = store.history(args.id) if hasattr(store, "history") else [rec]
        if args.json:
            print(json.dumps([{"id": int(v.id), "version": int(v.version), "status": str(v.status),
                               "summary": v.summary, "turns": v.turns, "meta": v.meta} for v in versions], indent=1, default=str))
            return 0
        print(f"record #{rec.id} namespace {rec.namespace!r} version {rec.version} status {rec.status}")
        for v in versions:
            print(f"  v{v.version} [{v.status}] {v.summary}")
        print("  turns:")
        for t in rec.turns or []:
            print(f"    ({t.get('session_id')}:{t.get('turn_index')}) {t.get('role')}: {t.get('content')}")
        if rec.meta:
            print(f"  meta: {json.dumps(rec.meta, default=str)}")
        return 0
    namespaces = store.namespaces()
    from ..store.bank import Bank

    bank = Bank(store, args.namespace)
    if args.json:
        print(json.dumps({"namespaces": list(namespaces), "namespace": args.namespace, "records": bank.inspect()},
                         indent=1, default=str))
        return 0
    print(f"store {path}: namespaces {', '.join(map(str, namespaces)) or '(none)'}")
    C.print_bank(bank, history=args.history)
    return 0
