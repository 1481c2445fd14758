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

``bench/RESULTS.md`` is generated, never edited by hand (:func:`assemble_results`): a summary with
one table of headline figures per area, read from the front matter of the area's fragment under
``bench/sections/`` (in the order of :data:`SECTIONS`), then ``bench/REPORT.md``'s, each with its
command, date and machine and a link to the full text. A bench script
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


def write_report(parts: list, path: Path, command: str, machine: dict, failures: dict,
                 skipped: dict | None = None) -> Path:
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
    for name, why in (skipped or {}).items():
        L += [f"## {TITLES.get(name, name)}: skipped", "", why, ""]
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
    done, failures, skipped = [], {}, {}
    for name in parts:
        log(f"[bench] {name} ...")
        try:
            done.append(run_part(name, quick, n, queries, log=log, namespaces=namespaces))
        except harness.NoPeers as e:  # nothing to compare with: skipped, as documented
            skipped[name] = str(e)
            log(f"[bench] {e}")
        except Exception:  # noqa: BLE001 - reported in the report, the other parts still run
            failures[name] = traceback.format_exc()
            log(f"[bench] {name} failed: {failures[name].strip().splitlines()[-1]}")
    cmd = command or ("memkern bench" + (" --quick" if quick else "") + (f" --n {n}" if n else ""))
    path = write_report(done, Path(out), cmd, machine, failures, skipped)
    raw = {"machine": machine, "command": cmd, "parts": {p["name"]: p["raw"] for p in done},
           "ratios": {p["name"]: p["ratios"] for p in done}, "failures": failures, "skipped": skipped}
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
    "reranker-kernels",    # bench_reranker.py, gpu_check.py
    "rmm-latency",         # bench_rmm.py
    "memreread",           # bench_memreread.py
    "memory-experiments",  # memkern eval memory
    "stable-reranker",     # memkern eval memory + Reranker stability
    "crash",               # bench_crash.py
    "mutation",            # bench/mutation.py --write-section: the mutation score and survivors
    "reranker-trainer",    # the reranker trainer: sync-free step, op counts
    "reranker-capture",    # capture mode, learning rerun, harness comparisons
    "reranker-native",     # bench_reranker.py --select-update --write-section: the fused CPU path at small batches
    "suite",               # suite summary: peers, embedder, respond split, MemReread
    "peers",               # bench_peers.py --write-section: the full-size peers tables
    "embedder",            # bench_embedder.py --write-section (optional until first written)
    "memreread-batched",   # bench_memreread.py --write-section (optional until first written)
    "realistic-data",      # memkern eval memory on generate_dialogues vs generate_history
    "inmemory",            # bench_inmemory.py --write-section: InMemoryStore, AsyncMemoryStore, export/import
    "lexical",             # bench_lexical.py --write-section: lexical index, hybrid search, filters
    "retrieval",           # memkern eval memory retrieval (template, TextTiling, RMM default)
    "retrieval-locomo",    # memkern eval memory retrieval --locomo ... --write-section: real-data rows, ablations, CIs
    "ray",                 # bench_ray.py --write-section: Ray scale-out
    "adapters",            # bench_adapters.py --write-section: telemetry hook cost, LangGraph store vs InMemoryStore
    "serve",               # bench_serve.py --write-section: memkern serve under concurrent HTTP load
    "serve-search",        # bench_serve.py --mix search --compare route --write-section: the search curve
    "scaling",             # bench_scaling.py --write-section: store, RMM, MemReread cost against size
    "retrieval-hybrid",    # bench_retrieval_hybrid.py --write-section: hybrid turn score + a * parent
    "time-retrieval",      # bench_time.py --write-section: the time term on LoCoMo
    "conflicting-facts",   # bench_contradict.py --write-section: contradiction detector and supersede
    "learning",            # memkern eval memory learning: greedy reads, exploration only to learn (LoCoMo dev)
    "group-commit",        # bench_group_commit.py --write-section: durable writes from many threads
    "single-query",        # bench_single.py --write-section: single query and reopen vs raw hnswlib
)
#: Listed fragments that may be absent (written only once their script runs with --write-section).
OPTIONAL_SECTIONS = frozenset({"embedder", "memreread-batched", "retrieval-locomo", "serve-search", "scaling",
                               "single-query"})

