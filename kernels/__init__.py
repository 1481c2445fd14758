"""Triton kernels of memkern, importable as ``memkern.kernels``.

Each ``<op>.py`` holds a kernel, its launcher and a pointer to its plain-torch reference in
``memkern.ops``. Importing this package does not import Triton; the op modules do.

Modules
-------
rerank
    Reranker scoring (residual adapters, ``m'`` never materialised), fused Gumbel-top-M sampling
    with Philox and log-probabilities, and the closed-form REINFORCE gradient. Functional API and
    the plain-torch backend: ``memkern.ops``; float64 references: ``memkern.score.reference``.
"""
