"""``memkern eval memory retrieval --locomo`` on a tiny synthetic file in LoCoMo's per-conversation
layout: the baseline, the ablation rows and the RMM default with bootstrap intervals, and the
section it writes with ``--write-section`` (into a copy of bench/, never the repository's)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from memkern.data import generate_dialogues

REPO = Path(__file__).resolve().parents[2]
_CATS = {"single-hop": 4, "multi-hop": 1, "temporal": 2, "knowledge-update": 3, "adversarial": 5}


def locomo_folder(tmp_path: Path, n: int = 2, sessions: int = 6) -> Path:
    """Generated dialogues written as LoCoMo per-conversation files (``conv-<i>.json``: top-level
    ``speaker_a``, ``session_K``, ``session_K_date_time``, ``qa``)."""
    d = tmp_path / "locomo"
    d.mkdir()
    ds = generate_dialogues(n, sessions, seed=3)
    for i, c in enumerate(ds.conversations):
        speakers = list(dict.fromkeys(t.speaker for s in c.sessions for t in s.turns))
        obj = {"speaker_a": speakers[0], "speaker_b": speakers[1]}
        for k, s in enumerate(c.sessions, 1):
            obj[f"session_{k}_date_time"] = s.date
            obj[f"session_{k}"] = [{"speaker": t.speaker, "dia_id": t.turn_id, "text": t.content} for t in s.turns]
        obj["qa"] = [{"question": q.question, "answer": q.answer, "evidence": q.evidence_turn_ids,
                      "category": _CATS[q.question_type]} for q in c.questions]
        (d / f"conv-{i + 1}.json").write_text(json.dumps(obj))
    return d


@pytest.mark.slow
def test_cli_locomo_retrieval_rows_and_section(tmp_path, capsys):
    from memkern.cli import main

    data = locomo_folder(tmp_path)
    bench = tmp_path / "bench"
    shutil.copytree(REPO / "bench" / "sections", bench / "sections")
    for f in ("report.py", "harness.py", "REPORT.md"):
        shutil.copy(REPO / "bench" / f, bench / f)
    out = tmp_path / "out"
    rc = main(["eval", "memory", "retrieval", "--locomo", str(data), "--conversations", "conv-2", "--seeds", "0",
               "--ablations", "rmm: no neighbours,rmm: dense stage", "--bootstrap", "100", "--alphas", "1",
               "--out", str(out), "--quiet", "--cache-dir", str(tmp_path / "cache"), "--write-section",
               "--bench-dir", str(bench)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "95% CI R@5" in text and "rmm-default" in text and "rmm: no neighbours" in text
    (p,) = out.glob("retrieval-*.json")
    res = json.loads(p.read_text())
    m = res["per_seed"][0]["metrics"]
    assert res["config"]["baseline"] == "turn (speaker)" and res["dataset"][0]["conversations"] == 1
    assert m["rmm-default"]["ci95_recall@5turns"][0] <= m["rmm-default"]["recall@5turns"]
    assert res["config"]["question_types"] == ["category_1", "category_2", "category_3", "category_4"]
    assert {"turn (speaker)", "lexical (template)", "rmm-default", "rmm: no neighbours", "rmm: dense stage"} <= set(m)
    n = m["turn (speaker)"]["questions"]
    assert n > 0 and all(v["questions"] == n for v in m.values())  # adversarial questions left out, same set
    sec = (bench / "sections" / "retrieval-locomo.md").read_text()
    assert sec.startswith("---\narea: Retrieval on real conversations (LoCoMo development split)\n")
    assert "\n---\n## Retrieval on real conversations (LoCoMo development split)\n" in sec
    assert "\n  - [\"rmm-default, R@5\", " in sec  # its headline in RESULTS.md, quoted from the table
    assert "--conversations conv-2" in sec and "**rmm-default**" in sec and "rmm: dense stage" in sec
    assert str(data) not in sec and str(tmp_path) not in sec and str(REPO) not in sec  # no machine paths
    assert "/site-packages/" not in sec
    results = (bench / "RESULTS.md").read_text()
    assert "Retrieval on real conversations" in results and "| rmm-default, R@5 |" in results
    # the section's table: every row with its interval
    row = next(ln for ln in sec.splitlines() if ln.startswith("| **rmm-default**"))
    assert row.count("[") == 6


def test_cli_locomo_bad_arguments(tmp_path, capsys):
    from memkern.cli import main

    data = locomo_folder(tmp_path, n=1)
    assert main(["eval", "memory", "retrieval", "--locomo", str(tmp_path / "missing")]) == 2
    assert "--locomo" in capsys.readouterr().err
    assert main(["eval", "memory", "retrieval", "--locomo", str(data), "--conversations", "conv-1,,x"]) == 2
    assert "--conversations" in capsys.readouterr().err
    rc = main(["eval", "memory", "retrieval", "--locomo", str(data), "--conversations", "conv-9", "--quiet",
               "--out", str(tmp_path / "o"), "--cache-dir", "none"])
    assert rc != 0
    err = capsys.readouterr()
    assert "conv-9" in err.out + err.err
    rc = main(["eval", "memory", "retrieval", "--locomo", str(data), "--ablations", "rmm: nonsense", "--quiet",
               "--out", str(tmp_path / "o"), "--cache-dir", "none"])
    assert rc != 0
