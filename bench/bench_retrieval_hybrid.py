"""Hybrid turn score + parent topic: ``memkern eval memory retrieval``'s ``hybrid (content)+{a}*{parent}`` rows.

Measurement only (issue 13): no default changes. Runs ``memkern eval memory retrieval --no-rmm``
(the CLI itself, in this process) on the realistic dialogues and on the old generated data, on
tuning seeds (``--tune-seeds``, default 100-104, dialogues only) and on evaluation seeds
(``--seeds``, default 0-4, both data kinds), then writes a fragment with

* every row's mean Recall@5/10/20 over the evaluation seeds, per data kind;
* per-seed paired differences (mean [min, max] over the seeds) of every hybrid row against
  ``turn+1*texttiling`` (RMM's two-level default);
* the best new row, chosen on the tuning dialogues by the mean of R@5/10/20, and its paired
  differences against ``turn+1*texttiling`` on the evaluation seeds.

Run: ``OMP_NUM_THREADS=1 python bench/bench_retrieval_hybrid.py [--users 6] [--sessions 20]
[--seeds 0 1 2 3 4] [--tune-seeds 100 101 102 103 104] [--alphas 0.5 1 2] [--out DIR]
[--from-json dialogues=P,generated=P,tune=P] [--write-section]``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

REFERENCE = "turn+1*texttiling"
NEW_PREFIX = "hybrid (content)+"
BUDGETS = (5, 10, 20)


def run_cli(data: str, users: int, sessions: int, seeds, alphas, out: Path) -> Path:
    """``memkern eval memory retrieval`` once; the path of its result JSON."""
    from memkern.cli import main

    out.mkdir(parents=True, exist_ok=True)
    argv = ["eval", "memory", "retrieval", "--data", data, "--users", str(users), "--sessions", str(sessions),
            "--seeds", *map(str, seeds), "--alphas", *map(str, alphas), "--no-rmm", "--out", str(out), "--quiet"]
    if main(argv) != 0:
        raise SystemExit(f"memkern {' '.join(argv)} failed")
    (p,) = sorted(out.glob("retrieval-*.json"))[-1:]
    return p


def per_seed(res: dict) -> dict[str, list[list[float]]]:
    """``{row: [[R@5, R@10, R@20] per seed]}``."""
    out: dict[str, list[list[float]]] = {}
    for run in res["per_seed"]:
        for name, m in run["metrics"].items():
            out.setdefault(name, []).append([float(m[f"recall@{b}turns"]) for b in BUDGETS])
    return out


def mean(xs) -> float:
    return sum(xs) / len(xs)


def paired(a: list[list[float]], b: list[list[float]]) -> list[tuple[float, float, float]]:
    """Per budget: (mean, min, max) over the seeds of ``a - b``."""
    out = []
    for j in range(len(BUDGETS)):
        d = [x[j] - y[j] for x, y in zip(a, b)]
        out.append((mean(d), min(d), max(d)))
    return out


def best_new_row(res: dict) -> str:
    rows = per_seed(res)
    new = [n for n in rows if n.startswith(NEW_PREFIX)]
    return max(new, key=lambda n: (mean([mean(s) for s in rows[n]]), n))


def table(res: dict, best: str) -> list[str]:
    rows = per_seed(res)
    ref = rows[REFERENCE]
    L = ["| row | R@5 | R@10 | R@20 | " + " | ".join(f"R@{b} - {REFERENCE}" for b in BUDGETS) + " |",
         "|---|---|---|---|" + "---|" * len(BUDGETS)]
    for name, s in rows.items():
        ms = [mean([x[j] for x in s]) for j in range(len(BUDGETS))]
        label = f"**{name}**" if name == best else name
        if name.startswith("hybrid") or name == REFERENCE:
            diffs = " | ".join(f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]" for m, lo, hi in paired(s, ref))
        else:
            diffs = " | ".join("" for _ in BUDGETS)
        L.append(f"| {label} | " + " | ".join(f"{m:.3f}" for m in ms) + f" | {diffs} |")
    return L


def describe(res: dict) -> str:
    ds = res["dataset"]
    seeds = [d["meta"]["seed"] for d in ds]
    return (f"seeds {', '.join(map(str, seeds))}: {ds[0]['conversations']} conversations each, "
            f"{sum(d['turns'] for d in ds)} turns, {sum(d['questions'] for d in ds)} questions")


def tune_table(res: dict) -> list[str]:
    """Mean R@5/10/20 of the hybrid rows and the reference on the tuning seeds (the choice)."""
    rows = per_seed(res)
    L = ["| row (tuning dialogues) | R@5 | R@10 | R@20 | mean |", "|---|---|---|---|---|"]
    for name, s in rows.items():
        if name.startswith("hybrid") or name == REFERENCE:
            ms = [mean([x[j] for x in s]) for j in range(len(BUDGETS))]
            L.append(f"| {name} | " + " | ".join(f"{m:.3f}" for m in ms) + f" | {mean(ms):.3f} |")
    return L


def section(results: dict[str, dict], best: str, tune_line: str, tune: dict) -> str:
    L = ["Rows of `memkern eval memory retrieval` (python/memkern/eval/retrieval.py): "
         "`hybrid (content)` is the store's default hybrid search (coverage fusion, lexical weight 0.35) "
         "over turn records whose text is the templated turn and whose vector embeds the content only, "
         "asked for the top 20; `hybrid (content, all turns)` is the same search asked for every turn of "
         "the conversation (k = its turn count; the dense min-max normalisation then runs over all turns), "
         "ranked by the fused score the store returns; `hybrid (content)+{a}*{parent}` ranks "
         "that fused score + a * cos(question, parent), the parent being the turn's fixed 4-turn window or "
         "TextTiling topic (as in the `turn+{a}*{parent}` rows, whose turn score is the cosine of the "
         "templated turn). Measurement only: no default uses these rows.",
         "",
         f"Best new row (chosen on the tuning dialogues, {tune_line}, by the mean of R@5/10/20): **{best}**. "
         f"Differences are per seed against `{REFERENCE}` (RMM's two-level default), shown as mean [min, max] "
         "over the seeds; rows other than the hybrid ones show only their means.", ""]
    L += tune_table(tune) + [""]
    for kind, res in results.items():
        L += [f"### {kind} (evaluation {describe(res)})", ""]
        L += table(res, best)
        rows = per_seed(res)
        d = paired(rows[best], rows[REFERENCE])
        L += ["", f"{best} - {REFERENCE} on {kind}: " +
              ", ".join(f"R@{b} {m:+.3f} [{lo:+.3f}, {hi:+.3f}]" for b, (m, lo, hi) in zip(BUDGETS, d)) + ".", ""]
        d = paired(rows["hybrid (content, all turns)"], rows["hybrid (content)"])
        L += [f"hybrid (content, all turns) - hybrid (content) on {kind} (what asking the store for every turn "
              "instead of the top 20 does to the fused ranking, before any parent term): " +
              ", ".join(f"R@{b} {m:+.3f} [{lo:+.3f}, {hi:+.3f}]" for b, (m, lo, hi) in zip(BUDGETS, d)) + ".", ""]
    return "\n".join(L)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--users", type=int, default=6)
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--tune-seeds", type=int, nargs="+", default=[100, 101, 102, 103, 104])
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    ap.add_argument("--out", default=None, help="folder for the CLI's result JSON (default: a temporary one)")
    ap.add_argument("--from-json", default=None,
                    help="dialogues=PATH,generated=PATH,tune=PATH: earlier CLI results instead of running")
    ap.add_argument("--write-section", action="store_true")
    a = ap.parse_args(argv)
    alphas = [f"{x:g}" for x in a.alphas]
    if a.from_json:
        paths = dict(kv.split("=", 1) for kv in a.from_json.split(","))
    else:
        out = Path(a.out or tempfile.mkdtemp(prefix="retrieval-hybrid-"))
        paths = {"tune": run_cli("dialogues", a.users, a.sessions, a.tune_seeds, alphas, out / "tune"),
                 "dialogues": run_cli("dialogues", a.users, a.sessions, a.seeds, alphas, out / "dialogues"),
                 "generated": run_cli("generated", a.users, a.sessions, a.seeds, alphas, out / "generated")}
    res = {k: json.loads(Path(p).read_text()) for k, p in paths.items()}
    best = best_new_row(res["tune"])
    body = section({"dialogues": res["dialogues"], "generated": res["generated"]}, best, describe(res["tune"]),
                   res["tune"])
    print(body)
    if a.write_section:
        import report

        common = (f"--users {a.users} --sessions {a.sessions} --alphas {' '.join(alphas)} --no-rmm")
        cmd = (f"OMP_NUM_THREADS=1 .venv/bin/memkern eval memory retrieval --data dialogues {common} --seeds "
               f"{' '.join(map(str, a.tune_seeds))} (tuning), the same with --seeds {' '.join(map(str, a.seeds))}, "
               f"and with --data generated --seeds {' '.join(map(str, a.seeds))}; tables by "
               f"python bench/bench_retrieval_hybrid.py --write-section (which runs those three)")
        p = report.write_section("retrieval-hybrid", "Hybrid turn score + parent topic",
                                 body, cmd, raw_json=",".join(Path(str(v)).name for v in paths.values()))
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
