"""Collections and aliases: what a worker prepares at start-up, and what ``migrate`` moves.

Readers query an alias; each vector space writes a collection of its own behind it. Failures at
start-up are :class:`ConfigError` naming the setting to check; the calls ``migrate`` makes mid-run
(moving an alias, listing collections) raise TransientError."""

from __future__ import annotations

import logging
import time
from typing import Any

from connectors.milvus.claims import claims_schema
from connectors.milvus.connection import MilvusConnection, transient
from connectors.milvus.legacy import adopt as adopt_legacy
from connectors.milvus.schema import add_indexes, check_shape, collection_schema, tombstone_schema
from schemas.errors import ConfigError, TransientError
from schemas.sparse import SparseKind

log = logging.getLogger(__name__)


class MilvusAdmin(MilvusConnection):
    """Creates, checks, takes over and drops this collection (and its companion of deletes), and
    points aliases to it."""

    #: How long a start-up keeps trying while another worker is half-way through creating the same
    #: collection (milvus-lite makes the directory before the schema file that ``has_collection``
    #: looks for, so the loser of the race first sees "File exists" and then no collection).
    RACE_WINDOW_S = 10.0

    def ensure_collection(self, dim: int, sparse: SparseKind = SparseKind.OFF) -> None:
        """Create the collection for ``dim`` with the sparse side ``sparse`` (and its companion) if
        missing. Raise :class:`ConfigError` when it exists with another dim (the model changed), another
        sparse side, or in the shape from before chunking (a row per document). Workers starting
        together may race to create it: the loser uses the winner's, trying again for up to
        :attr:`RACE_WINDOW_S` while the winner finishes (every step is idempotent)."""
        deadline = time.monotonic() + self.RACE_WINDOW_S
        while True:
            try:
                return self._ensure_once(dim, sparse)
            except ConfigError:
                raise
            except Exception as exc:
                if time.monotonic() >= deadline:
                    raise ConfigError(f"Milvus at {self.where!r} did not answer ({type(exc).__name__}: {exc}). "
                                      "Check EMBEDSTREAM_MILVUS_URI and EMBEDSTREAM_MILVUS_TOKEN.") from None
                log.info("Milvus: %s while preparing %r; another worker may be creating it, trying again",
                         type(exc).__name__, self.collection)
                time.sleep(0.5)

    def _ensure_once(self, dim: int, sparse: SparseKind) -> None:
        c = self._client
        index = add_indexes(c.prepare_index_params(), sparse)
        if not self._create(self.collection, collection_schema(dim, sparse), index):
            check_shape(self.collection, c.describe_collection(self.collection, timeout=self.timeout), dim, sparse)
            c.load_collection(self.collection, timeout=self.timeout)
        marker = c.prepare_index_params()
        marker.add_index(field_name="marker", index_type="AUTOINDEX", metric_type="L2")
        if not self._create(self.tombstones, tombstone_schema(), marker):
            c.load_collection(self.tombstones, timeout=self.timeout)

    def ensure_claims(self) -> None:
        """Create the companion of claims (``connectors.milvus.claims``) if missing: a share group's
        members need it; a consumer group's never touch it."""
        c = self._client
        marker = c.prepare_index_params()
        marker.add_index(field_name="marker", index_type="AUTOINDEX", metric_type="L2")
        if not self._create(self.claims_collection, claims_schema(), marker):
            c.load_collection(self.claims_collection, timeout=self.timeout)

    def _create(self, name: str, schema: Any, index: Any) -> bool:
        """Create collection ``name`` (loaded) unless it exists; True when this call created it. A
        collection another process created meanwhile counts as existing (seen with three workers
        started at once: "collection already exists")."""
        c = self._client
        if not self.has(name):
            try:
                c.create_collection(name, schema=schema, timeout=self.timeout)
            except Exception:
                if not self.has(name):
                    raise
                return False
            # Not create_collection(index_params=...): pymilvus then waits for the index polling every
            # 0.5 s, sleeping first, though an empty collection's index is built at once (measured: 1 s
            # of each first start, for the collection and its companion). Loading waits for it.
            c.create_index(name, index, timeout=self.timeout, sync=False)
            c.load_collection(name, timeout=self.timeout)
            return True
        return False

    def adopt(self, legacy: str, model_id: str, dim: int, sparse: SparseKind = SparseKind.OFF) -> bool:
        """Take over ``legacy``, a collection from before aliases (``connectors.milvus.legacy.adopt``)."""
        return adopt_legacy(self, legacy, model_id, dim, sparse)

    def prepare(self, alias: str, model_id: str, dim: int, sparse: SparseKind = SparseKind.OFF) -> str:
        """What a worker does at start-up: adopt a collection from before aliases named ``alias``,
        create this collection if missing (checked for ``dim`` and the sparse side ``sparse``), create
        the alias if missing. Returns the collection the alias points to. Raises :class:`ConfigError`."""
        self.adopt(alias, model_id, dim, sparse)
        self.ensure_collection(dim, sparse)
        try:
            return self.ensure_alias(alias)
        except TransientError as exc:
            raise ConfigError(f"Milvus at {self.where!r} did not answer ({exc})") from None

    def ensure_alias(self, alias: str) -> str:
        """Create ``alias`` pointing to this collection unless it exists; returns the collection it
        points to. An alias pointing elsewhere is left alone (moving it is `migrate`'s job)."""
        target = self.alias_target(alias)
        if target is None:
            try:
                self._client.create_alias(self.collection, alias, timeout=self.timeout)
                log.info("alias %r → %r created", alias, self.collection)
                return self.collection
            except Exception as exc:
                target = self.alias_target(alias)  # another worker created it meanwhile
                if target is None:
                    raise ConfigError(f"could not create alias {alias!r} for {self.collection!r} in Milvus at "
                                      f"{self.where!r}: {exc}") from None
        if target != self.collection:
            log.warning("alias %r points to %r; this worker writes %r. `embedstream migrate` moves the alias "
                        "once this collection has caught up", alias, target, self.collection)
        return target

    def point_alias(self, alias: str) -> None:
        """Move ``alias`` to this collection in one call (create it if missing)."""
        try:
            if self.alias_target(alias) is None:
                self._client.create_alias(self.collection, alias, timeout=self.timeout)
            else:
                self._client.alter_alias(self.collection, alias, timeout=self.timeout)
        except TransientError:
            raise
        except Exception as exc:
            raise transient(exc) from None

    #: The collection property that keeps the canary's record (``worker.embedding.canary``).
    CANARY_PROPERTY = "embedstream.canary"

    def canary(self) -> str | None:
        """The canary record this collection keeps (None: none yet). Raises TransientError."""
        try:
            found = self._client.describe_collection(self.collection, timeout=self.timeout).get("properties") or {}
        except Exception as exc:
            raise transient(exc) from None
        return found.get(self.CANARY_PROPERTY)

    def keep_canary(self, record: str) -> None:
        """Keep ``record`` with this collection, in place of any before. Raises TransientError."""
        try:
            self._client.alter_collection_properties(self.collection, properties={self.CANARY_PROPERTY: record},
                                                     timeout=self.timeout)
        except Exception as exc:
            raise transient(exc) from None

    def collections(self, prefix: str = "") -> list[str]:
        """Names of the collections starting with ``prefix``."""
        try:
            return sorted(n for n in self._client.list_collections(timeout=self.timeout) if n.startswith(prefix))
        except Exception as exc:
            raise transient(exc) from None

    def drop_collection(self, name: str) -> None:
        """Drop collection ``name`` if it exists (not its companion)."""
        try:
            if self.has(name):
                self._client.drop_collection(name, timeout=self.timeout)
        except Exception as exc:
            raise transient(exc) from None

    def drop(self) -> None:
        """Drop the collection and its companions (deletes, claims); opened on an alias, the alias and
        the collection it points to."""
        target = self.alias_target(self.collection)
        if target is not None:
            self._client.drop_alias(self.collection, timeout=self.timeout)
        name = target or self.collection
        for n in (name, f"{name}_deleted", f"{name}_claims"):
            self.drop_collection(n)
