"""How every command reaches Milvus: one place that turns the settings into a connector."""

from __future__ import annotations

from typing import TypeVar

from connectors.milvus import MilvusConnection
from worker.settings import Settings

M = TypeVar("M", bound=MilvusConnection)


def open_milvus(settings: Settings, job: type[M], collection: str | None = None) -> M:
    """A client of Milvus for ``job`` (``MilvusStore``, ``MilvusReader`` or ``MilvusAdmin``) on
    ``collection`` (EMBEDSTREAM_MILVUS_COLLECTION when None), with the settings' URI, token, timeout,
    database and TLS."""
    return job(settings.milvus_uri or "", collection or settings.milvus_collection,
               settings.milvus_token.get_secret_value() if settings.milvus_token else None,
               settings.milvus_timeout_seconds, options=settings.milvus_options())
