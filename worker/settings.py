"""The worker's settings: one typed object, validated once at start-up.

Values come from ``EMBEDSTREAM_*`` environment variables, overridden by command-line flags of the
same name (the CLI is the only place that reads the environment). Any librdkafka property passes
through as ``EMBEDSTREAM_KAFKA__<property with dots as _>``; :func:`kafka_passthrough` collects
those, and :meth:`Settings.kafka_common` builds the librdkafka dict in this one place.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.redact import MASK, is_secret_key, token_parts, userinfo, without_userinfo

KAFKA_PREFIX = "EMBEDSTREAM_KAFKA__"


REGISTRY_PREFIX = "EMBEDSTREAM_SCHEMA_REGISTRY__"
#: Settings that hold URLs, which may carry ``user:password@``.
_URL_SETTINGS = ("milvus_uri", "schema_registry_url", "kafka_bootstrap_servers", "redis_url")

#: librdkafka properties the worker's guarantees rest on: refused through the passthrough unless set
#: to the worker's own value (None: refused whatever the value), with the guarantee they hold.
_COMMIT_AFTER_DURABLE = "offsets are committed only once a batch is in Milvus and on the output topic"
GUARDED_KAFKA: dict[str, tuple[str | None, str]] = {
    "enable.auto.commit": ("false", _COMMIT_AFTER_DURABLE),
    "enable.auto.offset.store": ("false", _COMMIT_AFTER_DURABLE),
    "enable.idempotence": ("true", "a retried produce never duplicates or reorders an output record"),
}
#: Under exactly-once, also: the transaction's identity and the reads it commits.
GUARDED_KAFKA_EXACTLY_ONCE: dict[str, tuple[str | None, str]] = {
    "transactional.id": (None, "exactly-once derives it from EMBEDSTREAM_GROUP_ID and EMBEDSTREAM_GROUP_INSTANCE_ID, "
                               "so that a restarted worker fences its predecessor's transaction"),
    "isolation.level": ("read_committed", "exactly-once reads only committed input"),
}

#: ``EMBEDSTREAM_*`` variables of the development tools and the tests, not of the worker (prefixes).
NOT_SETTINGS = ("EMBEDSTREAM_TEST_", "EMBEDSTREAM_SOAK_", "EMBEDSTREAM_KAFKA_CACHE", "EMBEDSTREAM_FAULT_TABLE")


def unknown_variables(fields: Iterable[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """One line per ``EMBEDSTREAM_*`` variable of ``environ`` that names no setting of ``fields``,
    with the nearest known name (a misspelt variable is otherwise ignored, its default used)."""
    environ = os.environ if environ is None else environ
    known = {f"EMBEDSTREAM_{name.upper()}" for name in fields}
    lines = []
    for key in sorted(environ):
        if not key.startswith("EMBEDSTREAM_") or key in known or key.startswith(NOT_SETTINGS):
            continue
        if any(key.startswith(prefix) and len(key) > len(prefix) for prefix in (KAFKA_PREFIX, REGISTRY_PREFIX)):
            continue
        for single, double in (("EMBEDSTREAM_SCHEMA_REGISTRY_", REGISTRY_PREFIX), ("EMBEDSTREAM_KAFKA_", KAFKA_PREFIX)):
            if key.startswith(single) and not key.startswith(double):
                near = difflib.get_close_matches(key, known, n=1, cutoff=0.85)
                hint = (f"did you mean {near[0]}? " if near else "") + (
                    f"client properties pass through with two underscores: {double}{key[len(single):]}")
                break
        else:
            near = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f"did you mean {near[0]}?" if near else "no setting has a name near it"
        lines.append(f"unknown variable {key}: {hint}")
    return lines


def passthrough(prefix: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Client properties given as ``<prefix>SASL_MECHANISM=...`` → ``{"sasl.mechanism": ...}``."""
    environ = os.environ if environ is None else environ
    return {
        key[len(prefix) :].lower().replace("_", "."): value
        for key, value in environ.items()
        if key.startswith(prefix) and len(key) > len(prefix)
    }


