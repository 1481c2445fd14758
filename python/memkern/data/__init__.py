"""Benchmark data: LongMemEval / LoCoMo loaders and generated multi-session histories."""
from __future__ import annotations

from .schema import Conversation, Dataset, DatasetFormatError, Question, Session, Turn  # noqa: F401
from .longmemeval import load_longmemeval, to_longmemeval  # noqa: F401
from .locomo import load_locomo  # noqa: F401
from .synthetic import generate_history  # noqa: F401
