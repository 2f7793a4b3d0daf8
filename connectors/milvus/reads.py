"""Reads of a collection (or an alias): nearest rows, counts and scans, all at Strong consistency
where the caller needs to see the latest writes. Every failure raises TransientError."""

from __future__ import annotations

from connectors.milvus.connection import MilvusConnection, transient
from connectors.milvus.schema import CHUNK_FIELDS, chunk_id


class MilvusReader(MilvusConnection):
    """Reads of one collection or alias."""

    def exists(self) -> bool:
        try:
            return bool(self._client.has_collection(self.collection, timeout=self.timeout))
        except Exception as exc:
            raise transient(exc) from None

    def dim(self) -> int:
        try:
            info = self._client.describe_collection(self.collection, timeout=self.timeout)
        except Exception as exc:
            raise transient(exc) from None
        return next(int(f["params"]["dim"]) for f in info["fields"] if f["name"] == "vector")

    def query(self, filter: str, fields: list[str], limit: int | None = None) -> list[dict]:
        """The ``fields`` of rows matching ``filter`` (at most ``limit``), at Strong consistency."""
        extra = {"limit": limit} if limit is not None else {}
        try:
            return list(self._client.query(self.collection, filter=filter, output_fields=fields,
                                           consistency_level="Strong", timeout=self.timeout, **extra))
        except Exception as exc:
            raise transient(exc) from None

    def query_ids(self, fields: tuple[str, ...] = ("id",)) -> list[dict]:
        """Every row's ``fields``, read at Strong consistency."""
        out: list[dict] = []
        try:
            it = self._client.query_iterator(self.collection, batch_size=1000, filter="",
                                             output_fields=list(fields), consistency_level="Strong",
                                             timeout=self.timeout)
            while True:
                page = it.next()
                if not page:
                    it.close()
                    break
                out.extend(page)
        except Exception as exc:
            raise transient(exc) from None
        return out

    def held(self, doc_ids: list[str]) -> set[str]:
        """The documents among ``doc_ids`` that have rows (their chunk 0), read at Strong consistency."""
        if not doc_ids:
            return set()
        try:
            rows = self._client.get(self.collection, ids=[chunk_id(d, 0) for d in doc_ids], output_fields=["doc_id"],
                                    timeout=self.timeout, consistency_level="Strong")
        except Exception as exc:
            raise transient(exc) from None
        return {r["doc_id"] for r in rows}

    def count(self) -> int:
        return int(self.query("", ["count(*)"])[0]["count(*)"])

    def model_of(self) -> str | None:
        """The model id of the collection's rows (one row read); None when it has none."""
        rows = self.query("", ["model"], limit=1)
        return rows[0].get("model") if rows else None

    def search(self, vector, limit: int = 5) -> list[dict]:
        """The ``limit`` nearest chunk rows: ``id`` (the chunk's), ``score``, and the row's
        ``doc_id``, ``chunk_index``, ``chunk_count``, span, ``excerpt``, ``metadata`` and ``model``."""
        try:
            hits = self._client.search(self.collection, data=[vector], limit=limit,
                                       output_fields=[*CHUNK_FIELDS, "excerpt", "metadata", "model"],
                                       search_params={"metric_type": "COSINE"}, timeout=self.timeout)
        except Exception as exc:
            raise transient(exc) from None
        return [{"id": h["id"], "score": float(h["distance"]), **h.get("entity", {})} for h in hits[0]]
