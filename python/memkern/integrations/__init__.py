"""Adapters that put memkern's store under the agent frameworks people already use.

Each adapter is an optional extra and imports its framework only when its module is imported:

- :mod:`memkern.integrations.langgraph`: ``MemkernStore``, a LangGraph ``BaseStore``
  (``pip install memkern[langgraph]``); LangMem's memory tools run on it.
- :mod:`memkern.integrations.langchain`: ``MemkernVectorStore`` (a LangChain ``VectorStore``),
  ``MemkernRetriever`` (a ``BaseRetriever`` with memkern's learned reranker and citation rewards)
  and ``MemkernEmbeddings`` (``pip install memkern[langchain]``).
- :mod:`memkern.integrations.llamaindex`: ``MemkernVectorStore``, a LlamaIndex
  ``BasePydanticVectorStore`` with metadata filters (``pip install memkern[llamaindex]``).
- :mod:`memkern.integrations.mem0`: ``MemkernVectorStore``, a mem0 ``VectorStoreBase`` provider
  registered as ``"memkern"`` (``pip install memkern[mem0]``).

Shared rules: a namespace / collection is one memkern namespace; metadata filters use
:mod:`memkern.integrations.filters` (pushed into the store's index search where the store supports
``search(filter=...)``, evaluated on the records otherwise); bad input raises the same
:class:`memkern.MemkernError` subclasses as the Python API, naming the argument, before anything is
written.
"""
from __future__ import annotations

__all__ = ["filters"]
