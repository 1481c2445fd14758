"""Benchmark data: LongMemEval / LoCoMo loaders and generated multi-session histories."""
from __future__ import annotations

from .schema import Conversation, Dataset, DatasetFormatError, Question, Session, Turn  # noqa: F401
from .longmemeval import load_longmemeval, to_longmemeval  # noqa: F401
from .locomo import load_locomo  # noqa: F401
from .synthetic import generate_history  # noqa: F401
# long-context QA (MemReread): generated haystack items and the published context/input/answers format
from .haystack import LongQAItem, generate_haystack_qa, make_haystack_item  # noqa: F401
from .longqa import load_longqa, save_longqa  # noqa: F401
# LoCoMo-shaped multi-party dialogues with paraphrased questions (harder than generate_history)
from .dialogues import generate_dialogues  # noqa: F401
