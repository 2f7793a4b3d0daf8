"""Milvus, split by job. Each class opens (or shares) one dedicated client of a collection:

- :class:`MilvusStore` (``writes``): the sink's hot path — chunk rows upserted and deleted, the
  versions the guard compares, the companion of deletes.
- :class:`MilvusReader` (``reads``): search, counts and scans, for ``search``, ``migrate`` and tests.
- :class:`MilvusAdmin` (``admin``): collections and aliases — created, checked, taken over, moved,
  dropped — at start-up and in ``migrate``.

The collection's shape is ``schema``. Every call carries ``timeout=`` (a frozen server blocks forever
without it), and every failure of the server or the network on the write and read paths becomes
:class:`~schemas.errors.TransientError`, so the worker retries instead of dead-lettering; at start-up
(administration) it becomes a :class:`~schemas.errors.ConfigError` that names the setting to check.
"""

from connectors.milvus.admin import MilvusAdmin
from connectors.milvus.connection import MilvusConnection
from connectors.milvus.reads import MilvusReader
from connectors.milvus.writes import MilvusStore, Version

__all__ = ["MilvusAdmin", "MilvusConnection", "MilvusReader", "MilvusStore", "Version"]
