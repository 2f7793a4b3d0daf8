"""The chain of steps, built in one place. Read ``build_chain`` top to bottom to see every step a
record goes through, in order:

    polling thread:  1 validate → 2 estimate tokens → 3 DLQ breaker → 4 batch        (Intake)
    pipeline:        5 prepare: chunk + cache lookup + token ids ─(Pending)→ 6 embed: the model ─(Fresh)→
                     7 sink: fence + version guard → Milvus + output/DLQ topics + cache fill ─(Written)→
    polling thread:  8 store offsets → commit, or acknowledge records               (the member's Ledger)

Each stage hands each batch on with a value: what it decided about that batch (``worker.core.pipeline``).

Steps 7 and 8 follow the delivery and the ledger chosen together at assembly (``worker.assembly.groups``;
``worker.core.delivery`` tells the order once: under exactly-once the sink commits each group's
offsets in its transaction, in step 7).

A new step is one line here: a ``Stage`` in the pipeline's list (its own thread, queue and retry
state), or a step inside intake. The connectors and the model are opened by ``worker.assembly.runner``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from connectors.milvus import MilvusStore
from connectors.redis_cache import RedisCache
from connectors.registry import SchemaRegistry
from schemas.errors import ConfigError
from worker.core.delivery import Delivery
from worker.core.fence import Fence
from worker.core.lanes import MODEL_STAGE, LaneGate
from worker.core.member import Chain
from worker.core.pipeline import Pipeline, Stage, Step
from worker.core.records import Batch, Share, split_by_model
from worker.embedding.base import Embedder
from worker.embedding.models import ModelSet
from worker.settings import (
    BatchingSettings,
    ChunkingSettings,
    DeliverySettings,
    KafkaSettings,
    OperationsSettings,
    RecordSettings,
    Settings,
)
from worker.steps.model.chunk import Chunker
from worker.steps.model.embed import EmbedStep
from worker.steps.polling.batcher import Batcher
from worker.steps.polling.dlq_limit import DlqLimit
from worker.steps.polling.intake import Intake
from worker.steps.polling.validate import Validator
from worker.steps.writing.fit import TopicLimits
from worker.steps.writing.ordering import ShareOrder
from worker.steps.writing.output import output_format
from worker.steps.writing.sink import NO_OUTPUT, SinkStep
from worker.steps.writing.targets import ModelTarget
from worker.steps.writing.versions import VersionGuard


def chunker_for(s: ChunkingSettings, embedder: Embedder,
                dead_lettered: Callable[[str, str], None] = lambda reason, message: None) -> Chunker:
    """The chunk step for the model; raises :class:`ConfigError` on chunk settings it cannot serve."""
    room = embedder.chunk_room
    tokens = s.chunk_tokens or room
    if tokens > room:
        prompt = f" and {embedder.prompt_tokens} of the document prompt" if embedder.prompt_tokens else ""
        raise ConfigError(f"EMBEDSTREAM_CHUNK_TOKENS={tokens} is more than the model takes: {room} tokens "
                          f"({embedder.max_seq_length} less {embedder.special_tokens} special ones{prompt}). Lower "
                          "it, or unset it for the model's own length.")
    if 2 * s.chunk_overlap > tokens:
        raise ConfigError(f"EMBEDSTREAM_CHUNK_OVERLAP={s.chunk_overlap} is more than half a chunk ({tokens} tokens): "
                          "lower it (the default is 32).")
    return Chunker(embedder, s.chunking, tokens, s.chunk_overlap, s.max_chunks, dead_lettered)


#: One model's half of a stage: its share of the group and, per batch of the group, what the stage
#: before left for that model; returns one value per batch of the group.
ModelStep = Callable[[Share, list[dict]], list[dict]]


def by_model(steps: dict[str, ModelStep], loaded: Callable[[str], bool]) -> Step:
    """One stage's step that splits a group by model once and runs each model's step on its share:
    the models the group needs, those already loaded first (under a memory cap that holds one model,
    a group of two models swaps once, not twice). A forward pass never mixes models. Each batch is
    handed on with what each model's step returned for it, by model name (a model with nothing for
    the batch is left out)."""
    def run(group: list[Batch], before: list[dict | None]) -> list[dict]:
        shares = split_by_model(group)
        out: list[dict] = [{} for _ in group]
        for name in sorted(shares, key=lambda n: not loaded(n)):
            values = steps[name](shares[name], [(b or {}).get(name, {}) for b in before])
            for by_name, value in zip(out, values):
                if value:
                    by_name[name] = value
        return out
    return run


def chunk_then_prepare(chunker: Chunker, step: EmbedStep) -> ModelStep:
    """The prepare stage's work for one model: the chunk step, then the cache lookup and the token ids
    (one thread: both use the tokenizer). Nothing comes before it."""
    def run(share: Share, _before: list[dict]) -> list[dict]:
        chunker.process(share)
        return step.prepare(share)
    return run


def _no_gate(stage: str, step: Step) -> Step:
    """One lane: every stage's step as it is."""
    return step


