"""LangGraph ``BaseStore`` on memkern's store: ``MemkernStore(store_or_path, embedder=None)``.

Every LangGraph item is one memkern topic record:

* namespace tuple ``("users", "alice")`` <-> memkern namespace ``"lg.users.alice"``
  (:func:`encode_namespace` / :func:`decode_namespace`; LangGraph labels are non-empty str without
  ``"."`` or NUL, so the encoding is reversible; memkern namespaces without the ``"lg."`` prefix
  belong to other users of the store and are never touched);
* ``value`` -> the record's ``meta`` (its top-level keys are what filters see), plus two reserved
  keys: ``"__lg_key__"`` (the item key) and ``"__lg_indexed__"`` (whether it has a text vector);
* the texts at the index fields (default ``["$"]``: the whole value as JSON; LangGraph's path syntax,
  e.g. ``["text", "tags[*]"]``) -> joined by newlines into the record's ``summary``, embedded once
  as the record's vector. An item with ``index=False`` or no text at its fields is stored with a
  placeholder vector and ``"__lg_indexed__": false``; it is returned by searches without a
  ``query`` and never by similarity searches.

``put`` of an existing key writes a new version of the record (``created_at`` kept, ``history``
readable through the memkern store); ``delete`` deletes it. ``search(prefix, query=..., filter=...)``
searches every namespace under ``prefix`` (a query: by similarity, best first, ``score`` = the
store's score, i.e. cosine for the default normalised embedder; no query: oldest first).

Filters (:func:`parse_filter`): plain values and LangGraph's operators ``$eq $ne $gt $gte $lt $lte``
mean what they mean in LangGraph's ``InMemoryStore``: a missing key reads as ``None``, equality is
Python's (``1 == 1.0 == True``), a dict value matches a sub-dict holding its keys (operators may
sit at any depth), a list matches element-wise, ``$gt`` / ``$gte`` / ``$lt`` / ``$lte`` compare
``float(value)`` with ``float(operand)`` (numbers, bools, numeric strings). Where ``InMemoryStore``
raises (``float()`` of a missing, non-numeric or nested value) the item does not match, as in a
database-backed store. memkern adds ``$in $nin $contains $exists`` (per key) and ``$and $or $not``
with the semantics of :mod:`memkern.integrations.filters`. Equality with a str is pushed into the
store's own filtered search; the rest is evaluated on the records. ``batch`` reads against the state before the
batch and then applies its puts (the last put of a key wins), like LangGraph's ``InMemoryStore``;
every op is validated before anything is written. ``abatch`` runs ``batch`` in a thread pool (the
native store releases the GIL).

Time: ``search`` / ``asearch`` also take ``time_range=(start, end)`` (datetimes such as an item's
``created_at`` / ``updated_at``, dates, date strings or unix seconds; ``None`` for an open end),
``time_field`` (``"created"`` / ``"updated"``: the items' ``created_at`` / ``updated_at``;
``"event"``, the default: the record's ``event_time``, else ``created_at``) and, with a
``query``, a recency prior (``recency`` half-life in seconds, ``recency_weight``, ``now``), all
applied inside the store's search (:func:`memkern.integrations._common.time_kw`). Without a query
the time range filters the listing.

TTL (``supports_ttl``): ``put(..., ttl=minutes)`` (``None``: never expires; not given: the
``default_ttl`` of the ``ttl=`` :class:`TTLConfig` of the constructor) makes an item expire that
many minutes after its last write or read; ``get`` / ``search`` with ``refresh_ttl`` (default:
``refresh_on_read``, itself default ``True``) restart its clock. An expired item is never returned
by ``get`` / ``search`` nor counted by ``list_namespaces``; :meth:`MemkernStore.sweep_ttl` deletes
the expired items from the memkern store, and :meth:`MemkernStore.start_ttl_sweeper` (started by
the constructor when the config has ``sweep_interval_minutes``) runs it in a thread until
:meth:`MemkernStore.stop_ttl_sweeper` or :meth:`MemkernStore.close`. The TTL and expiry live in the
record's ``meta`` (keys ``"__lg_ttl__"``, ``"__lg_expires__"``), so they survive a reopen. A read
that refreshes keeps the exact expiry in memory and rewrites the record only when its stored expiry
falls behind, then storing ``REFRESH_SLACK`` (a tenth of the TTL) more: one write per item per tenth
of its TTL at most; after a reopen an item may so live up to a tenth of its TTL longer, never less.
Such a rewrite keeps ``Item.updated_at`` (kept in ``"__lg_updated__"``); the memkern record's own
``updated_at`` (``time_field="updated"``) is that of the rewrite.

Errors: bad namespaces raise :class:`MemkernNamespaceError` (both a
:class:`memkern.MemkernValueError` and LangGraph's ``InvalidNamespaceError``); every other bad
argument raises the memkern error the Python API raises, naming the argument.
"""
from __future__ import annotations

try:
    import langgraph.store.base  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("memkern.integrations.langgraph needs LangGraph: pip install 'memkern[langgraph]'") from e

from .namespaces import PREFIX, MemkernNamespaceError, decode_namespace, encode_namespace
from .query import parse_filter
from .store import MemkernStore
from .ttl import REFRESH_SLACK

__all__ = ["MemkernStore", "MemkernNamespaceError", "encode_namespace", "decode_namespace", "parse_filter",
           "PREFIX", "REFRESH_SLACK"]
