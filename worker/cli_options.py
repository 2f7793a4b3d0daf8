"""Typer option declarations shared by the commands, each declared once.

Every option named after a setting overrides the ``EMBEDSTREAM_*`` variable of the same name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

Bootstrap = Annotated[str | None, typer.Option(
    "--kafka-bootstrap-servers", help="Kafka brokers, host:port[,...] \\[env: EMBEDSTREAM_KAFKA_BOOTSTRAP_SERVERS]")]
InputTopic = Annotated[str | None, typer.Option(
    "--input-topic", help="Topic of documents \\[env: EMBEDSTREAM_INPUT_TOPIC; default: documents]")]
OutputTopic = Annotated[str | None, typer.Option(
    "--output-topic", help="Topic of embeddings \\[env: EMBEDSTREAM_OUTPUT_TOPIC; default: embeddings]")]
DlqTopic = Annotated[str | None, typer.Option(
    "--dlq-topic", help="Dead-letter topic \\[env: EMBEDSTREAM_DLQ_TOPIC; default: documents.dlq]")]
GroupId = Annotated[str | None, typer.Option(
    "--group-id", help="Consumer group of the workers \\[env: EMBEDSTREAM_GROUP_ID; default: embedstream]")]
GroupInstanceId = Annotated[str | None, typer.Option(
    "--group-instance-id", help="Static membership id, e.g. the pod name \\[env: EMBEDSTREAM_GROUP_INSTANCE_ID]")]
Model = Annotated[str | None, typer.Option(
    "--model", help="sentence-transformers model path or name \\[env: EMBEDSTREAM_MODEL; default: packaged "
    "all-MiniLM-L6-v2]")]
Precision = Annotated[str | None, typer.Option(
    "--precision", help="auto|fp32|fp16|bf16; auto = fp16 on CUDA, bf16 on CPUs with avx512_bf16/AMX, else fp32 "
    "\\[env: EMBEDSTREAM_PRECISION]")]
Device = Annotated[str | None, typer.Option("--device", help="auto|cpu|cuda \\[env: EMBEDSTREAM_DEVICE]")]
MaxBatchSize = Annotated[int | None, typer.Option(
    "--max-batch-size", help="Close a batch at this many records \\[env: EMBEDSTREAM_MAX_BATCH_SIZE; default: 256]")]
MaxBatchTokens = Annotated[int | None, typer.Option(
    "--max-batch-tokens", help="Close a batch at this many tokens \\[env: EMBEDSTREAM_MAX_BATCH_TOKENS; "
    "default: 32768]")]
MaxBatchWaitMs = Annotated[int | None, typer.Option(
    "--max-batch-wait-ms", help="Close a batch when its oldest record waited this long "
    "\\[env: EMBEDSTREAM_MAX_BATCH_WAIT_MS; default: 100]")]
RedisUrl = Annotated[str | None, typer.Option(
    "--redis-url", help="Redis for the embedding cache; unset = no cache \\[env: EMBEDSTREAM_REDIS_URL]")]
CacheTtl = Annotated[int | None, typer.Option(
    "--cache-ttl-seconds", help="Cache entry lifetime \\[env: EMBEDSTREAM_CACHE_TTL_SECONDS; default: 7 days]")]
MilvusUri = Annotated[str | None, typer.Option(
    "--milvus-uri", help="Milvus server, e.g. http://host:19530 \\[env: EMBEDSTREAM_MILVUS_URI]")]
MilvusCollection = Annotated[str | None, typer.Option(
    "--milvus-collection", help="Milvus collection \\[env: EMBEDSTREAM_MILVUS_COLLECTION; default: embeddings]")]
MetricsPort = Annotated[int | None, typer.Option(
    "--metrics-port", help="Port of /metrics, /healthz, /readyz; 0 = off \\[env: EMBEDSTREAM_METRICS_PORT; "
    "default: 9400]")]
StateDir = Annotated[Path, typer.Option(
    "--state-dir", help="Where the local stack keeps its pids, ports, logs and data")]
