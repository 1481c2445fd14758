"""MemReread vs MemAgent (``max_rereads=0``) on long-context QA: scoring, tables, plot.

Scores per item: exact match (EM) and token F1 after answer normalisation (lower case, no
punctuation, no articles ``a/an/the``, single spaces), the best over the item's gold answers, and
``contains`` (a normalised gold answer appears inside the normalised prediction: a lenient score
that credits correct but wordy answers from small models). Aggregates are means per method and
length (and per task).
"""
from __future__ import annotations

import re
import string
import time
from collections import Counter, defaultdict
from typing import Any, Sequence

from ..errors import bad_arg

__all__ = ["normalize_answer", "exact_match", "f1_score", "contains_match", "evaluate_reread",
           "format_report", "plot_report"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans({c: " " for c in string.punctuation})


def normalize_answer(text: str) -> str:
    """Lower case, punctuation -> space, articles removed, whitespace collapsed."""
    return " ".join(_ARTICLES.sub(" ", str(text).lower().translate(_PUNCT)).split())


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    """1.0 if the normalised prediction equals a normalised gold answer, else 0.0."""
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(g) for g in golds))


def _f1(p: str, g: str) -> float:
    pt, gt = normalize_answer(p).split(), normalize_answer(g).split()
    if not pt or not gt:
        return float(pt == gt)
    common = sum((Counter(pt) & Counter(gt)).values())
    if common == 0:
        return 0.0
    prec, rec = common / len(pt), common / len(gt)
    return 2 * prec * rec / (prec + rec)


def f1_score(prediction: str, golds: Sequence[str]) -> float:
    """Best token-level F1 between the prediction and any gold answer."""
    return max((_f1(prediction, g) for g in golds), default=0.0)


def contains_match(prediction: str, golds: Sequence[str]) -> float:
    """1.0 if a normalised gold answer occurs as whole words in the normalised prediction."""
    p = f" {normalize_answer(prediction)} "
    return float(any(normalize_answer(g) and f" {normalize_answer(g)} " in p for g in golds))


def evaluate_reread(items: Sequence[Any], chat_model: Any, max_rereads: int = 3, baseline: bool = True,
                    batch_size: int = 8, progress: bool = True, **memreread_kwargs) -> dict:
    """Run MemReread (and the MemAgent baseline) over long-context QA items and score them.

    Parameters
    ----------
    items : :class:`memkern.data.haystack.LongQAItem` s (generated or loaded).
    chat_model : the chat model both methods use.
    max_rereads : MemReread's budget; the baseline uses 0.
    baseline : also run ``max_rereads=0`` (MemAgent).
    batch_size : items per :meth:`MemReread.answer_batch` call.
    progress : progress bar over items.
    **memreread_kwargs : forwarded to :class:`memkern.MemReread` (chunk_tokens, memory_tokens, ...).

    Returns
    -------
    dict with ``rows`` (one per method x item: method, item_id, task, length, n_tokens, answer,
    golds, em, f1, contains, rereads, calls, seconds, prompt_tokens, output_tokens), ``by_length``
    and ``by_task`` (means per method and key), ``config`` and ``seconds``.
    """
    from ..loops.memreread.loop import MemReread

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise bad_arg("batch_size", "an int >= 1", batch_size)
    if not items:
        raise bad_arg("items", "a non-empty list of items", items)
    methods = [(f"MemReread(max_rereads={max_rereads})", max_rereads)]
    if baseline and max_rereads != 0:
        methods.append(("MemAgent(max_rereads=0)", 0))
    rows: list[dict] = []
    t_all = time.perf_counter()
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(items) * len(methods), desc="eval reread", unit="item")
    try:
        for name, k in methods:
            reader = MemReread(chat_model, max_rereads=k, **memreread_kwargs)
            for s in range(0, len(items), batch_size):
                part = list(items[s:s + batch_size])
                t0 = time.perf_counter()
                results = reader.answer_batch([it.context for it in part], [it.question for it in part],
                                              callback=(lambda i, r: bar.update(1)) if bar is not None else None)
                wall = time.perf_counter() - t0
                for it, r in zip(part, results):
                    rows.append({
                        "method": name, "max_rereads": k, "item_id": it.item_id, "task": it.task,
                        "length": it.length if it.length > 0 else r.doc_tokens, "n_tokens": r.doc_tokens,
                        "question": it.question, "answer": r.answer, "golds": list(it.answers),
                        "em": exact_match(r.answer, it.answers), "f1": f1_score(r.answer, it.answers),
                        "contains": contains_match(r.answer, it.answers), "rereads": r.rereads,
                        "sub_questions": r.sub_questions, "stop_reason": r.stop_reason, "calls": r.calls,
                        "seconds": r.seconds, "batch_wall_seconds": wall / len(part),
                        "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens})
    finally:
        if bar is not None:
            bar.close()
    return {"rows": rows, "by_length": _aggregate(rows, "length"), "by_task": _aggregate(rows, "task"),
            "config": {"max_rereads": max_rereads, "baseline": baseline, "batch_size": batch_size,
                       **{k: v for k, v in memreread_kwargs.items()}},
            "seconds": time.perf_counter() - t_all}


def _aggregate(rows: list[dict], key: str) -> list[dict]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["method"], r[key])].append(r)
    out = []
    for (method, kv), rs in sorted(groups.items(), key=lambda x: (str(x[0][1]).zfill(12), x[0][0])):
        n = len(rs)
        out.append({"method": method, key: kv, "n": n,
                    "em": sum(r["em"] for r in rs) / n, "f1": sum(r["f1"] for r in rs) / n,
                    "contains": sum(r["contains"] for r in rs) / n,
                    "rereads": sum(r["rereads"] for r in rs) / n,
                    "calls": sum(sum(r["calls"].values()) for r in rs) / n,
                    "seconds": sum(r["seconds"] for r in rs) / n})
    return out


def format_report(report: dict) -> str:
    """Plain-text tables: per length, then per task."""
    lines = []
    for col, agg in (("length", report["by_length"]), ("task", report["by_task"])):
        lines.append(f"{col:>10}  {'method':<26} {'n':>3} {'EM':>6} {'F1':>6} {'contains':>8} "
                     f"{'rereads':>7} {'calls':>6} {'s/item':>7}")
        for a in agg:
            lines.append(f"{str(a[col]):>10}  {a['method']:<26} {a['n']:>3} {a['em']:>6.3f} {a['f1']:>6.3f} "
                         f"{a['contains']:>8.3f} {a['rereads']:>7.2f} {a['calls']:>6.1f} {a['seconds']:>7.1f}")
        lines.append("")
    lines.append(f"total wall time {report['seconds']:.1f} s")
    return "\n".join(lines)


def plot_report(report: dict, path: str) -> str:
    """Save F1/EM and mean rereads per length, per method, as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by = defaultdict(list)
    for a in report["by_length"]:
        by[a["method"]].append(a)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for method, aggs in by.items():
        xs = [a["length"] for a in aggs]
        ax1.plot(xs, [a["f1"] for a in aggs], marker="o", label=f"{method} F1")
        ax1.plot(xs, [a["em"] for a in aggs], marker="x", linestyle="--", label=f"{method} EM")
        ax2.plot(xs, [a["rereads"] for a in aggs], marker="o", label=method)
    for ax, title in ((ax1, "answer quality"), (ax2, "mean rereads")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("document length (tokens)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    ax1.set_ylim(-0.02, 1.02)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

