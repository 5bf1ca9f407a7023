"""The bundled sample RAG system: the system under test that ``provider=sample`` runs in-process
and ``experiments/kb_zh/service.py`` serves over HTTP. Standard library only, so the service runs
with a plain ``python3`` too."""

from ragexp.sample.system import (
    CHUNKINGS,
    CITATION_POLICIES,
    REFUSAL,
    DocsError,
    SampleSystem,
    Settings,
    load_docs,
)

__all__ = ["CHUNKINGS", "CITATION_POLICIES", "REFUSAL", "DocsError", "SampleSystem", "Settings", "load_docs"]
