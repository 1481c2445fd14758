"""The full :class:`memkern.RMM` loop with a real chat model on a small slice of a dataset."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

from ..data.schema import Dataset
from ..errors import MemkernValueError
from .data import dataset_info, mean, progress_bar
from .report import ExperimentResult, environment
from .tasks import Experiment, Task, TaskOutput

__all__ = ["run_rmm", "RMMExperiment", "RMMResult"]


@dataclass
class RMMResult(ExperimentResult):
    """Result of :func:`run_rmm`: ``metrics`` holds ``questions``, ``evidence_recall`` (of the
    memories shown), ``cited_evidence``, ``answer_contained``, ``parsed`` and per-question ``rows``."""

    experiment: ClassVar[str] = "rmm"

    @classmethod
    def format_metrics(cls, metrics: dict[str, Any], config: dict[str, Any]) -> str:
        m = metrics
        return (f"questions {m['questions']}  evidence recall of shown memories {m['evidence_recall']:.3f}  "
                f"of cited {m['cited_evidence']:.3f}  answer contained {m['answer_contained']:.3f}  "
                f"JSON parsed {m['parsed']:.3f}")


def run_rmm(ds: Dataset, *, conversations: int = 1, sessions: int | None = 4, questions: int | None = 3,
            chat_model: Any = None, embedder: Any = None, extractor: str = "llm", store_dir: str | None = None,
            rmm_kwargs: dict | None = None, progress: bool = False) -> "RMMResult":
    """Drive :class:`memkern.RMM` end to end on a small slice (CPU: every session is a model call).

    For each of the first ``conversations`` conversations: a fresh store (temporary folder), its
    first ``sessions`` sessions fed through ``end_session`` (each turn carries its ``turn_id``),
    then its first ``questions`` questions whose evidence lies in those sessions asked through
    ``respond`` (which also trains the reranker online). Reports evidence-turn recall of the
    memories shown to the model, of the memories it cited, answer containment (the gold answer
    string appears in the reply), JSON parse rate, and timings. ``rmm_kwargs`` go to
    :class:`memkern.RMM` (top_k, top_m, batch_size, budgets, thresholds...). Raises
    :class:`MemkernValueError` with a clear message when RMM is not available.
    """
    try:
        from ..loops.rmm import RMM
        from ..store.engine import MemoryStore
    except ImportError as e:
        raise MemkernValueError(f"rmm experiment: expected memkern.RMM and memkern.MemoryStore to be importable, "
                                f"got ImportError: {e}") from None
    import tempfile

    t_start = time.perf_counter()
    if chat_model is None:
        from ..models import ChatModel

        chat_model = ChatModel()
    if embedder is None:
        from ..models import Embedder

        embedder = Embedder()
    rows = []
    tm = {"end_session": 0.0, "respond": 0.0}
    for c in progress_bar(ds.conversations[:conversations], progress, desc="rmm"):
        sess = c.sessions[:sessions] if sessions else c.sessions
        have = {t.turn_id for s in sess for t in s.turns}
        qs = [q for q in c.questions if q.evidence_turn_ids and set(q.evidence_turn_ids) <= have]
        qs = qs[:questions] if questions else qs
        with tempfile.TemporaryDirectory(dir=store_dir) as d:
            store = MemoryStore(d, dim=int(embedder.dim))
            rmm = RMM(store, chat_model=chat_model, embedder=embedder, extractor=extractor, persist=False,
                      **(rmm_kwargs or {}))
            for s in sess:
                t0 = time.perf_counter()
                rmm.end_session([{"role": t.role, "content": t.content, "turn_id": t.turn_id} for t in s.turns],
                                session_id=s.session_id, timestamp=s.date)
                tm["end_session"] += time.perf_counter() - t0
            for q in qs:
                t0 = time.perf_counter()
                out = rmm.respond(q.question)
                tm["respond"] += time.perf_counter() - t0
                retrieved = _turn_ids_of(store, out.memory_ids)
                ev = set(q.evidence_turn_ids)
                cited = _turn_ids_of(store, [out.memory_ids[i] for i in out.citations])
                rows.append(dict(question_id=q.question_id, question_type=q.question_type,
                                 recall=len(ev & retrieved) / len(ev), cited_useful=len(ev & cited) / len(ev),
                                 answer_contained=q.answer.lower() in out.answer.lower(),
                                 reply=out.answer[:300], answer=q.answer, parsed=bool(out.parsed)))
            rmm.close()
            store.close()
    metrics = dict(questions=len(rows), evidence_recall=mean([r["recall"] for r in rows]),
                   cited_evidence=mean([r["cited_useful"] for r in rows]),
                   answer_contained=mean([float(r["answer_contained"]) for r in rows]),
                   parsed=mean([float(r["parsed"]) for r in rows]), rows=rows)
    config = dict(experiment="rmm", conversations=conversations, sessions=sessions, questions=questions,
                  extractor=extractor, chat_model=str(getattr(chat_model, "model_name", type(chat_model).__name__)),
                  rmm_kwargs=rmm_kwargs or {})
    return RMMResult(config, dataset_info(ds), metrics, tm | {"total": time.perf_counter() - t_start}, environment())


def _turn_ids_of(store: Any, ids: Sequence[int]) -> set[str]:
    """Turn ids (the ``turn_id`` key the experiment stored in each turn) of the given records."""
    out: set[str] = set()
    for i in ids:
        try:
            rec = store.get(int(i))
        except KeyError:
            continue
        for t in rec.turns or []:
            if isinstance(t, dict) and "turn_id" in t:
                out.add(str(t["turn_id"]))
    return out


@dataclass
class RMMExperiment(Experiment):
    """The rmm work plan (:mod:`memkern.eval.tasks`): one task per seed, **not** cut by
    configuration or conversation (the chat model is loaded once and its sampler runs through
    every conversation in turn). ``kwargs``: :func:`run_rmm`'s arguments but ``ds``,
    ``embedder``, ``chat_model`` and ``progress``; ``chat_model``: a local model folder or
    ``None`` (the offline default), loaded inside the task."""

    name: ClassVar[str] = "rmm"

    kwargs: dict[str, Any] | None = None
    chat_model: str | None = None
    seed: int = 0

    def configurations(self, ds: Dataset) -> list[str]:
        return ["all"]

    def run_task(self, ds: Dataset, task: Task, emb: Any) -> "RMMResult":
        chat = None
        if self.chat_model:
            from ..models import ChatModel

            chat = ChatModel(self.chat_model)
        return run_rmm(ds, chat_model=chat, embedder=emb.embedder, **(self.kwargs or {}))

    def merge(self, ds: Dataset, outputs: Sequence[TaskOutput], emb: Any) -> "RMMResult":
        (o,) = outputs
        return o.partial
