"""Data-parallel REINFORCE (gloo all-reduce inside Ray actors) equals one trainer on the whole batch."""
from __future__ import annotations

import pytest
import torch

from _ray_local import local_ray

D, K, M = 12, 8, 3


@pytest.fixture(scope="module")
def ray():
    return local_ray()


def _batch(B, step):
    g = torch.Generator().manual_seed(100 + step)
    q = torch.randn(B, D, generator=g)
    C = torch.randn(B, K, D, generator=g)
    return q, C


# the stable setting's batch statistics (batch-mean baseline, normalised advantages), clipping, decay
# and max-norm, with Adam (its state must stay identical across replicas); replay and guard are
# per-replica state and are refused
CFG = dict(baseline="batch_mean", normalize_advantages=True, clip_grad_norm=0.5, weight_decay=1e-2, max_norm=20.0,
           optimizer="adam", lr=1e-2)


@pytest.mark.slow
def test_matches_single_process(ray):
    cfg = CFG
    from memkern import Reranker
    from memkern.distributed import DataParallelTrainer
    from memkern.distributed.train import split_selection

    kw = dict(dim=D, top_m=M, replay_capacity=0, guard=False, backend="torch", seed=3, **cfg)
    ref = Reranker(**kw)
    with torch.no_grad():  # start away from zero so every term of the gradient is exercised
        ref.Wq.copy_(0.05 * torch.randn(D, D, generator=torch.Generator().manual_seed(1)))
        ref.Wm.copy_(0.05 * torch.randn(D, D, generator=torch.Generator().manual_seed(2)))
    dp_model = Reranker(**kw)
    dp_model.load_state_dict(ref.state_dict())
    moved = 0.0
    with DataParallelTrainer(dp_model, workers=2, reranker_kwargs=kw) as dp:
        for step in range(4):
            B = 7 if step % 2 == 0 else 10    # 7 rows split 4 + 3: the workers' shares differ
            q, C = _batch(B, step)
            sel = ref.select(q, C)
            R = (torch.rand(B, M, generator=torch.Generator().manual_seed(step)) < 0.4).float()
            parts = split_selection(sel, 2)
            rows = [p.indices.shape[0] for p in parts]
            assert sum(rows) == B
            out = dp.step(parts, [R[:rows[0]], R[rows[0]:]])
            before = ref.Wq.detach().clone()
            stats = ref.update(sel, R)
            moved += float((ref.Wq.detach() - before).abs().max())
            assert out["loss"] == pytest.approx(float(stats["loss"]), rel=1e-5, abs=1e-6)
            assert out["grad_norm"] == pytest.approx(float(stats["grad_norm"]), rel=1e-5, abs=1e-6)
        w0, w1 = dp.weights(0), dp.weights(1)
        dp.sync_to()
    assert moved > 1e-4  # the adapters did move
    torch.testing.assert_close(w0["Wq"], w1["Wq"], rtol=0, atol=0)   # replicas identical
    torch.testing.assert_close(dp_model.Wq.detach(), ref.Wq.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dp_model.Wm.detach(), ref.Wm.detach(), rtol=1e-5, atol=1e-6)


def test_refuses_per_replica_state(ray):
    from memkern import Reranker
    from memkern.distributed import DataParallelTrainer
    from memkern.errors import MemkernValueError

    rr = Reranker(D)
    with pytest.raises(MemkernValueError, match="replay_capacity"):
        DataParallelTrainer(rr, 2, dict(dim=D))
    with pytest.raises(MemkernValueError, match="guard"):
        DataParallelTrainer(rr, 2, dict(dim=D, replay_capacity=0))
    with pytest.raises(MemkernValueError, match="workers"):
        DataParallelTrainer(rr, 0, dict(dim=D, replay_capacity=0, guard=False))
