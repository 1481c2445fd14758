"""``memkern models setup | list``: prepare and show the offline default models."""
from __future__ import annotations

import argparse
import json
import os


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="models_action", metavar="ACTION")
    p = sub.add_parser("setup", help="convert/check the offline default models once (no model hub)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p = sub.add_parser("list", help="show which default models are installed, converted, and where")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from ..models import list_models, setup_default_models

    action = getattr(args, "models_action", None) or "list"
    if action == "setup":
        info = setup_default_models(progress=not args.quiet)  # failures: one-line error, exit 1
        print(f"embedder    : {info['embedder']} (dim {info['embedder_dim']})")
        print(f"chat model  : {info['chat_model']} (context {info['chat_context_length']} tokens)")
        print(f"cache folder: {info['cache_dir']}")
        print("step seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in info["seconds"].items()))
        return 0
    rows = list_models()
    if getattr(args, "json", False):
        print(json.dumps(rows, indent=1))
        return 0
    for r in rows:
        print(f"{r['name']}  [{r['role']}]  status: {r['status']}")
        print(f"    package: {r['package']}")
        print(f"    source : {r['source']}")
        if r["cache"]:
            print(f"    cache  : {r['cache']}")
    return 0 if all(r["status"] == "ready" for r in rows[:2]) else 1
