"""The ``hybrid (content)+{a}*{parent}`` rows of ``memkern eval memory retrieval`` (issue 13).

The row must rank the turns of a conversation by exactly the fused score the store's default
hybrid search gives each turn (records: templated turns with content-only vectors) plus ``a``
times the cosine of the question with the turn's parent (TextTiling topic or fixed window). The
expected scores are computed here independently: the fused score by the native
:class:`memkern.MemoryStore` on disk (the eval uses the engine in memory), the parents by running the
extractors and embedding their topics.
"""
from __future__ import annotations

import numpy as np
import pytest

from test_eval_memory import BowEmbedder


@pytest.fixture
def captured(monkeypatch):
    """Every (row name, [Q, T] score matrix, unit ids) the exact task ranks."""
    from memkern.eval import retrieval

    got: dict[str, tuple[np.ndarray, list]] = {}
    real = retrieval._rank_rows

    def spy(S, unit_ids, questions, budgets, name, rows):
        got[name] = (np.array(S, copy=True), list(unit_ids))
        real(S, unit_ids, questions, budgets, name, rows)

    monkeypatch.setattr(retrieval, "_rank_rows", spy)
    return got


def test_hybrid_parent_row_scores_are_hybrid_plus_alpha_parent_cosine(captured, tmp_path):
    from memkern.data import generate_dialogues
    from memkern.eval import retrieval
    from memkern.eval.retrieval import RetrievalExperiment, turn_dicts
    from memkern.eval.tasks import Task
    from memkern.eval.units import CachedEmbedder
    from memkern.ingest.extract import TextTilingExtractor, WindowExtractor
    from memkern.store import MemoryStore
    from memkern.text.template import default_template

    ds = generate_dialogues(1, 6, seed=3)
    emb = CachedEmbedder(BowEmbedder(), cache_dir=None)
    exp = RetrievalExperiment(alphas=(0.5, 2.0), rmm=False, window=3)
    out = exp.run_task(ds, Task("retrieval", 0, "exact", (0,)), emb)
    (c, questions), = retrieval.questions_by_conversation(ds, None)[0]
    sessions = turn_dicts(c)
    flat = [t for s in sessions for t in s]
    tid = [t["turn_id"] for t in flat]
    T, Q = len(flat), len(questions)
    assert T >= 20 and Q >= 2

    # fused hybrid score of every turn, from the native store (k = every turn)
    tpl = default_template(None)
    texts = [tpl.render_turn(t) for t in flat]
    qe = emb.encode([q.question for q in questions], kind="query")
    vecs = emb.encode([t["content"] for t in flat])
    with MemoryStore(str(tmp_path / "s"), dim=int(qe.shape[1])) as st:
        ids = st.add_batch("c", texts, vecs)
        got, sc = st.search("c", qe, k=T, mode="hybrid", texts=[q.question for q in questions])
    row_of = {int(i): j for j, i in enumerate(ids)}
    hybrid = np.full((Q, T), np.nan)
    for qi in range(Q):
        assert (got[qi] >= 0).all()  # every turn scored
        for i, s in zip(got[qi], sc[qi]):
            hybrid[qi, row_of[int(i)]] = s

    def parent_cos(extractor) -> np.ndarray:
        out = np.full((Q, T), np.nan)
        base = 0
        for s, topics in zip(sessions, extractor.extract_batch(sessions)):
            for tp in topics:
                cos = qe @ emb.encode([tp.summary])[0]
                for i in tp.turns:
                    if np.isnan(out[0, base + i]):  # a turn's parent: its first topic
                        out[:, base + i] = cos
            base += len(s)
        assert not np.isnan(out).any()
        return out

    parents = {"texttiling": parent_cos(TextTilingExtractor(emb, template=tpl)),
               "window3": parent_cos(WindowExtractor(size=3, template=tpl))}
    np.testing.assert_allclose(captured[retrieval.HYBRID_ALL][0], hybrid, rtol=1e-6, atol=1e-6)
    for name, pc in parents.items():
        for a in (0.5, 2.0):
            S, units = captured[f"hybrid (content)+{a:g}*{name}"]
            assert units == [[t] for t in tid]
            np.testing.assert_allclose(S, hybrid + a * pc, rtol=1e-6, atol=1e-6)
            # the parent term changes the ranking somewhere (the check is not vacuous)
            assert not np.array_equal(np.argsort(-S, axis=1, kind="stable"),
                                      np.argsort(-hybrid, axis=1, kind="stable"))
            assert len(out["rows"][f"hybrid (content)+{a:g}*{name}"]) == Q
