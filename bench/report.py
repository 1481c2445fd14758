"""Run the benchmark suite and write one markdown report plus PNG charts of the ratios.

Used by ``memkern bench`` (``python/memkern/cli/bench.py``); also runnable as
``python bench/report.py [--quick] [--out bench/REPORT.md]``. Parts (``--parts``, default all):

* ``peers``: :mod:`bench_peers` (memkern vs hnswlib, faiss, chromadb);
* ``namespaces``: :mod:`bench_namespaces` (many small namespaces: one store vs per-namespace peers);
* ``embedder``: :mod:`bench_embedder` (query embedding routes, latency + recall);
* ``rmm``: :func:`bench_rmm.respond_split` (``respond`` with the real MiniLM, torch vs onnx);
* ``memreread``: :func:`bench_memreread.compare_batched` (batched vs one at a time).

A part that fails (or whose optional packages are missing) is reported as such in the report;
the others still run. Every section states the command, the date, the machine and the versions.

``bench/RESULTS.md`` is generated, never edited by hand (:func:`assemble_results`): a fixed header,
a table of contents, the measured sections, one fragment file each under ``bench/sections/`` in the
order of :data:`SECTIONS`, then ``bench/REPORT.md`` (headings moved one level down). A bench script
refreshes its own fragment with ``--write-section`` (:func:`write_section`); ``memkern bench``
reassembles after a run and ``memkern bench --assemble`` reassembles without running anything.
Raw result JSON goes to ``bench/results/`` (not kept in git).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
PARTS = ("peers", "namespaces", "embedder", "rmm", "memreread")


def _setup_env(threads: int = 1) -> None:
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(k, str(threads))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))


def run_part(name: str, quick: bool, n: int | None, queries: int | None, log=print,
             namespaces: int | None = None) -> dict:
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
    elif name == "namespaces":
        import bench_namespaces as NS

        n_ns = namespaces or (300 if quick else 2000)
        res = NS.run(n_ns=n_ns, per=20, n_queries=queries or (200 if quick else 500), log=log)
        md = NS.format_tables(res)
        mk = "memkern[always]"
        for p in res["peers"]:
            ratios[f"add vs {p}"] = NS._paired(res["add"]["comparison"], mk, p)
            ratios[f"query p50 vs {p}"] = res["query"][mk]["p50_s"] / res["query"][p]["p50_s"]
            ro = res["reopen"]["in_process"]
            ratios[f"open+query vs {p}"] = ro[mk]["open_first_query_s"] / ro[p]["open_first_query_s"]
        raw = NS.to_jsonable(res)
        cmd_part = f"--namespaces {n_ns}"
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
    "namespaces": "Many small namespaces vs peers (`bench/bench_namespaces.py`)",
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
              queries: int | None = None, command: str | None = None, log=print,
              results: Path | None | bool = None, namespaces: int | None = None) -> tuple[Path, dict]:
    """Run ``parts``, write the report to ``out`` and reassemble RESULTS.md (``results``; default
    beside ``out``; ``False``: do not)."""
    _setup_env()
    import harness

    machine = harness.machine_info()
    done, failures = [], {}
    for name in parts:
        log(f"[bench] {name} ...")
        try:
            done.append(run_part(name, quick, n, queries, log=log, namespaces=namespaces))
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
    if results is not False:  # RESULTS.md beside the report, from this bench folder's fragments
        try:
            raw["results"] = str(write_results(HERE, Path(results) if results else Path(out).parent / "RESULTS.md", path))
        except SectionError as e:  # the measurements are kept (report + JSON); say why RESULTS.md was not
            raw["results"] = f"no RESULTS.md ({e})"
            failures["results"] = str(e)
    return path, raw


# ============================================================================ RESULTS.md
#: Fragments of ``bench/RESULTS.md`` (``bench/sections/<name>.md``), in the order they appear.
SECTIONS = (
    "store",               # bench_store.py: one namespace, memkern vs hnswlib + dict
    "many-tenants",        # bench_store.py: exact index per small namespace, crossover
    "namespaces",          # bench_namespaces.py --write-section: many small namespaces vs peers
    "namespaces-snapshot", # bench_namespaces.py --snapshot-stall --write-section: calls around a snapshot, close()
    "reranker-kernels",    # bench_reranker.py, gpu_check.py (the reranker engineer's)
    "rmm-latency",         # bench_rmm.py
    "memreread",           # bench_memreread.py
    "memory-experiments",  # memkern eval memory
    "stable-reranker",     # memkern eval memory + Reranker stability
    "crash",               # bench_crash.py
    "mutation",            # bench/mutation.py --write-section: the mutation score and survivors
    "reranker-trainer",    # issue 11 (the reranker engineer's)
    "reranker-capture",    # issue 11 part 2: capture mode, learning rerun, harness comparisons
    "suite",               # issue 16 summary: peers, embedder, respond split, MemReread
    "peers",               # bench_peers.py --write-section: the full-size peers tables
    "embedder",            # bench_embedder.py --write-section (optional until first written)
    "memreread-batched",   # bench_memreread.py --write-section (optional until first written)
    "realistic-data",      # issue 13 item 8: memkern eval memory on generate_dialogues vs generate_history
    "inmemory",            # bench_inmemory.py --write-section: InMemoryStore, AsyncMemoryStore, export/import
    "lexical",             # bench_lexical.py --write-section: lexical index, hybrid search, filters (issue 13 items 5-7)
    "retrieval",           # issue 13 items 1-4: memkern eval memory retrieval (template, TextTiling, RMM default)
    "retrieval-locomo",    # memkern eval memory retrieval --locomo ... --write-section: real-data rows, ablations, CIs
    "ray",                 # bench_ray.py --write-section: Ray scale-out (issue 15)
    "adapters",            # bench_adapters.py --write-section: telemetry hook cost, LangGraph store vs InMemoryStore
    "serve",               # bench_serve.py --write-section: memkern serve under concurrent HTTP load
    "retrieval-hybrid",    # bench_retrieval_hybrid.py --write-section: hybrid turn score + a * parent (issue 13)
    "time-retrieval",      # bench_time.py --write-section: the time term on LoCoMo (issue 22 item 3)
    "conflicting-facts",   # bench_contradict.py --write-section: contradiction detector and supersede (issue 22 item 5)
    "learning",            # memkern eval memory learning: greedy reads, exploration only to learn (LoCoMo dev)
)
#: Listed fragments that may be absent (written only once their script runs with --write-section).
OPTIONAL_SECTIONS = frozenset({"embedder", "memreread-batched", "retrieval-locomo"})

RESULTS_INTRO = """Figures measured on the project's machine kind (2 cores, x86_64, no GPU) unless a section says
otherwise. These machines are shared and noisy: compare ratios measured inside one run, not
absolute times across sections. Each section gives the command that produced it and the date."""

RAW_JSON_NOTE = ("Raw result JSON is written by the command to `bench/results/` and is not kept in git; "
                 "the tables here are the record.")


class SectionError(ValueError):
    """A fragment of RESULTS.md is missing, unknown or malformed."""


def _slug(title: str, seen: dict) -> str:
    """The anchor a markdown renderer (GitHub) gives a heading."""
    s = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
    n = seen.get(s, 0)
    seen[s] = n + 1
    return s if n == 0 else f"{s}-{n}"


def read_sections(sections_dir: Path = HERE / "sections") -> list[tuple[str, str]]:
    """``[(name, text)]`` of every fragment in :data:`SECTIONS` order; each must start with ``## ``.

    Raises :class:`SectionError` for a missing fragment, a file that is not listed in
    :data:`SECTIONS` (it would silently drop out of RESULTS.md) or a fragment without its heading.
    """
    d = Path(sections_dir)
    if not d.is_dir():
        raise SectionError(f"sections_dir: expected a folder of <name>.md fragments, got {str(d)!r} (not a folder)")
    present = {p.stem for p in d.glob("*.md")}
    unknown = sorted(present - set(SECTIONS))
    if unknown:
        raise SectionError(f"sections_dir: fragments not listed in bench/report.py SECTIONS: {unknown} "
                           f"(add them to SECTIONS in the order they belong)")
    missing = [n for n in SECTIONS if n not in present and n not in OPTIONAL_SECTIONS]
    if missing:
        raise SectionError(f"sections_dir: expected a fragment for every name in SECTIONS, missing {missing} in {str(d)!r}")
    out = []
    for n in SECTIONS:
        if n not in present:
            continue
        text = (d / f"{n}.md").read_text(encoding="utf-8")
        if not text.startswith("## "):
            raise SectionError(f"fragment {n}.md: expected it to start with a '## ' heading, got {text[:40]!r}")
        out.append((n, text.rstrip("\n") + "\n"))
    return out


def _demote(report_md: str) -> tuple[str, str]:
    """REPORT.md's body with every heading one level down; returns ``(title, text)``."""
    lines = report_md.rstrip("\n").split("\n")
    out, title, fence = [], "Generated report", False
    for line in lines:
        if line.startswith("```"):
            fence = not fence
        if not fence and re.match(r"#{1,5} ", line):
            if line.startswith("# "):
                title = line[2:].strip()
            line = "#" + line
        out.append(line)
    return title, "\n".join(out) + "\n"


