"""RMM: Reflective Memory Management around a :class:`memkern.MemoryStore`.

Prospective reflection (:meth:`RMM.end_session`, :mod:`memkern.loops.rmm.reflect`): a finished session
is split into topic memories (:mod:`memkern.ingest.extract`), and each enters the bank by ADD / MERGE /
UPDATE / INVALIDATE / NOOP (:mod:`memkern.ingest.apply`).

Retrospective reflection (:meth:`RMM.respond`): the query is embedded, the store returns the top-K
(default 20) memories, the reranker picks its best top-M (default 5) (:mod:`memkern.loops.rmm.retrieve`;
``RMMConfig.explore``: a share of calls shows a sampled draw instead), the chat model answers from
them and cites the ones it used by number; citations become rewards (+1 cited, -1 uncited), which
are buffered and fed to ``reranker.update`` every ``batch_size`` (default 4) responses
(:mod:`memkern.loops.rmm.feedback`: what the reranker learns from). The reranker's state (and the not-yet-used
reward buffer) is persisted per namespace under ``<store.path>/rerankers/``.

Two-level memory (``retrieval="turn+topic"``, opt-in): every write also stores each turn of a
topic as its own turn record (embedded once per session, ``kind="passage"``); :meth:`RMM.respond`
searches turns scored as ``sim(q, turn) + alpha * sim(q, its topic)``, groups the best
``4 * top_k`` turns by topic (rank order) into up to ``top_k`` candidate topics, lets the reranker
choose ``top_m`` of them (candidate vector: best turn + ``alpha`` * topic, so a fresh reranker keeps
the turn+topic order), and shows the model each chosen topic's summary with
only its best retrieved turns (at most ``turns_per_memory``). The default ``retrieval="topic"``
retrieves topic records and shows their raw turns as before.

Settings are one :class:`RMMConfig` (``RMM(store, config=RMMConfig(top_k=10))``); each field is
also accepted as a keyword override (``RMM(store, top_k=10)``). Inspecting or deleting a bank
without models is :mod:`memkern.store.bank`.

Every call records a ``timings`` dict (seconds, ``time.perf_counter``) and logs it at debug level.

Modules: :mod:`~memkern.loops.rmm.config` (:class:`RMMConfig`), :mod:`~memkern.loops.rmm.core` (:class:`RMM`,
:class:`Response`), :mod:`~memkern.loops.rmm.retrieve`, :mod:`~memkern.loops.rmm.feedback`
(:func:`parse_answer`, rewards, buffer), :mod:`~memkern.loops.rmm.reflect`.
"""
from __future__ import annotations

from ...ingest.apply import UpdateResult
from .config import RMMConfig
from .core import RMM, Response
from .feedback import parse_answer

__all__ = ["RMM", "RMMConfig", "Response", "UpdateResult", "parse_answer"]
