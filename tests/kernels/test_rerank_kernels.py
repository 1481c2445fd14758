"""The Triton launchers of kernels/rerank.py called directly (without memkern.ops, which always
passes a mask derived from the ids): the kernels themselves treat -1 ids as padding, so a caller
of memkern.kernels never scores or samples table row 0 for a padded slot."""
from __future__ import annotations

import os

import pytest
import torch

from memkern.score import reference as ref

try:
    import triton  # noqa: F401

    _TRITON = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
except Exception:  # pragma: no cover
    _TRITON = False

pytestmark = [pytest.mark.interpret,
              pytest.mark.skipif(not _TRITON, reason="triton needs CUDA or TRITON_INTERPRET=1")]


@pytest.mark.parametrize("K", [5, 16, 17])
def test_kernel_scores_and_samples_treat_negative_ids_as_padding(K, device):
    from memkern.kernels import rerank as k

    B, d, N, m = 3, 7, 11, 2
    g = torch.Generator().manual_seed(K)
    q = torch.randn(B, d, generator=g)
    Wq, Wm = torch.randn(d, d, generator=g) * 0.1, torch.randn(d, d, generator=g) * 0.1
    T = torch.randn(N, d, generator=g)
    ids = torch.randint(0, N, (B, K), generator=g)
    ids[:, 1::2] = -1                                     # every other slot is padding
    q, Wq, Wm, T, ids = (t.to(device) for t in (q, Wq, Wm, T, ids))
    _, _, r = k.adapt(q, Wq, Wm)
    valid = ids >= 0
    want = ref.reference_scores(q.cpu().double(), Wq.cpu().double(), Wm.cpu().double(),
                                T.cpu().double()[ids.cpu().clamp_min(0)], valid.cpu())
    sc, idx, lp = k.score_sample(r, None, ids, T, None, m, 0.5, 7, 0, False, "softmax")   # valid=None
    assert torch.equal(torch.isinf(sc.cpu()), ~valid.cpu())
    fin = valid.cpu()
    torch.testing.assert_close(sc.cpu().double()[fin], want[fin], rtol=1e-5, atol=1e-5)
    chosen = ids.gather(1, idx.clamp_min(0))
    assert bool((idx >= 0).all()) and bool((chosen >= 0).all())      # never a padded slot