def kafka_passthrough(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """librdkafka properties given as ``EMBEDSTREAM_KAFKA__SASL_MECHANISM=...`` → ``{"sasl.mechanism": ...}``."""
    return passthrough(KAFKA_PREFIX, environ)


def setting(default: Any = None, description: str = "", *, flag: bool = False, **constraints: Any) -> Any:
    """One setting's declaration: its default, what it means (the ``--help`` of its flag and
    ``docs/configuration.md`` read it here), ``flag``: whether commands take it as ``--<name>`` too
    (``worker.commands.options.with_settings``), and pydantic's constraints (``ge``, ``repr``, ...)."""
    extra: Any = {"flag": True} if flag else None
    if default is dict:  # a fresh dict for each Settings
        return Field(default_factory=dict, description=description, json_schema_extra=extra, **constraints)
    return Field(default, description=description, json_schema_extra=extra, **constraints)


class KafkaSettings(BaseModel):
    """The brokers, the three topics and the consumer group."""

    kafka_bootstrap_servers: str | None = setting(None, "Kafka brokers, host:port[,...]", flag=True)
    input_topic: str = setting("documents", "Topic of documents", flag=True)
    output_topic: str = setting("embeddings", "Topic of embeddings", flag=True)
    dlq_topic: str = setting("documents.dlq", "Dead-letter topic", flag=True)
    group_id: str = setting("embedstream", "Consumer group of the workers", flag=True)
    group_instance_id: str | None = setting(None, "Static membership id, e.g. the pod name", flag=True)
    group_protocol: Literal["classic", "consumer"] = setting(
        "classic", "classic|consumer: the group's rebalance protocol. consumer is KIP-848 (Kafka 4's own; the "
                   "broker assigns, and the group's session and heartbeat are the broker's: "
                   "group.consumer.session.timeout.ms)",
        flag=True)
    group_type: Literal["consumer", "share"] = setting(
        "consumer", "consumer|share: share joins a KIP-932 share group (Kafka 4.2+): any number of workers read "
                    "each partition, each record is acknowledged once durable, and a record delivered too often is "
                    "dead-lettered (delivery_count_exceeded); at-least-once only, no per-key order", flag=True)
    share_max_deliveries: int = setting(
        4, "share groups: a record delivered more times than this goes to the DLQ (delivery_count_exceeded) "
           "before it is processed again; keep it below the group's share.delivery.count.limit (the broker's "
           "default 5), which archives a record without a trace", ge=1)
    # repr=False: the passthrough may hold secrets (sasl.password); redacted() shows it masked.
    kafka: dict[str, str] = setting(dict, "librdkafka passthrough properties (EMBEDSTREAM_KAFKA__<NAME>)",
                                    repr=False)
    kafka_timeout_seconds: float = setting(30.0, "deadline for delivery confirmation", gt=0)


class DeliverySettings(BaseModel):
    """How a group of batches becomes durable, when offsets are committed, when bad input halts."""

    delivery: Literal["at-least-once", "exactly-once"] = setting(
        "at-least-once", "at-least-once|exactly-once; exactly-once commits each group of batches' output and DLQ "
                         "records with their input offsets in one Kafka transaction (its transactional.id is "
                         "embedstream-<group>-<group instance id, else host-pid>)", flag=True)
    commit_interval_ms: int = setting(1000, "milliseconds between asynchronous commits; 0 = commit synchronously after "
                                      "every batch (the polling loop waits for each commit: on the local Tansu a "
                                      "commit during a rebalance is held 3-5 s)", ge=0)
    dlq_max_consecutive: int = setting(1000, "halt after this many dead-lettered records in a row", ge=1)
    dlq_max_ratio: float = setting(0.9, "halt when more of the last window is dead-lettered", gt=0, le=1)
    dlq_ratio_window: int = setting(1000, "records in the window of the ratio", ge=10)


class RecordSettings(BaseModel):
    """What input records look like and how output records are written."""

    # repr=False: a URL may carry user:password@; redacted() masks it.
    schema_registry_url: str | None = setting(
        None, "Schema registry URL (reads registry-framed Avro; comma-separated URLs are tried in turn)",
        flag=True, repr=False)
    # repr=False: credentials (basic.auth.user.info, bearer.auth.token); redacted() masks them.
    schema_registry: dict[str, str] = setting(
        dict, "SchemaRegistryClient properties, given as EMBEDSTREAM_SCHEMA_REGISTRY__<property with dots as _>",
        repr=False)
    output_format: Literal["avro", "avro-registry", "json"] = setting(
        "avro", "avro|avro-registry|json: output topic values", flag=True)
    key_field: str | None = setting(
        None, "Field of a structured record key (JSON or registry Avro) that holds the document id", flag=True)
    max_text_bytes: int = setting(1_000_000, "hard limit on a record's value; larger records are dead-lettered",
                                  ge=16)
    forward_headers: str = setting(
        "traceparent,tracestate,baggage", "Input headers copied to each output record, comma-separated, matched "
        "without regard to case (default: the W3C trace context; \"\" = none). The dead-letter topic keeps every "
        "header whatever this says", flag=True)

    @property
    def forwarded_headers(self) -> list[str]:
        """``forward_headers`` as a list of names."""
        return [name.strip() for name in self.forward_headers.split(",") if name.strip()]


class ModelSettings(BaseModel):
    """The model (or the set of models) and how it runs."""

    model: str | None = setting(None, "sentence-transformers model path or name (default: the packaged "
                                      "all-MiniLM-L6-v2)", flag=True)
    precision: Literal["auto", "fp32", "fp16", "bf16", "int8"] = setting(
        "auto", "auto|fp32|fp16|bf16|int8; auto = fp16 on CUDA; on CPUs with VNNI int8 by OpenVINO where it is "
                "installed (embedstream[int8]), else bf16 on CPUs with avx512_bf16/AMX, else int8 by onnxruntime "
                "on CPUs with VNNI, else fp32; int8 = the model quantized once (OpenVINO, else onnxruntime) and "
                "cached on disk, on CPUs", flag=True)
    device: Literal["auto", "cpu", "cuda"] = setting("auto", "auto|cpu|cuda", flag=True)
    # None: the model's own prompts (sentence-transformers' encode_document / encode_query); "": none.
    document_prompt: str | None = setting(
        None, "Text put before each document (\"\" = none; default: the model's document prompt)", flag=True)
    query_prompt: str | None = setting(
        None, "Text put before each search query (\"\" = none; default: the model's query prompt)", flag=True)
    truncate_dim: int | None = setting(
        None, "Keep the first N dimensions of each vector (Matryoshka models), renormalised (default: all)",
        flag=True, ge=1)
    sparse: str = setting(
        "off", "off | bm25 | a sentence-transformers SparseEncoder (path or name): sparse vectors beside the "
               "dense ones, for hybrid search; bm25: Milvus derives them from each chunk's text, kept in the row; "
               "a model: computed in the same forward pass (it must share the dense model's tokenizer)",
        flag=True)
    models: str | None = setting(
        None, "A set of models by name: JSON, or the path of a YAML/JSON file; a record's model field picks one "
              "(default: one model, EMBEDSTREAM_MODEL)", flag=True)
    model_memory_mb: int | None = setting(
        None, "MB of model weights held at once; the least recently used model is unloaded (default: no limit)",
        flag=True, ge=1)
    backfill_model: str | None = setting(
        None, "A backfill lane beside the live one: this model re-embeds the input topic from its start into its "
              "own collection, in the group `embedstream migrate` backfills with, taking the model only when no "
              "live batch waits; `embedstream migrate --lane` switches the alias once it has caught up (default: "
              "no backfill lane)", flag=True)
    backfill_share: float = setting(
        0.25, "The backfill lane's bound on batches in flight, as a share of the live lane's "
              "(EMBEDSTREAM_MAX_INFLIGHT_BATCHES); at least one batch", flag=True, gt=0, le=1)
    backfill_output_topic: str | None = setting(
        None, "Where a backfill (the lane's, or `embedstream migrate`'s) publishes the records it re-embeds: a "
              "topic of its own for readers who want the new model's vectors before the switch (default: none; "
              "the backfill writes only its collection, and the output topic carries the live model alone)",
        flag=True)


class ChunkingSettings(BaseModel):
    """How long texts are cut into chunks the model takes whole."""

    chunking: Literal["tokens", "off"] = setting(
        "tokens", "tokens: split long texts into windows the model takes whole; off: truncate (counted)",
        flag=True)
    chunk_tokens: int | None = setting(
        None, "tokens per chunk (default: the model's max length minus its special tokens)", flag=True, ge=8)
    chunk_overlap: int = setting(32, "tokens shared by consecutive chunks", flag=True, ge=0)
    max_chunks: int = setting(512, "a text that would yield more chunks is dead-lettered", flag=True, ge=1)


class BatchingSettings(BaseModel):
    """When a batch closes, and how many may be in flight."""

    max_batch_size: int = setting(256, "Close a batch at this many records", flag=True, ge=1, le=100_000)
    max_batch_tokens: int = setting(32_768, "Close a batch at this many tokens", flag=True, ge=16)
    max_batch_wait_ms: int = setting(100, "Close a batch when its oldest record waited this many milliseconds",
                                     flag=True, ge=0)
    max_batch_bytes: int = setting(16 * 1024 * 1024, "close a batch at this many bytes of text", ge=1024)
    max_inflight_batches: int = setting(
        8, "batches queued or running, for each model served, before partitions pause", flag=True, ge=1)


class CacheSettings(BaseModel):
    """The Redis cache of vectors by content hash."""

    # no flag: a URL with a password on the command line is visible to every user of the host (ps)
    redis_url: SecretStr | None = setting(None, "Redis for the embedding cache; unset = no cache")
    cache_ttl_seconds: int = setting(7 * 24 * 3600, "Cache entry lifetime in seconds", flag=True, ge=1)
    redis_timeout_ms: int = setting(150, "a lookup slower than this is a miss", ge=1)


class MilvusSettings(BaseModel):
    """The Milvus server, the collection family and the alias readers query (``worker.assembly.naming``)."""

    milvus_uri: str | None = setting(None, "Milvus server, e.g. http://host:19530", flag=True)
    milvus_token: SecretStr | None = setting(None, "Milvus token (user:password or an API key)")
    milvus_collection: str = setting(
        "embeddings", "Milvus collection name: each model writes <name>__<model>_<version> behind the alias",
        flag=True)
    milvus_alias: str | None = setting(
        None, "Milvus alias that readers query and `migrate` moves (default: the collection name)", flag=True)
    milvus_timeout_seconds: float = setting(10.0, "deadline of each Milvus call", gt=0)
    milvus_db_name: str | None = setting(None, "Milvus database the collections live in (default: Milvus' "
                                               "`default`)", flag=True)
    milvus_tls_ca_file: str | None = setting(
        None, "PEM file of the CA that signed Milvus' certificate: TLS to Milvus, trusting that CA (a private one)")
    milvus_tls_cert_file: str | None = setting(
        None, "PEM file of this client's certificate, for Milvus servers that ask for one (mutual TLS; with "
              "EMBEDSTREAM_MILVUS_TLS_KEY_FILE and EMBEDSTREAM_MILVUS_TLS_CA_FILE)")
    milvus_tls_key_file: str | None = setting(None, "PEM file of the key of EMBEDSTREAM_MILVUS_TLS_CERT_FILE")

    def milvus_options(self) -> dict[str, object]:
        """The database and TLS options of a Milvus client (pymilvus' names): none when unset."""
        out: dict[str, object] = {}
        if self.milvus_db_name:
            out["db_name"] = self.milvus_db_name
        if self.milvus_tls_cert_file or self.milvus_tls_key_file:
            out.update(secure=True, ca_pem_path=self.milvus_tls_ca_file or "",
                       client_pem_path=self.milvus_tls_cert_file, client_key_path=self.milvus_tls_key_file)
        elif self.milvus_tls_ca_file:
            out.update(secure=True, server_pem_path=self.milvus_tls_ca_file)
        return out

    @model_validator(mode="after")
    def _milvus_tls_whole(self):
        given = [n for n in ("milvus_tls_ca_file", "milvus_tls_cert_file", "milvus_tls_key_file") if getattr(self, n)]
        if ("milvus_tls_cert_file" in given or "milvus_tls_key_file" in given) and len(given) != 3:
            raise ValueError("mutual TLS to Milvus needs EMBEDSTREAM_MILVUS_TLS_CERT_FILE, "
                             "EMBEDSTREAM_MILVUS_TLS_KEY_FILE and EMBEDSTREAM_MILVUS_TLS_CA_FILE together "
                             f"(given: {', '.join(given)})")
        return self


class OperationsSettings(BaseModel):
    """The process: metrics, processes, shutdown, health, retries, logs."""

    metrics_port: int | Literal["auto"] = setting(
        9400, "Port of /metrics, /healthz, /readyz; 0 = off; auto = a free port the system picks (the worker logs "
              "it: \"metrics on port N\")", flag=True)
    metrics_host: str = setting(
        "0.0.0.0", "Address /metrics, /healthz and /readyz (and `lag --serve`'s /backlog) listen on: 0.0.0.0 every "
                   "interface (a pod's), 127.0.0.1 this host only", flag=True, min_length=1)
    processes: int = setting(
        1, "Worker processes of the group to start here, e.g. several on one GPU; process i serves its metrics "
           "on the metrics port + i and, with a static member id, joins as <id>-<i>", flag=True, ge=1, le=64)
    process_index: int = setting(
        0, "Which of run --processes N this process is (the parent sets it for each; 0 alone): the process field "
           "of each JSON log line", ge=0, le=63)
    shutdown_grace_seconds: float = setting(30.0, "time in-flight batches get to finish at a stop", gt=0)
    healthz_max_tick_age_seconds: float = setting(60.0, "/healthz fails when the loop is older", gt=0)
    retry_backoff_max_seconds: float = setting(10.0, "longest wait between retries of a stage", gt=0)
    log_format: Literal["text", "json"] = setting("text", "text|json", flag=True)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = setting("INFO", "DEBUG|INFO|WARNING|ERROR", flag=True)


#: The sections, in the order ``docs/configuration.md`` and ``--help`` show them.
SECTIONS: tuple[type[BaseModel], ...] = (KafkaSettings, DeliverySettings, RecordSettings, ModelSettings,
                                         ChunkingSettings, BatchingSettings, CacheSettings, MilvusSettings,
                                         OperationsSettings)

S = TypeVar("S", bound=BaseModel)


# The sections in reverse: pydantic collects the fields of the last base first, so they come out in
# the order of SECTIONS.
class Settings(BaseSettings, OperationsSettings, MilvusSettings, CacheSettings, BatchingSettings, ChunkingSettings,
               ModelSettings, RecordSettings, DeliverySettings, KafkaSettings):
    """Everything the worker and the CLI commands need, with the contract's names and defaults: the
    sections above, each setting declared once there and read from ``EMBEDSTREAM_<NAME>``. A part of
    the chain is handed only its own section (:meth:`section`)."""

    model_config = SettingsConfigDict(env_prefix="EMBEDSTREAM_", extra="ignore", validate_default=True)

    def section(self, kind: type[S]) -> S:
        """This section's settings alone (already validated: not checked again)."""
        return kind.model_construct(**{name: getattr(self, name) for name in kind.model_fields})

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_in_any_case(cls, v):
        return v.upper() if isinstance(v, str) else v

    @model_validator(mode="after")
    def _guarantees_kept(self) -> Settings:
        guarded = {**GUARDED_KAFKA, **(GUARDED_KAFKA_EXACTLY_ONCE if self.delivery == "exactly-once" else {})}
        for prop, (keeps, why) in guarded.items():
            value = self.kafka.get(prop)
            if value is not None and (keeps is None or str(value).strip().lower() != keeps):
                name = KAFKA_PREFIX + prop.replace(".", "_").upper()
                raise ValueError(f"{name}={value} is refused: {why}. Remove it (the worker sets {prop} itself)")
        return self

    @field_validator("forward_headers")
    @classmethod
    def _not_ours(cls, v: str) -> str:
        ours = [name.strip() for name in v.split(",") if name.strip().lower().startswith("embedstream.")]
        if ours:
            raise ValueError(f"{', '.join(ours)}: the worker writes the embedstream.* headers itself (a forwarded "
                             "one would stand beside its own, and a reader might take the input's): remove it")
        return v

    @field_validator("metrics_port", mode="before")
    @classmethod
    def _a_port(cls, v):
        text = str(v).strip().lower()
        if text == "auto":
            return "auto"
        if not text.isdigit() or not 0 <= int(text) <= 65535:
            raise ValueError(f"{v!r} is not a port: give a port (1-65535), 0 (off) or auto (a free port, logged)")
        return int(text)

    @field_validator("kafka_bootstrap_servers", "redis_url", "milvus_uri", "model", "schema_registry_url",
                     "key_field", "models", "milvus_alias", "backfill_output_topic", mode="before")
    @classmethod
    def _blank_is_unset(cls, v):
        return None if isinstance(v, str) and not v.strip() else v

    @model_validator(mode="after")
    def _topics_differ(self) -> Settings:
        if len({self.input_topic, self.output_topic, self.dlq_topic}) != 3:
            raise ValueError(
                "EMBEDSTREAM_INPUT_TOPIC, EMBEDSTREAM_OUTPUT_TOPIC and EMBEDSTREAM_DLQ_TOPIC must be "
                f"three different topics (got {self.input_topic!r}, {self.output_topic!r}, {self.dlq_topic!r})"
            )
        if self.backfill_output_topic in (self.input_topic, self.dlq_topic):
            raise ValueError(f"EMBEDSTREAM_BACKFILL_OUTPUT_TOPIC={self.backfill_output_topic!r} is the input or the "
                             "dead-letter topic: give the backfill's records a topic of their own")
        return self

    @model_validator(mode="after")
    def _share_without_transactions(self) -> Settings:
        if self.group_type == "share" and self.delivery == "exactly-once":
            raise ValueError("EMBEDSTREAM_GROUP_TYPE=share with EMBEDSTREAM_DELIVERY=exactly-once: share groups have "
                             "no transactions; use at-least-once (Milvus' writes converge on a replay) or a consumer "
                             "group")
        return self

    @model_validator(mode="after")
    def _registry_for_output(self) -> Settings:
        if self.output_format == "avro-registry" and self.schema_registry_url is None:
            raise ValueError("EMBEDSTREAM_OUTPUT_FORMAT=avro-registry registers the output schema in a schema "
                             "registry: set EMBEDSTREAM_SCHEMA_REGISTRY_URL too (or use avro or json)")
        return self

    def require(self, *names: str) -> None:
        """Raise ``ValueError`` naming the environment variable of each setting in ``names`` that is unset."""
        missing = [n for n in names if getattr(self, n) is None]
        if missing:
            envs = ", ".join(f"EMBEDSTREAM_{n.upper()} (or --{n.replace('_', '-')})" for n in missing)
            raise ValueError(f"missing setting: {envs}. `embedstream dev env` prints values for the local stack.")

    def kafka_common(self) -> dict[str, str]:
        """librdkafka properties shared by every client: bootstrap servers plus the passthrough."""
        self.require("kafka_bootstrap_servers")
        return {"bootstrap.servers": str(self.kafka_bootstrap_servers), **self.kafka}

    def environment(self) -> dict[str, str]:
        """The ``EMBEDSTREAM_*`` variables that make another process load these same settings
        (secrets included: hand them to a child process, never to a log)."""
        env: dict[str, str] = {}
        for name, value in self.model_dump().items():
            if value is None or name in ("kafka", "schema_registry"):
                continue
            if hasattr(value, "get_secret_value"):
                value = value.get_secret_value()
            env[f"EMBEDSTREAM_{name.upper()}"] = str(value)
        for prefix, props in ((KAFKA_PREFIX, self.kafka), (REGISTRY_PREFIX, self.schema_registry)):
            for prop, value in props.items():
                env[prefix + prop.replace(".", "_").upper()] = str(value)
        return env

    def redacted(self) -> dict[str, object]:
        """The settings as a dict safe to log: secret settings masked, passthrough properties whose
        names say secret (``schemas.redact.is_secret_key``) masked, URLs without their user info."""
        out = self.model_dump()
        for key, value in out.items():
            if hasattr(value, "get_secret_value"):
                out[key] = MASK
        out["kafka"] = {k: (MASK if is_secret_key(k) else v) for k, v in self.kafka.items()}
        out["schema_registry"] = {k: (MASK if is_secret_key(k) else v) for k, v in self.schema_registry.items()}
        for key in _URL_SETTINGS:
            if isinstance(out.get(key), str):
                out[key] = without_userinfo(out[key])
        return out

    def secrets(self) -> list[str]:
        """Every secret value the settings hold (``schemas.redact.remember`` masks them in every line
        written): secret settings, secret passthrough properties, the user info of URLs."""
        found: list[str] = []
        for key, value in self.model_dump().items():
            if hasattr(value, "get_secret_value"):
                secret = value.get_secret_value()
                found += [*token_parts(secret), *userinfo(secret)]
            elif key in _URL_SETTINGS and isinstance(value, str):
                found += userinfo(value)
        for props in (self.kafka, self.schema_registry):
            found += [str(v) for k, v in props.items() if is_secret_key(k)]
        user_info = self.schema_registry.get("basic.auth.user.info")
        if user_info:
            found.append(str(user_info).partition(":")[2])
        return [s for s in found if s]


class UnknownVariables(ValueError):
    """``EMBEDSTREAM_*`` variables that name no setting: :func:`unknown_variables`' lines."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__("; ".join(lines))
        self.lines = lines


def load_settings(overrides: Mapping[str, object] | None = None) -> Settings:
    """Build :class:`Settings` from the environment, then ``overrides`` (flags) where not None.

    Raises ``pydantic.ValidationError`` with the offending names when a value is invalid, and
    :class:`UnknownVariables` when an ``EMBEDSTREAM_*`` variable names no setting."""
    unknown = unknown_variables(Settings.model_fields)
    if unknown:
        raise UnknownVariables(unknown)
    given: dict[str, Any] = {k: v for k, v in (overrides or {}).items() if v is not None}
    given.setdefault("kafka", kafka_passthrough())
    given.setdefault("schema_registry", passthrough(REGISTRY_PREFIX))
    return Settings(**given)


def cache_home() -> Path:
    """The user's cache directory (``$XDG_CACHE_HOME``, else ``~/.cache``): where files the worker
    derives from its model once (the int8 export) are kept between starts."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
