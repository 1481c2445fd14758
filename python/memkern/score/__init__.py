"""Data is scored: the functional ops and their backend choice, the learned reranker, its trainer,
CUDA graphs and the float64 references.
"""