RESULTS_INTRO = """How the figures are made: every comparison runs its sides interleaved in one process on one
machine (the project's machine kind: 2 shared x86_64 cores, no GPU, unless an area says
otherwise), pins threads, and asserts that both sides computed the same thing before timing them.
The machines are shared and noisy: compare the ratios inside one table, not absolute times across
areas. Quality is measured on real conversations (the LoCoMo development split) where an area
says so; generated data is for tests. Where memkern is behind, the table says so."""

#: Front matter keys of a section (``headline`` may have no rows; the others need a value).
FRONT_KEYS = ("area", "command", "date", "machine", "headline")
#: Columns of an area's headline table (each headline row gives the four).
HEADLINE_COLUMNS = ("what", "memkern", "versus", "ratio")

#: What a results file, a section or a docs page must not contain: machine paths and the
#: project's process history (they belong in git, not in what users read).
HYGIENE = (
    ("a machine path", re.compile(r"(?<![\w.])/(?:work|home|tmp|root)/|\.venv/lib|site-packages")),
    ("process history", re.compile(r"\bissues? #?\d+(?: and \d+)?\b|\bwave ?\d|\bw\d+/|\bbranch\b|"
                                   r"\bworktrees?\b|\bother (?:engineers|helpers)\b", re.I)),
)


class SectionError(ValueError):
    """A fragment of RESULTS.md is missing, unknown or malformed."""


def hygiene_problems(text: str) -> list[str]:
    """``["<kind> 'match' (line N)", ...]`` for every machine path or process-history phrase in
    ``text`` (see :data:`HYGIENE`); empty when clean."""
    out = []
    for kind, rx in HYGIENE:
        for m in rx.finditer(text):
            out.append(f"{kind} {m.group(0)!r} (line {text.count(chr(10), 0, m.start()) + 1})")
    return out


def _slug(title: str, seen: dict) -> str:
    """The anchor a markdown renderer (GitHub) gives a heading."""
    s = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
    n = seen.get(s, 0)
    seen[s] = n + 1
    return s if n == 0 else f"{s}-{n}"


def parse_front_matter(name: str, text: str) -> tuple[dict, str]:
    """``(meta, body)`` of a fragment that starts with a front matter block::

        ---
        area: Store
        command: "OMP_NUM_THREADS=1 python -m pytest bench/bench_store.py -q -s"
        date: 2026-11-30
        machine: 2 cores, Intel Xeon, no GPU, Python 3.11.7, torch 2.13.0+cpu
        headline:
          - ["search, 100k x 384, k=10", "31.1 us", "hnswlib 33.9 us", "0.92"]
        ---

    A subset of YAML: one ``key: value`` a line (a value starting with ``"`` is a JSON string),
    ``headline`` a list of JSON arrays of four strings (:data:`HEADLINE_COLUMNS`). Every number of
    a headline's figures must appear in the section's text (figures are quoted, never typed in).
    Raises :class:`SectionError` naming the fragment and the line.
    """
    where = f"fragment {name}.md"
    if not text.startswith("---\n"):
        raise SectionError(f"{where}: expected a front matter block ('---' line, {', '.join(FRONT_KEYS)}, '---'), "
                           f"got {text[:40]!r}")
    end = text.find("\n---\n", 3)
    if end < 0:
        raise SectionError(f"{where}: expected the front matter to end with a '---' line, got none")
    meta: dict = {}
    key = None
    for i, line in enumerate(text[4:end].split("\n"), start=2):
        if line.startswith("  - ") and key == "headline":
            try:
                row = json.loads(line[4:])
            except json.JSONDecodeError as e:
                raise SectionError(f"{where}, line {i}: expected a JSON array of 4 strings, got {line[4:]!r} ({e})")
            if not (isinstance(row, list) and len(row) == 4 and all(isinstance(c, str) for c in row)):
                raise SectionError(f"{where}, line {i}: expected a headline of 4 strings {list(HEADLINE_COLUMNS)}, "
                                   f"got {row!r}")
            meta["headline"].append(row)
            continue
        k, sep, v = line.partition(":")
        if not sep or k not in FRONT_KEYS or k in meta:
            raise SectionError(f"{where}, line {i}: expected one of {list(FRONT_KEYS)} once as 'key: value', "
                               f"got {line!r}")
        key, v = k, v.strip()
        if k == "headline":
            if v:
                raise SectionError(f"{where}, line {i}: expected the headline rows on the lines below, got {v!r}")
            meta["headline"] = []
            continue
        if not v:
            raise SectionError(f"{where}, line {i}: expected a value for {k!r}, got none")
        try:
            meta[k] = json.loads(v) if v.startswith('"') else v
        except json.JSONDecodeError as e:
            raise SectionError(f"{where}, line {i}: expected a JSON string for {k!r}, got {v!r} ({e})")
    missing = [k for k in FRONT_KEYS if k not in meta]
    if missing:
        raise SectionError(f"{where}: expected front matter keys {missing}, got none")
    body = text[end + 5:].lstrip("\n")
    if not body.startswith("## "):
        raise SectionError(f"{where}: expected its text to start with a '## ' heading, got {body[:40]!r}")
    flat = body.replace(",", "")
    for row in meta["headline"]:
        for cell in row[1:]:
            for num in re.findall(r"\d+(?:[.,]\d+)*", cell):
                if num.replace(",", "") not in flat:
                    raise SectionError(f"{where}: headline {row[0]!r}: expected its figures to be quoted from the "
                                       f"section, got {num} (not in the section)")
    return meta, body


