"""``GET /v1/export``: a backup of the live store, streamed as JSON Lines (the format of
:mod:`memkern.store.transfer`, what ``memkern import`` reads).

The export reads a read-only view of the store opened for the request
(``MemoryStore(path, read_only=True)``): one point in time, consistent while the server keeps
writing, and no write waits for it. Query parameters: ``namespace`` (repeatable; default all) and
``embeddings`` (default true). It needs an API key that is not bound to a scope (a bound key gets
403): the export holds every scope. A store not on disk (an ``InMemoryStore``) gets 422.
"""

from typing import Any, Optional

from ..errors import MemkernValueError
from ..store.engine import MemoryStore
from ..store.transfer.export import export_lines

__all__ = ["mount"]


def mount(app: Any, service: Any, forbidden: type) -> None:
    """Add ``GET /v1/export`` to the FastAPI ``app`` serving ``service``; ``forbidden`` is the
    exception class the app answers with 403."""
    from fastapi import Query, Request
    from fastapi.responses import StreamingResponse

    @app.get("/v1/export", tags=["store"])
    def export(request: Request, namespace: Optional[list[str]] = Query(None), embeddings: bool = Query(True)):
        if request.scope.get("memkern.key_scope") is not None:
            raise forbidden("authorization: expected an API key not bound to a scope (an export holds every "
                            "scope), got a scoped key")
        store = service.store
        if not isinstance(store, MemoryStore) or store.path is None:  # an InMemoryStore has no path
            raise MemkernValueError(f"export: expected a store on disk, got {type(store).__name__}")
        view = MemoryStore(store.path, read_only=True)
        try:
            lines = export_lines(view, namespace, embeddings)
            first = next(lines)  # bad arguments fail here, before the response starts
        except BaseException:
            view.close()
            raise

        def body():
            try:
                yield first
                yield from lines
            finally:
                view.close()

        return StreamingResponse(body(), media_type="application/x-ndjson",
                                 headers={"content-disposition": 'attachment; filename="memkern-export.jsonl"'})