def assemble_results(bench_dir: Path = HERE, report: Path | None = None) -> str:
    """The text of ``bench/RESULTS.md``: generated header, contents, fragments, then the report.

    Deterministic: it depends only on the files (no clock, no machine), so a committed
    RESULTS.md that differs from it was edited by hand.
    """
    bench_dir = Path(bench_dir)
    report = Path(report) if report is not None else bench_dir / "REPORT.md"
    if not report.is_file():
        raise SectionError(f"report: expected the generated report {str(report)!r} (run `memkern bench` first)")
    sections = read_sections(bench_dir / "sections")
    rtitle, rtext = _demote(report.read_text(encoding="utf-8"))
    seen: dict = {}
    toc = []
    for n, text in sections:
        title = text.split("\n", 1)[0][3:].strip()
        toc.append(f"- [{title}](#{_slug(title, seen)}) (`bench/sections/{n}.md`)")
    toc.append(f"- [{rtitle}](#{_slug(rtitle, seen)}) (`{report.name}`)")
    L = ["# Measured results", "",
         "<!-- Generated by `memkern bench --assemble` from bench/sections/*.md and bench/REPORT.md. "
         "Do not edit by hand: tests/test_bench_command.py fails when this file differs. -->", "",
         "Generated by `memkern bench` (after a run) or `memkern bench --assemble` (runs nothing) from one "
         "fragment per measured section in `bench/sections/` (fixed order: `SECTIONS` in `bench/report.py`) "
         "and the generated report `bench/REPORT.md`. Do not edit this file: edit or regenerate the fragment "
         "(`--write-section` of the bench script that measured it) and reassemble.", "",
         RESULTS_INTRO, "", RAW_JSON_NOTE, "", "## Contents", ""] + toc + [""]
    body = "\n".join(L) + "\n" + "\n".join(t for _, t in sections) + "\n" + rtext
    return body


