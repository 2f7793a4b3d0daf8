"""The worker's settings: one typed object, validated once at start-up.

Values come from ``EMBEDSTREAM_*`` environment variables, overridden by command-line flags of the
same name (the CLI is the only place that reads the environment). Any librdkafka property passes
through as ``EMBEDSTREAM_KAFKA__<property with dots as _>``; :func:`kafka_passthrough` collects
those, and :meth:`Settings.kafka_common` builds the librdkafka dict in this one place.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

KAFKA_PREFIX = "EMBEDSTREAM_KAFKA__"
#: librdkafka properties whose values are never logged.
SECRET_KAFKA_KEYS = ("sasl.password", "sasl.oauthbearer.client.secret", "ssl.key.password", "ssl.key.pem")
#: SchemaRegistryClient properties whose values are never logged.
SECRET_REGISTRY_KEYS = ("basic.auth.user.info", "bearer.auth.token", "bearer.auth.client.secret", "ssl.key.password")


REGISTRY_PREFIX = "EMBEDSTREAM_SCHEMA_REGISTRY__"


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


class Settings(BaseSettings):
    """Everything the worker and the CLI commands need, with the contract's names and defaults."""

    model_config = SettingsConfigDict(env_prefix="EMBEDSTREAM_", extra="ignore", validate_default=True)

    # Kafka
    kafka_bootstrap_servers: str | None = Field(None, description="host:port[,host:port] of the brokers")
    input_topic: str = "documents"
    output_topic: str = "embeddings"
    dlq_topic: str = "documents.dlq"
    group_id: str = "embedstream"
    group_instance_id: str | None = Field(None, description="static membership id (e.g. the pod name)")
    # repr=False: the passthrough may hold secrets (sasl.password); redacted() shows it masked.
    kafka: dict[str, str] = Field(default_factory=dict, repr=False, description="librdkafka passthrough properties")
    kafka_timeout_seconds: float = Field(30.0, gt=0, description="deadline for delivery confirmation")
    delivery: Literal["at-least-once", "exactly-once"] = Field(
        "at-least-once", description="exactly-once: each group of batches' output and DLQ records commit with "
                                     "their input offsets in one Kafka transaction (read_committed readers see "
                                     "each record's output once); the transactional.id is embedstream-<group>-"
                                     "<group instance id, else host-pid>")

    # Schema registry and record formats
    # repr=False: a URL may carry user:password@; redacted() masks it.
    schema_registry_url: str | None = Field(
        None, repr=False, description="a Confluent-compatible schema registry: reads registry-framed Avro input "
                          "(comma-separated URLs are tried in turn)")
    # repr=False: credentials (basic.auth.user.info, bearer.auth.token); redacted() masks them.
    schema_registry: dict[str, str] = Field(
        default_factory=dict, repr=False,
        description="SchemaRegistryClient properties, given as EMBEDSTREAM_SCHEMA_REGISTRY__<property with dots as _>")
    output_format: Literal["avro", "avro-registry", "json"] = Field(
        "avro", description="output topic values: schemaless Avro, registry-framed Avro, or JSON")
    key_field: str | None = Field(
        None, description="the field of a structured record key (JSON or registry Avro) that holds the document id")

    # Model
    model: str | None = Field(None, description="path or name of a sentence-transformers model")
    precision: Literal["auto", "fp32", "fp16", "bf16", "int8"] = "auto"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # None: the model's own prompts (sentence-transformers' encode_document / encode_query); "": none.
    document_prompt: str | None = Field(None, description="text put before each document (default: the model's)")
    query_prompt: str | None = Field(None, description="text put before each search query (default: the model's)")
    truncate_dim: int | None = Field(None, ge=1, description="keep the first N dimensions (Matryoshka), renormalised")
    models: str | None = Field(
        None, description="a set of models by name, as JSON or the path of a YAML/JSON file "
                          "(worker.embedding.models); a record's model field picks one")
    model_memory_mb: int | None = Field(
        None, ge=1, description="weights of the models held at once; the least recently used is unloaded")

    # Chunking
    chunking: Literal["tokens", "off"] = Field(
        "tokens", description="tokens: split long texts into windows the model takes whole; off: truncate (counted)")
    chunk_tokens: int | None = Field(
        None, ge=8, description="tokens per chunk (default: the model's max length minus its special tokens)")
    chunk_overlap: int = Field(32, ge=0, description="tokens shared by consecutive chunks")
    max_chunks: int = Field(512, ge=1, description="a text that would yield more chunks is dead-lettered")

    # Batching
    max_batch_size: int = Field(256, ge=1, le=100_000)
    max_batch_tokens: int = Field(32_768, ge=16)
    max_batch_wait_ms: int = Field(100, ge=0)
    max_batch_bytes: int = Field(16 * 1024 * 1024, ge=1024, description="close a batch at this many bytes of text")
    max_inflight_batches: int = Field(
        8, ge=1, description="batches queued or running, for each model served, before partitions pause"
    )
    max_text_bytes: int = Field(
        1_000_000, ge=16, description="hard limit on a record's value; larger records are dead-lettered"
    )

    dlq_max_consecutive: int = Field(1000, ge=1, description="halt after this many dead-lettered records in a row")
    dlq_max_ratio: float = Field(0.9, gt=0, le=1, description="halt when more of the last window is dead-lettered")
    dlq_ratio_window: int = Field(1000, ge=10)
    commit_interval_ms: int = Field(1000, ge=0, description="0 = commit synchronously after every batch")

    # Cache
    redis_url: SecretStr | None = None
    cache_ttl_seconds: int = Field(7 * 24 * 3600, ge=1)
    redis_timeout_ms: int = Field(150, ge=1)

    # Milvus
    milvus_uri: str | None = None
    milvus_token: SecretStr | None = None
    milvus_collection: str = Field("embeddings", description="collection name; each model writes its own "
                                   "collection <name>__<model>_<version> behind the alias")
    milvus_alias: str | None = Field(None, description="the alias readers query (default: the collection "
                                     "setting's name); `embedstream migrate` moves it to a new model's collection")
    milvus_timeout_seconds: float = Field(10.0, gt=0)

    # Operations
    metrics_port: int = Field(9400, ge=0, le=65535, description="0 disables the metrics server")
    processes: int = Field(
        1, ge=1, le=64, description="worker processes of one group that `run` starts (several share a GPU); "
                                    "process i serves its metrics on the metrics port + i")
    shutdown_grace_seconds: float = Field(30.0, gt=0)
    healthz_max_tick_age_seconds: float = Field(60.0, gt=0, description="/healthz fails when the loop is older")
    retry_backoff_max_seconds: float = Field(10.0, gt=0)
    log_format: Literal["text", "json"] = "text"
    log_level: str = "INFO"

    @field_validator("kafka_bootstrap_servers", "redis_url", "milvus_uri", "model", "schema_registry_url",
                     "key_field", "models", "milvus_alias", mode="before")
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
        """The settings as a dict safe to log: secrets and secret librdkafka properties masked."""
        out = self.model_dump()
        for key in ("redis_url", "milvus_token"):
            if out.get(key) is not None:
                out[key] = "***"
        out["kafka"] = {k: ("***" if k in SECRET_KAFKA_KEYS else v) for k, v in self.kafka.items()}
        out["schema_registry"] = {k: ("***" if k in SECRET_REGISTRY_KEYS else v)
                                  for k, v in self.schema_registry.items()}
        if self.schema_registry_url:
            from connectors.registry import without_userinfo  # the client library loads only when asked

            out["schema_registry_url"] = without_userinfo(self.schema_registry_url)
        return out


def load_settings(overrides: Mapping[str, object] | None = None) -> Settings:
    """Build :class:`Settings` from the environment, then ``overrides`` (flags) where not None.

    Raises ``pydantic.ValidationError`` with the offending names when a value is invalid."""
    given: dict[str, Any] = {k: v for k, v in (overrides or {}).items() if v is not None}
    given.setdefault("kafka", kafka_passthrough())
    given.setdefault("schema_registry", passthrough(REGISTRY_PREFIX))
    return Settings(**given)


def cache_home() -> Path:
    """The user's cache directory (``$XDG_CACHE_HOME``, else ``~/.cache``): where files the worker
    derives from its model once (the int8 export) are kept between starts."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
