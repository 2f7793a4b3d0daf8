"""Typer option declarations shared by the commands, each declared once.

Every option named after a setting overrides the ``EMBEDSTREAM_*`` variable of the same name; its
help names that variable and the default, read from :class:`Settings` (never written twice).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from worker.settings import Settings


def _setting(name: str, what: str, default: str | None = None) -> Any:
    """A ``--name`` option for setting ``name``: its help ends ``[env: EMBEDSTREAM_NAME; default: …]``."""
    shown = default if default is not None else Settings.model_fields[name].default
    tail = f"; default: {shown}" if shown is not None else ""
    return typer.Option("--" + name.replace("_", "-"), help=f"{what} [env: EMBEDSTREAM_{name.upper()}{tail}]")


Bootstrap = Annotated[str | None, _setting("kafka_bootstrap_servers", "Kafka brokers, host:port[,...]")]
InputTopic = Annotated[str | None, _setting("input_topic", "Topic of documents")]
OutputTopic = Annotated[str | None, _setting("output_topic", "Topic of embeddings")]
DlqTopic = Annotated[str | None, _setting("dlq_topic", "Dead-letter topic")]
GroupId = Annotated[str | None, _setting("group_id", "Consumer group of the workers")]
Delivery = Annotated[str | None, _setting(
    "delivery", "at-least-once|exactly-once; exactly-once commits each group of batches' output and DLQ records "
                "with their input offsets in one Kafka transaction", "at-least-once")]
GroupInstanceId = Annotated[str | None, _setting("group_instance_id", "Static membership id, e.g. the pod name")]
Model = Annotated[str | None, _setting("model", "sentence-transformers model path or name",
                                       "the packaged all-MiniLM-L6-v2")]
Precision = Annotated[str | None, _setting(
    "precision", "auto|fp32|fp16|bf16|int8; auto = fp16 on CUDA; on CPUs with VNNI int8 by OpenVINO where "
                 "it is installed (embedstream[int8]), else bf16 on CPUs with avx512_bf16/AMX, else int8 by "
                 "onnxruntime on CPUs with VNNI, else fp32; int8 = the model quantized once (OpenVINO, else "
                 "onnxruntime) and cached on disk, on CPUs")]
Device = Annotated[str | None, _setting("device", "auto|cpu|cuda")]
MaxBatchSize = Annotated[int | None, _setting("max_batch_size", "Close a batch at this many records")]
MaxBatchTokens = Annotated[int | None, _setting("max_batch_tokens", "Close a batch at this many tokens")]
MaxBatchWaitMs = Annotated[int | None, _setting("max_batch_wait_ms", "Close a batch when its oldest record "
                                                                    "waited this many milliseconds")]
RedisUrl = Annotated[str | None, _setting("redis_url", "Redis for the embedding cache; unset = no cache")]
CacheTtl = Annotated[int | None, _setting("cache_ttl_seconds", "Cache entry lifetime in seconds")]
MilvusUri = Annotated[str | None, _setting("milvus_uri", "Milvus server, e.g. http://host:19530")]
MilvusCollection = Annotated[str | None, _setting(
    "milvus_collection", "Milvus collection name: each model writes <name>__<model>_<version> behind the alias")]
MilvusAlias = Annotated[str | None, _setting(
    "milvus_alias", "Milvus alias that readers query and `migrate` moves", "the collection name")]
MetricsPort = Annotated[int | None, _setting("metrics_port", "Port of /metrics, /healthz, /readyz; 0 = off")]
Processes = Annotated[int | None, _setting(
    "processes", "Worker processes of the group to start here, e.g. several on one GPU; process i serves "
                 "its metrics on the metrics port + i and, with a static member id, joins as <id>-<i>")]
SchemaRegistryUrl = Annotated[str | None, _setting(
    "schema_registry_url", "Schema registry URL (reads registry-framed Avro)")]
OutputFormat = Annotated[str | None, _setting("output_format", "avro|avro-registry|json: output topic values")]
KeyField = Annotated[str | None, _setting(
    "key_field", "Field of a structured record key (JSON or registry Avro) that holds the document id")]
DocumentPrompt = Annotated[str | None, _setting(
    "document_prompt", "Text put before each document (\"\" = none)", "the model's document prompt")]
QueryPrompt = Annotated[str | None, _setting(
    "query_prompt", "Text put before each search query (\"\" = none)", "the model's query prompt")]
TruncateDim = Annotated[int | None, _setting(
    "truncate_dim", "Keep the first N dimensions of each vector (Matryoshka models), renormalised", "all")]
Models = Annotated[str | None, _setting(
    "models", "A set of models by name: JSON, or the path of a YAML/JSON file; a record's model field picks one",
    "one model, EMBEDSTREAM_MODEL")]
ModelMemoryMb = Annotated[int | None, _setting(
    "model_memory_mb", "MB of model weights held at once; the least recently used model is unloaded", "no limit")]
StateDir = Annotated[Path, typer.Option(
    "--state-dir", help="Where the local stack keeps its pids, ports, logs and data")]
def _one_of(*values: str):
    def check(value: str) -> str:
        if value not in values:
            raise typer.BadParameter(f"{value!r} is not one of {', '.join(values)}")
        return value
    return check


Broker = Annotated[str, typer.Option(
    "--broker", callback=_one_of("tansu", "mock"),
    help="The local stack's broker: tansu, or librdkafka's mock cluster (in memory; where Tansu cannot run)")]
