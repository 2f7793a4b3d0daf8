"""Reads of a collection (or an alias): nearest rows, counts and scans, all at Strong consistency
where the caller needs to see the latest writes. Every failure raises TransientError."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from connectors.milvus.connection import MilvusConnection, transient
from connectors.milvus.expressions import field_in
from connectors.milvus.schema import CHUNK_FIELDS, bm25_text, chunk_id, sparse_kind_of
from schemas.errors import ConfigError
from schemas.sparse import SparseKind


class MilvusReader(MilvusConnection):
    """Reads of one collection or alias."""

    def exists(self) -> bool:
        try:
            return bool(self._client.has_collection(self.collection, timeout=self.timeout))
        except Exception as exc:
            raise transient(exc) from None

    def describe(self) -> dict:
        try:
            return self._client.describe_collection(self.collection, timeout=self.timeout)
        except Exception as exc:
            raise transient(exc) from None

    def dim(self, info: dict | None = None) -> int:
        """The dense vectors' dimension (from ``info``, :meth:`describe`'s answer, when given)."""
        return next(int(f["params"]["dim"]) for f in (info or self.describe())["fields"] if f["name"] == "vector")

    def sparse_kind(self, info: dict | None = None) -> SparseKind:
        """The collection's sparse side."""
        return sparse_kind_of(info or self.describe())

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
            rows = self._client.query(self.collection, filter=field_in("id", [chunk_id(d, 0) for d in doc_ids]),
                                      output_fields=["doc_id"], timeout=self.timeout, consistency_level="Strong")
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
        """The ``limit`` nearest chunk rows by the dense vector: ``id`` (the chunk's), ``score``, and the
        row's ``doc_id``, ``chunk_index``, ``chunk_count``, span, ``excerpt``, ``metadata`` and ``model``."""
        return self.search_by(Query(dense=vector), "dense", limit)

    def search_by(self, query: Query, mode: str, limit: int = 5, weights: tuple[float, float] | None = None,
                  kind: SparseKind | None = None, window: int | None = None) -> list[dict]:
        """The ``limit`` best chunk rows for ``query`` (rows as :meth:`search`): ``dense`` by the dense
        vector (COSINE), ``sparse`` by the sparse side (BM25 on the query's text, or IP on its learned
        sparse vector), ``hybrid`` both, each side's best ``window`` rows (default ``limit``) fused by
        reciprocal rank (RRF, k=60) or, with ``weights`` (dense, sparse), by weighted scores.
        ``kind``: the collection's sparse side, when known."""
        from pymilvus import AnnSearchRequest, RRFRanker, WeightedRanker

        fields = [*CHUNK_FIELDS, "excerpt", "metadata", "model", "content_hash"]
        kind = SparseKind(kind) if kind else (self.sparse_kind() if mode != "dense" else SparseKind.OFF)
        side = limit if mode != "hybrid" else (window or limit)
        requests = []
        if mode in ("dense", "hybrid"):
            requests.append(AnnSearchRequest(data=[query.dense], anns_field="vector", limit=side,
                                             param={"metric_type": "COSINE"}))
        if mode in ("sparse", "hybrid"):
            if kind is SparseKind.OFF:
                raise ConfigError(f"collection {self.collection!r} has no sparse field: search it with --mode dense, "
                                  "or fill a collection made with EMBEDSTREAM_SPARSE (`embedstream migrate`)")
            data = bm25_text(query.text) if kind is SparseKind.BM25 else _sparse_dict(query.sparse)
            requests.append(AnnSearchRequest(data=[data], anns_field="sparse", limit=side,
                                             param={"metric_type": kind.metric}))
        try:
            if len(requests) == 1:
                r = requests[0]
                hits = self._client.search(self.collection, data=r.data, anns_field=r.anns_field, limit=limit,
                                           search_params=r.param, output_fields=fields, timeout=self.timeout)
            else:
                ranker = WeightedRanker(*weights) if weights else RRFRanker()
                hits = self._client.hybrid_search(self.collection, requests, ranker=ranker, limit=limit,
                                                  output_fields=fields, timeout=self.timeout)
        except Exception as exc:
            raise transient(exc) from None
        return [{"id": h["id"], "score": float(h["distance"]), **h.get("entity", {})} for h in hits[0]]


@dataclass
class Query:
    """One search query: its dense vector, its text (BM25 analyses it in Milvus) and its learned sparse
    vector (``(indices, values)``), each where the mode needs it."""

    dense: Any = None
    text: str = ""
    sparse: tuple[Any, Any] | None = None


def _sparse_dict(vector: tuple[Any, Any] | None) -> dict[int, float]:
    if vector is None:
        raise ValueError("a learned sparse search needs the query's sparse vector")
    return {int(i): float(v) for i, v in zip(*vector)}
