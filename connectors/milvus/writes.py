"""The sink's side of Milvus: chunk rows upserted and deleted, and the versions the guard compares
(``worker.steps.writing.versions``), deletes included through the companion collection."""

from __future__ import annotations

import logging
from collections.abc import Callable

from prometheus_client import Counter

from connectors.milvus.claims import ClaimCalls
from connectors.milvus.connection import CollectionGone, MilvusConnection, failure
from connectors.milvus.expressions import field_in
from connectors.milvus.schema import VERSION_FIELDS, ChunkRows, chunk_id, row_dicts, upsert_request

log = logging.getLogger(__name__)

#: Upserts written through pymilvus' public ``upsert`` because its private columnar call failed
#: (:meth:`MilvusStore.upsert_chunks`); 0 with the pymilvus versions pyproject.toml names.
COLUMNAR_FALLBACKS = Counter("embedstream_milvus_columnar_fallbacks_total",
                             "Chunk upserts written through pymilvus' public upsert: its private columnar call failed")

#: A version as the collection holds it: ``(source, source_offset)`` (either None on an odd row).
Version = tuple[str | None, int | None]


def _newer(a: Version | None, b: Version) -> Version:
    """The later of two versions of one id; ``b`` (the row) where they are not comparable."""
    if a is None or a[0] != b[0] or a[1] is None or b[1] is None:
        return b if a is None or b[1] is not None else a
    return a if a[1] > b[1] else b


