"""The companion of claims (``<collection>_claims``): which version of a document each share-group
member is writing now, so that the newest version ends in Milvus whatever order the writes land in.

A share group may hand two versions of one document to two members at once, and a Milvus upsert is
last-write-wins: the version guard's read, then write, lets the older version win when it is read
before the newer is written and written after it. A claim is a row per (document, version) that no
other version overwrites; ``worker.steps.writing.ordering`` says how members use them. Ids reach
Milvus only as string literals (``connectors.milvus.expressions``)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from connectors.milvus.expressions import field_in
from connectors.milvus.schema import DOC_ID_MAX_LENGTH, SOURCE_MAX_LENGTH

#: The fields a claim row is read with.
CLAIM_FIELDS = ("id", "doc_id", "source", "source_offset", "updated_at", "written")


@dataclass(frozen=True)
class Claim:
    """One member's claim on writing ``doc`` at version ``(source, offset)``: made ``at_ms`` (its
    writer's wall clock), ``written`` once that member's rows are in."""

    doc: str
    source: str
    offset: int
    at_ms: int = 0
    written: bool = False

    @property
    def id(self) -> str:
        """The row's key: one per (document, version), whoever claims it (a record delivered again
        claims the same row)."""
        key = f"{len(self.doc)}:{self.doc}\n{self.source}\n{self.offset}".encode()
        return hashlib.sha256(key).hexdigest()

    def row(self) -> dict[str, Any]:
        return {"id": self.id, "doc_id": self.doc, "source": self.source, "source_offset": self.offset,
                "updated_at": self.at_ms, "written": self.written, "marker": [1.0, 0.0]}


def claims_schema() -> Any:
    """The claims' collection: a row per claimed (document, version). Milvus wants a vector field in
    every collection: ``marker`` is a constant 2-dim vector, never searched."""
    from pymilvus import DataType, MilvusClient

    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=64)
    schema.add_field("doc_id", DataType.VARCHAR, max_length=DOC_ID_MAX_LENGTH)
    schema.add_field("source", DataType.VARCHAR, max_length=SOURCE_MAX_LENGTH)
    schema.add_field("source_offset", DataType.INT64)
    schema.add_field("updated_at", DataType.INT64)
    schema.add_field("written", DataType.BOOL)
    schema.add_field("marker", DataType.FLOAT_VECTOR, dim=2)
    return schema


class ClaimCalls:
    """The claim calls of a store (mixed into ``MilvusStore``: its client, timeout and failures)."""

    _client: Any
    timeout: float
    claims_collection: str
    _failure: Callable[[Exception], Exception]

    def claim(self, claims: list[Claim]) -> None:
        """Make or renew each claim (upserted: the same version claimed again is the same row)."""
        if claims:
            self._call(self._client.upsert, self.claims_collection, [c.row() for c in claims])

    def claims(self, docs: list[str]) -> list[Claim]:
        """Every claim on ``docs``, read at Strong consistency."""
        if not docs:
            return []
        rows = self._call(self._client.query, self.claims_collection, filter=field_in("doc_id", docs),
                          output_fields=list(CLAIM_FIELDS), consistency_level="Strong")
        return [Claim(r["doc_id"], r["source"], int(r["source_offset"]), int(r["updated_at"]), bool(r["written"]))
                for r in rows]

    def unclaim(self, ids: list[str]) -> None:
        """Remove the claims of these row keys (``Claim.id``)."""
        if ids:
            self._call(self._client.delete, self.claims_collection, filter=field_in("id", ids))

    def _call(self, call, *args, **kwargs):
        try:
            return call(*args, timeout=self.timeout, **kwargs)
        except Exception as exc:
            raise self._failure(exc) from None
