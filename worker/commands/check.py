"""``embedstream run --check``: reach each dependency the worker needs and load its models, then say
what is wrong, without joining the group and without creating or writing anything.

Each check is a row: ``ok`` (True), a failure that stops a worker at start-up (False: a setting to
fix), or a warning (None: an outage the worker rides out, e.g. Redis or the schema registry not
answering: it runs without hits, or holds framed records, until they answer)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from schemas.errors import ConfigError
from worker.settings import Settings

if TYPE_CHECKING:
    from worker.embedding.base import Embedder


@dataclass
class Check:
    part: str
    ok: bool | None
    detail: str


def _attempt(checks: list[Check], part: str, step: Callable[[], str], outage_is_warning: bool = False) -> bool:
    """Run ``step`` (its result: the row's detail) into a row of ``checks``; True when it passed."""
    try:
        checks.append(Check(part, True, step()))
        return True
    except ConfigError as exc:
        checks.append(Check(part, False, str(exc)))
    except Exception as exc:  # an outage, or a client refusing its properties
        checks.append(Check(part, None if outage_is_warning else False, f"{type(exc).__name__}: {exc}"))
    return False


def run_checks(s: Settings) -> list[Check]:
    """The checks of ``s``, in the order a worker meets them at start-up; the later ones are skipped
    where they need what failed (no topics without a broker, no collection without a model)."""
    from worker.assembly.naming import collection_of
    from worker.assembly.runner import load_models
    from worker.embedding.models import describe

    checks: list[Check] = []
    if not _attempt(checks, "settings", partial(_required, s)):
        return checks
    if _attempt(checks, "kafka", partial(_broker, s)):
        _attempt(checks, "topics", partial(_topics, s))
    models = None

    def load() -> str:
        nonlocal models
        models = load_models(s)
        return describe(models)

    _attempt(checks, "model", load)
    handles = models.handles if models is not None else {}
    for name, model in handles.items():
        of = f" ({name})" if len(handles) > 1 else ""
        _attempt(checks, f"milvus{of}", partial(_milvus, s, collection_of(s, name, model), model))
        _attempt(checks, f"redis{of}", partial(_cache, s, model), outage_is_warning=True)
    if s.backfill_model:
        _attempt(checks, "backfill lane", partial(_backfill, s))
    _attempt(checks, "schema registry", partial(_registry, s), outage_is_warning=True)
    return checks


def _backfill(s: Settings) -> str:
    """EMBEDSTREAM_BACKFILL_MODEL loads, and where its lane would write (``worker.assembly.lanes``)."""
    from worker.assembly.lanes import backfill_settings, check_supported
    from worker.assembly.naming import collection_of
    from worker.assembly.runner import load_embedder

    check_supported(s)
    model = load_embedder(s.model_copy(update={"model": s.backfill_model}))
    lane = backfill_settings(s, model)
    return (f"{model.model_id} loads; it would write {collection_of(s, '', model)} in group {lane.group_id}, up to "
            f"{lane.max_inflight_batches} batches in flight")


def _required(s: Settings) -> str:
    from worker.assembly.runner import require_connections

    require_connections(s)
    return "EMBEDSTREAM_KAFKA_BOOTSTRAP_SERVERS and EMBEDSTREAM_MILVUS_URI are set"


def _broker(s: Settings) -> str:
    from connectors.kafka import check_broker

    check_broker(s.kafka_common())
    return f"a broker answered at {s.kafka_bootstrap_servers}"


def _topics(s: Settings) -> str:
    from worker.assembly.runner import check_topics, topic_limits

    check_topics(s)
    limits = topic_limits(s)
    return (f"{s.input_topic}, {s.output_topic} and {s.dlq_topic} exist; records up to {limits.output:,} bytes "
            f"to the output, {limits.dlq:,} to the DLQ")


def _milvus(s: Settings, collection: str, model: Embedder) -> str:
    from connectors.milvus import MilvusReader
    from connectors.milvus.schema import check_shape
    from worker.assembly.runner import open_milvus

    reader = open_milvus(s, MilvusReader, collection)
    try:
        if not reader.exists():
            return f"reached; {collection} does not exist yet: the worker creates it at its first start"
        check_shape(collection, reader.describe(), model.dim, model.sparse.kind)
        return f"{collection} exists, {model.dim} dimensions, as this model writes"
    finally:
        reader.close()


def _cache(s: Settings, model: Embedder) -> str:
    from worker.assembly.runner import open_cache

    if s.redis_url is None:
        return "EMBEDSTREAM_REDIS_URL unset: the worker runs without the cache"
    c = open_cache(s, model)
    if c is not None and c.errors:
        raise ConnectionError("Redis did not answer: the worker runs without hits until it does")
    return "Redis answered"


def _registry(s: Settings) -> str:
    from worker.assembly.runner import open_registry

    reg = open_registry(s)
    if reg is None:
        return "EMBEDSTREAM_SCHEMA_REGISTRY_URL unset: no registry-framed records"
    return f"{len(reg.client.get_subjects())} subjects at {reg.url}"
