"""Triton kernels of memkern, importable as ``memkern.kernels``.

Each ``<op>.py`` holds a kernel, its launcher and a pointer to its plain-torch reference in
``memkern.ops``. Importing this package does not import Triton; the op modules do.
"""