def write_results(bench_dir: Path = HERE, out: Path | None = None, report: Path | None = None) -> Path:
    out = Path(out) if out is not None else Path(bench_dir) / "RESULTS.md"
    text = assemble_results(bench_dir, report)
    out.write_text(text, encoding="utf-8")
    return out


def write_section(name: str, title: str, body: str, command: str, machine: dict | None = None,
                  raw_json: str | None = None, sections_dir: Path = HERE / "sections") -> Path:
    """Write (or refresh) the fragment ``bench/sections/<name>.md`` of a bench script's measurement.

    The fragment states the command, the date, the machine and the versions, then ``body`` (the
    script's own tables). ``raw_json``: where the command wrote its raw numbers (stated, with "not
    kept in git"). Reassemble RESULTS.md afterwards (``memkern bench --assemble``).
    """
    if name not in SECTIONS:
        raise SectionError(f"name: expected one of {list(SECTIONS)}, got {name!r}")
    if not isinstance(title, str) or not title.strip() or "\n" in title:
        raise SectionError(f"title: expected a one-line, non-empty heading, got {title!r}")
    import harness

    m = machine or harness.machine_info()
    vers = ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v)
    L = [f"## {title.strip()}", "",
         f"Command: `{command}`. Measured {m['date']} on {m['cores']} cores ({m['usable_cores']} usable; "
         f"{m['cpu']}), load average at start {m['loadavg']}, Python {m['python']}; versions: {vers}. "
         f"Generated by the command's `--write-section`: rerun it rather than editing this text.", ""]
    if raw_json:
        L += [f"Raw JSON: written by the command to `{raw_json}`, not kept in git.", ""]
    L.append(body.strip("\n"))
    d = Path(sections_dir)
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"{name}.md"
    p.write_text("\n".join(L) + "\n", encoding="utf-8")
    return p


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--out", default=str(HERE / "REPORT.md"))
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--assemble", action="store_true", help="only regenerate RESULTS.md (runs nothing)")
    a = ap.parse_args(argv)
    if a.assemble:
        print(f"wrote {write_results(HERE, report=Path(a.out))}")
        return 0
    path, raw = run_suite(a.quick, [p for p in a.parts.split(",") if p], Path(a.out), a.n)
    print(f"wrote {path} and {raw['results']}")
    return 1 if raw["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