class MilvusStore(MilvusConnection, ClaimCalls):
    """Writes of one collection of chunk rows (COSINE metric) and its companion of deletes, so that a
    delete has a version to compare with too; a share group's members also claim the versions they
    write in the companion of claims (``connectors.milvus.claims``). A failure raises ``Refused``
    where Milvus will never take the call as it is (``connection.refused``: the caller finds the rows
    that cause it), else ``TransientError`` (an outage: the caller retries). Ids reach Milvus only as
    string literals (``connectors.milvus.expressions``), never as expression text."""

    #: Set once pymilvus' private columnar call has failed as a moved API fails (:meth:`_lose_columnar`).
    _columnar_lost = False
    #: Makes the collection ready again (created, indexed, behind its alias, its canary kept) when a call
    #: finds it gone; set by whoever prepared it at start-up (None: nothing is done but the retry).
    recover: Callable[[], None] | None = None

    def _failure(self, exc: Exception) -> Exception:
        """:func:`failure` of ``exc``; where the collection is gone, it is prepared again first (once a
        call: the caller retries, with backoff, until the retry finds it)."""
        failed = failure(exc)
        if isinstance(failed, CollectionGone) and self.recover is not None:
            log.warning("Milvus: collection %r is not there (%s): preparing it again, then retrying",
                        self.collection, exc)
            try:
                self.recover()
            except Exception as again:  # Milvus out too, or a database gone: the retry tries again
                log.warning("Milvus: preparing collection %r again failed (%s: %s); retrying", self.collection,
                            type(again).__name__, again)
        return failed

    def upsert_chunks(self, rows: ChunkRows, model: str, updated_at: int) -> None:
        """Upsert chunk rows (their ids unique), built as one columnar protobuf request: pymilvus
        packs dict rows in Python field by field, holding the GIL that the worker's other threads
        need; a column of vectors goes into the request in one copy."""
        if not len(rows):
            return
        if not self._columnar_lost:
            request = upsert_request(self.collection, rows, model, updated_at)
            try:
                # A prepared request skips pymilvus' packing; ``schema`` only saves it a describe call. The
                # call context carries the client's database (EMBEDSTREAM_MILVUS_DB_NAME), as pymilvus'
                # own calls do: without it the request goes to `default`.
                context = self._client._generate_call_context()
                request.db_name = context.get_db_name()
                self._client._get_connection().upsert(self.collection, [], upsert_param=request,
                                                      schema={"fields": []}, timeout=self.timeout, context=context)
                return
            except (AttributeError, TypeError) as exc:  # pymilvus moved or changed its private call
                self._lose_columnar(exc)
            except Exception as exc:
                raise self._failure(exc) from None
        COLUMNAR_FALLBACKS.inc()
        try:
            self._client.upsert(self.collection, row_dicts(rows, model, updated_at), timeout=self.timeout)
        except Exception as exc:
            raise self._failure(exc) from None

    def _lose_columnar(self, exc: Exception) -> None:
        """The private columnar call failed as a moved API fails: every later upsert of this store
        goes through ``MilvusClient.upsert`` (the same rows, packed by pymilvus; slower). Said once."""
        self._columnar_lost = True
        log.warning("pymilvus' private columnar upsert failed (%s: %s): upserting through MilvusClient.upsert "
                    "from now on (slower; embedstream_milvus_columnar_fallbacks_total counts them). Pin pymilvus "
                    "to the versions pyproject.toml names", type(exc).__name__, exc)

    def versions(self, doc_ids: list[str]) -> tuple[dict[str, Version], dict[str, int]]:
        """For the documents among ``doc_ids`` that Milvus knows, read at Strong consistency: the
        version each holds (its rows', or its last delete's where that is newer) and how many
        chunks its rows say it has (documents with rows only)."""
        deleted, rows, counts = self.version_parts(doc_ids)
        versions = dict(deleted)
        for doc, version in rows.items():
            versions[doc] = _newer(versions.get(doc), version)
        return versions, counts

    def version_parts(self, doc_ids: list[str]) -> tuple[dict[str, Version], dict[str, Version], dict[str, int]]:
        """``versions`` in its parts, read at Strong consistency: the version of each document's last
        delete, its rows' version and their chunk count. Chunk 0 speaks for the document: every
        version has one, and its rows are written together."""
        if not doc_ids:
            return {}, {}, {}
        try:
            rows = self._client.query(self.collection, filter=field_in("id", [chunk_id(d, 0) for d in doc_ids]),
                                      output_fields=["doc_id", "chunk_count", *VERSION_FIELDS],
                                      timeout=self.timeout, consistency_level="Strong")
            deleted = self._client.query(self.tombstones, filter=field_in("id", doc_ids),
                                         output_fields=["id", *VERSION_FIELDS], timeout=self.timeout,
                                         consistency_level="Strong")
        except Exception as exc:
            raise self._failure(exc) from None
        return ({r["id"]: (r.get("source"), r.get("source_offset")) for r in deleted},
                {r["doc_id"]: (r.get("source"), r.get("source_offset")) for r in rows},
                {r["doc_id"]: int(r["chunk_count"]) for r in rows})

    def content_hashes(self, ids: list[str]) -> set[str]:
        """The ``content_hash`` of each row among the chunk ids ``ids`` (at Strong consistency): what a
        deleted document's texts are cached under."""
        if not ids:
            return set()
        try:
            rows = self._client.query(self.collection, filter=field_in("id", ids), output_fields=["content_hash"],
                                      timeout=self.timeout, consistency_level="Strong")
        except Exception as exc:
            raise self._failure(exc) from None
        return {r["content_hash"] for r in rows if r.get("content_hash")}

    def record_deletes(self, doc_ids: list[str], versions: tuple[list[str], list[int]], updated_at: int) -> None:
        """Keep the version of each document's delete in the companion, where ``versions()`` finds it:
        an older upsert of a deleted id is then known to be older."""
        if not doc_ids:
            return
        try:
            self._client.upsert(self.tombstones, [
                {"id": i, "source": src, "source_offset": off, "updated_at": updated_at, "marker": [1.0, 0.0]}
                for i, src, off in zip(doc_ids, *versions)], timeout=self.timeout)
        except Exception as exc:
            raise self._failure(exc) from None

    def delete(self, ids: list[str]) -> None:
        """Delete rows by primary key (chunk ids)."""
        if not ids:
            return
        try:
            self._client.delete(self.collection, filter=field_in("id", ids), timeout=self.timeout)
        except Exception as exc:
            raise self._failure(exc) from None
