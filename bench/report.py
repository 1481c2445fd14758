"""Run the benchmark suite and write one markdown report plus PNG charts of the ratios.

Used by ``memkern bench`` (``python/memkern/commands/bench.py``); also runnable as
``python bench/report.py [--quick] [--out bench/REPORT.md]``. Parts (``--parts``, default all):

* ``peers``: :mod:`bench_peers` (memkern vs hnswlib, faiss, chromadb);
* ``embedder``: :mod:`bench_embedder` (query embedding routes, latency + recall);
* ``rmm``: :func:`bench_rmm.respond_split` (``respond`` with the real MiniLM, torch vs onnx);
* ``memreread``: :func:`bench_memreread.compare_batched` (batched vs one at a time).

A part that fails (or whose optional packages are missing) is reported as such in the report;
the others still run. Every section states the command, the date, the machine and the versions.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
PARTS = ("peers", "embedder", "rmm", "memreread")


def _setup_env(threads: int = 1) -> None:
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(k, str(threads))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))


def run_part(name: str, quick: bool, n: int | None, queries: int | None, log=print) -> dict:
    """Run one part; returns ``{"name", "seconds", "markdown", "ratios", "raw"}``."""
    _setup_env()
    import numpy as np

    t0 = time.perf_counter()
    ratios: dict[str, float] = {}  # label -> memkern time / other time (< 1: memkern faster)
    if name == "peers":
        import bench_peers as P

        n_ = n or (10_000 if quick else 100_000)
        res = P.run(n=n_, n_queries=queries or (200 if quick else 1000), quick=quick, log=log)
        md = P.format_tables(res)
        mk = "memkern[always]"
        for p in res["peers"]:
            ratios[f"batched add vs {p}"] = P._paired(res["batched_add"]["comparison"], mk, p)
            ratios[f"1-at-a-time add vs {p}"] = P._paired(res["one_at_a_time"]["comparison"], mk, p)
            ratios[f"query p50 vs {p}"] = res["single_query"][mk]["p50_s"] / res["single_query"][p]["p50_s"]
            ratios[f"batch search 1T vs {p}"] = P._paired(res["batch_search_1"]["comparison"], mk, p)
            if "batch_search_all" in res:
                ratios[f"batch search allT vs {p}"] = P._paired(res["batch_search_all"]["comparison"], mk, p)
            ro = res["reopen"]["in_process"]
            ratios[f"reopen+query vs {p}"] = ro[mk]["open_first_query_s"] / ro[p]["open_first_query_s"]
        raw = P.to_jsonable(res)
        cmd_part = f"--n {n_}"
    elif name == "embedder":
        import bench_embedder as E

        res = E.run(quick=quick)
        md = E.format_tables(res)
        for k, v in res["latency"]["speedup_vs_torch"].items():
            if k != "torch":
                ratios[f"{k} vs torch"] = 1.0 / v
        raw = res
        cmd_part = ""
    elif name == "rmm":
        import bench_rmm as R

        res = R.respond_split(n_memories=10_000, n_queries=20 if quick else 40)
        md = R.format_respond_split(res)
        names = list(res["split_ms"])
        if len(names) > 1:
            ratios[f"respond: {names[1]} vs {names[0]}"] = 1.0 / res["comparison"].ratio
        raw = {k: (v.to_dict() if hasattr(v, "to_dict") else v) for k, v in res.items()}
        cmd_part = ""
    elif name == "memreread":
        import bench_memreread as MR
        import torch

        from memkern.models import tiny_chat_model

        torch.set_num_threads(1)
        r = MR.compare_batched(tiny_chat_model(seed=0), MR.QUICK if quick else MR.EQUAL, rounds=5)
        md = ("Tiny random 2-layer Llama (real SmolLM2 tokenizer), every call generated; decompose replies "
              "replaced by a sub-question so every item rereads once (see bench_memreread.py).\n\n"
              + MR.format_batched(r))
        ratios["MemReread batched vs one at a time"] = 1.0 / r["speedup"]
        raw = {k: (v.to_dict() if hasattr(v, "to_dict") else v) for k, v in r.items()}
        cmd_part = ""
    else:
        raise ValueError(f"part: expected one of {PARTS}, got {name!r}")
    del np
    return {"name": name, "seconds": time.perf_counter() - t0, "markdown": md, "ratios": ratios, "raw": raw,
            "args": cmd_part, "loadavg_after": [round(x, 2) for x in os.getloadavg()]}


TITLES = {
    "peers": "Store vs peers (`bench/bench_peers.py`)",
    "embedder": "Query embedding routes (`bench/bench_embedder.py`)",
    "rmm": "RMM `respond` with the real embedder (`bench/bench_rmm.py --respond-split`)",
    "memreread": "MemReread batched vs one at a time (`bench/bench_memreread.py`)",
}


def chart(part: dict, path: Path) -> Path | None:
    """Horizontal bars of time ratios (log scale; < 1: memkern / the new route is faster)."""
    if not part.get("ratios"):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(part["ratios"])
    vals = [part["ratios"][k] for k in labels]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(labels) + 1.2))
    colors = ["tab:green" if v <= 1.0 else "tab:red" for v in vals]
    ax.barh(range(len(vals)), vals, color=colors)
    ax.set_yticks(range(len(vals)), labels, fontsize=8)
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("time ratio (memkern or new route / other); < 1 is faster (green), > 1 behind (red)")
    ax.set_title(TITLES[part["name"]].split(" (")[0], fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(parts: list, path: Path, command: str, machine: dict, failures: dict) -> Path:
    import harness

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    L = ["# memkern benchmark report (generated)", "",
         f"Generated by `{command}`; do not edit by hand (rerun the command).", "",
         f"- date: {machine['date']}",
         f"- machine: {machine['cores']} cores ({machine['usable_cores']} usable), {machine['cpu']}, "
         f"load average at start {machine['loadavg']}; Python {machine['python']}",
         "- versions: " + ", ".join(f"{k} {v}" for k, v in machine["versions"].items() if v),
         f"- threads: {harness.thread_settings()} (each side's own thread setting is in its table)",
         "- method: interleaved rounds (A, B, A, B, ...) after a warm-up, median of the rounds with the IQR, "
         "CPU/wall per side (< 1 on a one-thread side: it waited for a core), and every comparison asserts "
         "that the sides computed the same thing (`bench/harness.py`).", ""]
    for p in parts:
        L += [f"## {TITLES[p['name']]}", "",
              f"Part run in {p['seconds']:.0f} s; load average after it: {p['loadavg_after']}.", "",
              p["markdown"], ""]
        png = path.parent / f"report-{p['name']}.png"
        try:
            if chart(p, png):
                L += [f"![{p['name']} ratios]({png.name})", ""]
        except Exception as e:  # noqa: BLE001 - a chart problem must not lose the tables
            L += [f"(chart not drawn: {type(e).__name__}: {e})", ""]
    for name, err in failures.items():
        L += [f"## {TITLES.get(name, name)}: not measured", "", "```", err.strip()[-1500:], "```", ""]
    path.write_text("\n".join(L))
    return path


def run_suite(quick: bool = True, parts=PARTS, out: Path = HERE / "REPORT.md", n: int | None = None,
              queries: int | None = None, command: str | None = None, log=print) -> tuple[Path, dict]:
    _setup_env()
    import harness

    machine = harness.machine_info()
    done, failures = [], {}
    for name in parts:
        log(f"[bench] {name} ...")
        try:
            done.append(run_part(name, quick, n, queries, log=log))
        except Exception:  # noqa: BLE001 - reported in the report, the other parts still run
            failures[name] = traceback.format_exc()
            log(f"[bench] {name} failed: {failures[name].strip().splitlines()[-1]}")
    cmd = command or ("memkern bench" + (" --quick" if quick else "") + (f" --n {n}" if n else ""))
    path = write_report(done, Path(out), cmd, machine, failures)
    raw = {"machine": machine, "command": cmd, "parts": {p["name"]: p["raw"] for p in done},
           "ratios": {p["name"]: p["ratios"] for p in done}, "failures": failures}
    js = Path(out).parent / "results" / (Path(out).stem.lower() + ".json")
    js.parent.mkdir(parents=True, exist_ok=True)
    js.write_text(json.dumps(raw, indent=1, default=str))
    raw["json"] = str(js)
    return path, raw


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--out", default=str(HERE / "REPORT.md"))
    ap.add_argument("--n", type=int, default=None)
    a = ap.parse_args(argv)
    path, raw = run_suite(a.quick, [p for p in a.parts.split(",") if p], Path(a.out), a.n)
    print(f"wrote {path}")
    return 1 if raw["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
