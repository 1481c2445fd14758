"""Data is scored: the functional ops and their backend choice (``ops/``), the learned reranker
(``reranker``; what it draws, ``selection``; the checks of its files, ``state_checks``), its trainer
(``trainer``, with the ``replay`` ring, the collapse ``guard`` and the saved ``trainer_state``; the
named settings in ``presets``), CUDA graphs (``graphs``) and the float64 references (``reference``).
"""
