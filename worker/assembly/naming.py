"""Every Milvus name the worker derives, in one place.

- **The alias** readers query: ``EMBEDSTREAM_MILVUS_ALIAS``, else ``EMBEDSTREAM_MILVUS_COLLECTION``;
  with a model set (``EMBEDSTREAM_MODELS``) a template, ``{model}`` replaced by the model's name, or
  ``_<model>`` appended.
- **The collection** a model writes, one per vector space behind its alias:
  ``<collection>__<model>_<8 hex of the space id>`` (:func:`versioned_name`). Every worker of one
  model, prompt and dimension derives the same name; another space gets another collection, and
  ``embedstream migrate`` moves the alias.
- **The family** of an alias: the collections of every space behind it (``<collection>__``), which
  ``migrate --drop-old`` drops but the new one.
- **The backfill group** that re-reads the input topic into a new collection,
  ``<group>.migrate.<new collection>`` (:func:`backfill_group`): the same for ``embedstream migrate``'s
  backfill and a worker's backfill lane, and on every run, so either resumes the other's progress.
  ``<group>`` is the fleet's first group, never a backfill group's name again (:func:`fleet_group`):
  the second migration's group is as long as the first's.
- **The companions** of a collection: ``<collection>_deleted`` (each delete's version) and, in a
  share group, ``<collection>_claims`` (the versions being written) (``connectors.milvus``).
"""

from __future__ import annotations

import hashlib

from worker.embedding.base import Embedder
from worker.settings import Settings

#: Parts an alias's family from the space in a collection's name.
FAMILY_MARK = "__"


def milvus_safe(name: str) -> str:
    """``name`` with every character Milvus refuses in a collection name made ``_``."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def collection_name(template: str, model: str, several: bool) -> str:
    """The Milvus name of ``model``: ``template`` with ``{model}`` replaced; with several models and
    no placeholder, ``<template>_<model>``. Characters Milvus refuses become ``_``."""
    if "{model}" not in template and not several:
        return template
    safe = milvus_safe(model)
    return template.replace("{model}", safe) if "{model}" in template else f"{template}_{safe}"


def versioned_name(base: str, model_id: str, space_id: str) -> str:
    """The concrete collection of one vector space behind the alias ``base`` names:
    ``<base>__<model>_<8 hex of the space id>``, e.g. ``embeddings__all_MiniLM_L6_v2_1f0c9e2a``."""
    short = milvus_safe(str(model_id).rstrip("/").rsplit("/", 1)[-1])[:48].strip("_") or "model"
    while FAMILY_MARK in short:  # the mark parts the family from the space: once in a name
        short = short.replace(FAMILY_MARK, "_")
    return f"{base}{FAMILY_MARK}{short}_{hashlib.sha256(space_id.encode('utf-8')).hexdigest()[:8]}"


def family_prefix(collection: str) -> str:
    """What every collection behind the same alias as ``collection`` (a :func:`versioned_name`) starts with."""
    return collection.rsplit(FAMILY_MARK, 1)[0] + FAMILY_MARK


def alias_of(settings: Settings, name: str) -> str:
    """The Milvus alias that readers of model ``name`` query (EMBEDSTREAM_MILVUS_ALIAS, else
    EMBEDSTREAM_MILVUS_COLLECTION, as a template for a model set)."""
    return collection_name(settings.milvus_alias or settings.milvus_collection, name,
                           several=settings.models is not None)


def collection_of(settings: Settings, name: str, model: Embedder) -> str:
    """The Milvus collection model ``name`` writes: one per vector space behind the alias."""
    base = collection_name(settings.milvus_collection, name, several=settings.models is not None)
    return versioned_name(base, model.model_id, model.space_id)


#: Parts the fleet's own group from the collection in a backfill group's name.
MIGRATE_MARK = ".migrate."


def fleet_group(group_id: str) -> str:
    """The group a fleet started with: ``group_id`` less a migration's ``.migrate.<collection>``
    (the group the fleet was handed over to), so that names never grow with each migration."""
    return group_id.split(MIGRATE_MARK, 1)[0]


def backfill_group(settings: Settings, new_collection: str) -> str:
    """The consumer group that backfills ``new_collection`` from the input topic's start:
    ``<the fleet's first group>.migrate.<new collection>``, whichever group the fleet runs in now."""
    return f"{fleet_group(settings.group_id)}{MIGRATE_MARK}{new_collection}"