def read_sections(sections_dir: Path = HERE / "sections") -> list[tuple[str, dict, str]]:
    """``[(name, meta, body)]`` of every fragment in :data:`SECTIONS` order
    (:func:`parse_front_matter`).

    Raises :class:`SectionError` for a missing fragment, a file that is not listed in
    :data:`SECTIONS` (it would silently drop out of RESULTS.md), a malformed fragment, or one that
    names a machine path or process history (:func:`hygiene_problems`).
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
        bad = hygiene_problems(text)
        if bad:
            raise SectionError(f"fragment {n}.md: expected no machine paths or process history, got {bad[:3]}")
        meta, body = parse_front_matter(n, text)
        out.append((n, meta, body))
    return out


def _report_meta(report_md: str) -> dict:
    """Title, command, date and machine stated at the top of the generated REPORT.md."""
    title = next((ln[2:].strip() for ln in report_md.splitlines() if ln.startswith("# ")), "Benchmark report")
    cmd = re.search(r"Generated by `([^`]+)`", report_md)
    date = re.search(r"^- date: (.+)$", report_md, re.M)
    machine = re.search(r"^- machine: (.+)$", report_md, re.M)
    if not (cmd and date and machine):
        raise SectionError("report: expected REPORT.md to state its command, '- date:' and '- machine:', got "
                           f"{report_md[:80]!r}")
    mach = re.sub(r", load average at start \[[^\]]*\]", "", machine.group(1)).strip()
    return {"area": title, "command": cmd.group(1), "date": date.group(1).strip(), "machine": mach}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _area(meta: dict, link: str, rows: list) -> list[str]:
    L = [f"## {meta['area']}", ""]
    if rows:
        L += ["| " + " | ".join(HEADLINE_COLUMNS) + " |", "|" + "---|" * len(HEADLINE_COLUMNS)]
        L += ["| " + " | ".join(_cell(c) or "—" for c in row) + " |" for row in rows]
    else:
        L += ["No headline figures in this area's front matter: its full text has the tables."]
    L += ["", f"- Command: `{meta['command']}`", f"- Measured: {meta['date']}; {meta['machine']}",
          f"- Full text: [{link}]({link})", ""]
    return L


def assemble_results(bench_dir: Path = HERE, report: Path | None = None) -> str:
    """The text of ``bench/RESULTS.md``: per area (a fragment of ``bench/sections/`` in
    :data:`SECTIONS` order, then the generated report) its headline table, command, date and
    machine, and a link to its full text.

    Deterministic: it depends only on the files (no clock, no machine), so a committed
    RESULTS.md that differs from it was edited by hand.
    """
    bench_dir = Path(bench_dir)
    report = Path(report) if report is not None else bench_dir / "REPORT.md"
    if not report.is_file():
        raise SectionError(f"report: expected the generated report {str(report)!r} (run `memkern bench` first)")
    sections = read_sections(bench_dir / "sections")
    report_text = report.read_text(encoding="utf-8")
    bad = hygiene_problems(report_text)
    if bad:
        raise SectionError(f"report: expected no machine paths or process history in {report.name}, got {bad[:3]}")
    areas = [(meta, f"sections/{n}.md", meta["headline"]) for n, meta, _ in sections]
    areas.append((_report_meta(report_text), report.name, []))
    seen: dict = {}
    L = ["# Measured results", "",
         "<!-- Generated by `memkern bench --assemble` from the front matter of bench/sections/*.md and "
         "bench/REPORT.md: do not edit (tests/cli/test_bench_command.py fails when this file differs). -->", "",
         RESULTS_INTRO, "",
         "One table per area: its headline figures (quoted from the area's full text, which has every "
         "table, the method and the caveats), the command that produced them, the date and the machine. "
         "Raw result JSON is written by the commands to `bench/results/` and is not kept in git.", "",
         "## Areas", ""]
    L += [f"- [{meta['area']}](#{_slug(meta['area'], seen)})" for meta, _, _ in areas] + [""]
    for meta, link, rows in areas:
        L += _area(meta, link, rows)
    return "\n".join(L).rstrip("\n") + "\n"


def write_results(bench_dir: Path = HERE, out: Path | None = None, report: Path | None = None) -> Path:
    out = Path(out) if out is not None else Path(bench_dir) / "RESULTS.md"
    text = assemble_results(bench_dir, report)
    out.write_text(text, encoding="utf-8")
    return out


def front_matter(area: str, command: str, date: str, machine: str, headline=()) -> str:
    """The front matter block :func:`parse_front_matter` reads (``headline``: rows of 4 cells)."""
    L = ["---", f"area: {area}", f"command: {json.dumps(command, ensure_ascii=False)}", f"date: {date}",
         f"machine: {machine}", "headline:"]
    for row in headline or ():
        row = [str(c) for c in row]
        if len(row) != 4:
            raise SectionError(f"headline: expected rows of 4 cells {list(HEADLINE_COLUMNS)}, got {row!r}")
        L.append("  - " + json.dumps(row, ensure_ascii=False))
    return "\n".join(L + ["---"]) + "\n"


def write_section(name: str, title: str, body: str, command: str, machine: dict | None = None,
                  raw_json: str | None = None, sections_dir: Path = HERE / "sections",
                  headline=None, area: str | None = None) -> Path:
    """Write (or refresh) the fragment ``bench/sections/<name>.md`` of a bench script's measurement.

    The fragment starts with its front matter (:func:`front_matter`: ``area``, default ``title``;
    the command, the date, the machine; ``headline``, rows of ``(what, memkern, versus, ratio)``
    quoted from ``body``), then states the command, the date, the machine and the versions, then
    ``body`` (the script's own tables). ``raw_json``: where the command wrote its raw numbers
    (stated, with "not kept in git"). Reassemble RESULTS.md afterwards (``memkern bench
    --assemble``).
    """
    if name not in SECTIONS:
        raise SectionError(f"name: expected one of {list(SECTIONS)}, got {name!r}")
    if not isinstance(title, str) or not title.strip() or "\n" in title:
        raise SectionError(f"title: expected a one-line, non-empty heading, got {title!r}")
    import harness

    m = machine or harness.machine_info()
    vers = ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v)
    head = front_matter((area or title).strip(), command, m["date"],
                        f"{m['cores']} cores ({m['usable_cores']} usable; {m['cpu']}), Python {m['python']}; {vers}",
                        headline)
    L = [f"## {title.strip()}", "",
         f"Command: `{command}`. Measured {m['date']} on {m['cores']} cores ({m['usable_cores']} usable; "
         f"{m['cpu']}), load average at start {m['loadavg']}, Python {m['python']}; versions: {vers}. "
         f"Generated by the command's `--write-section`: rerun it rather than editing this text.", ""]
    if raw_json:
        L += [f"Raw JSON: written by the command to `{raw_json}`, not kept in git.", ""]
    L.append(body.strip("\n"))
    text = head + "\n".join(L) + "\n"
    parse_front_matter(name, text)  # what RESULTS.md reads back (headline figures quoted from the body)
    d = Path(sections_dir)
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"{name}.md"
    p.write_text(text, encoding="utf-8")
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
