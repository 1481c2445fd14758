"""Export and import of a store: the JSONL format, its checks and the atomic install."""

from __future__ import annotations

from .install import (
    export_store,
    import_store,
    export_records,
    import_records,
    ImportResult,
    FORMAT,
    FORMAT_VERSION,
)

__all__ = [
    "export_store",
    "import_store",
    "export_records",
    "import_records",
    "ImportResult",
    "FORMAT",
    "FORMAT_VERSION",
]