def build_chain(s: Settings, delivery: Delivery, models: ModelSet,
                caches: dict[str, RedisCache | None], stores: dict[str, MilvusStore], fence: Fence,
                topic_ids: Mapping[str, str], registry: SchemaRegistry | None = None,
                limits: TopicLimits | None = None, dead_letters: bool = True,
                lookup_ids: Callable[[], Mapping[str, str]] | None = None, max_deliveries: int | None = None,
                model_gate: LaneGate | None = None, claim_expiry_s: float | None = None) -> Chain:
    """Every step, in the order a record meets it (the pipeline is built first only because intake
    hands its batches to it), each given its own section of the settings. ``models``, ``caches`` and
    ``stores`` are by model name; ``delivery`` makes the sink's groups and their offsets durable
    (``worker.core.delivery``); ``limits``: the largest record the output and DLQ topics take;
    ``dead_letters=False`` writes none of the dead letters the live worker writes alike (a migration's
    backfill), only those its own model, collection or output find (``sink.OWN_DEAD_LETTERS``);
    ``topic_ids`` names the input topic's partitions for the version guard, ``lookup_ids`` reads them
    again when a record looks superseded; ``max_deliveries``: a share group's bound on a record's
    deliveries (None: a consumer group's records carry no count); ``model_gate``: this lane's way through
    the gate of a worker with a backfill lane (``worker.core.lanes.ModelGate.live_stage`` or
    ``backfill_stage``), around every stage's step (None: one lane, no gate); ``claim_expiry_s``: a
    share member's claims on the versions it writes, live that long (``worker.steps.writing.ordering``;
    None: a consumer group's, which claims nothing)."""
    handles = models.handles
    limits = limits or TopicLimits()
    topics, records, durable = s.section(KafkaSettings), s.section(RecordSettings), s.section(DeliverySettings)
    batching = s.section(BatchingSettings)
    # The breaker (3) counts the dead letters the chunk and sink steps make too (late ones).
    breaker = DlqLimit(durable.dlq_max_consecutive, durable.dlq_max_ratio, durable.dlq_ratio_window)
    targets = {n: ModelTarget(stores[n], m.model_id, m.dim, caches[n], m.sparse) for n, m in handles.items()}
    guard = VersionGuard(topic_ids, lookup_ids)
    order = None if claim_expiry_s is None else ShareOrder(guard.source, claim_expiry_s)
    sink = SinkStep(targets, delivery, fence=fence, guard=guard, order=order,
                    output_topic=topics.output_topic, dlq_topic=topics.dlq_topic,
                    delivery_timeout_s=topics.kafka_timeout_seconds,
                    output=(output_format(records.output_format, topics.output_topic, registry)
                            if topics.output_topic != NO_OUTPUT else None), limits=limits,
                    dead_lettered=breaker.record_late, dead_letters=dead_letters)
    chunking = s.section(ChunkingSettings)
    chunkers = {n: chunker_for(chunking, m, breaker.record_late) for n, m in handles.items()}
    # Past this many characters a text may make too many chunks for some model: its record is kept.
    safe_chars = min(c.safe_chars for c in chunkers.values())
    steps = {n: EmbedStep(m, caches[n], model=n) for n, m in handles.items()}
    gate = model_gate or _no_gate
    prepare = Stage("prepare", gate("prepare", by_model({n: chunk_then_prepare(chunkers[n], steps[n])  # 5 per
                                                         for n in handles}, models.loaded)))  # model: chunk,
    passes = by_model({n: steps[n].embed for n in handles}, models.loaded)             #   cache, token ids
    embed = Stage(MODEL_STAGE, gate(MODEL_STAGE, passes))                              # 6 the passes
    pipeline = Pipeline([prepare, embed, Stage("sink", gate("sink", sink.process))],  # 7 Milvus + topics
                        backoff_max=s.section(OperationsSettings).retry_backoff_max_seconds, release=sink.close)
    intake = Intake(
        Validator(records.max_text_bytes, models.resolve,                            # 1 Item | Delete | DeadLetter
                  lambda chars: chars > safe_chars,                                  #   (key = identity,
                  registry=registry, key_field=records.key_field,                    #   model by name)
                  keep_large=min(sink.planner.output_rooms.values()), forward=records.forwarded_headers,
                  max_deliveries=max_deliveries),
        lambda texts, model: handles[model].estimate_tokens(                         # 2 token estimate
            texts, chunked=chunking.chunking == "tokens"),
        breaker,                                                                     # 3 halt a bad deploy
        Batcher(batching.max_batch_size, batching.max_batch_tokens,                  # 4 count, tokens,
                batching.max_batch_wait_ms / 1000, max_bytes=batching.max_batch_bytes),  # deadline, bytes
        next_step=lambda batch: pipeline.submit(fence.stamp(batch)),                 #   (read in this tenure)
    )
    return Chain(intake, pipeline, fence, model_free=lambda: prepare.backlog + embed.backlog == 0)
