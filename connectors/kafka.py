"""Kafka client factories, topic creation, and confirmed delivery.

Every factory takes ``common``: the librdkafka properties shared by every client (bootstrap
servers, security, the user's passthrough), built by the settings layer in one place, so security
settings reach all clients. This module knows nothing of the settings object.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from schemas.errors import AccessRefused, ConfigError, RecordRefused, Refused, TransientError

log = logging.getLogger(__name__)

#: librdkafka properties as the factories take them.
Conf = Mapping[str, object]

#: Where librdkafka's own lines go (each client is given it as ``logger``): through Python's logging,
#: so they come out as the worker's other lines do (one JSON object each with EMBEDSTREAM_LOG_FORMAT
#: =json) instead of raw on stderr. A client hands its lines over when it is polled.
LIBRDKAFKA_LOG = logging.getLogger("librdkafka")


def logged(conf: Conf) -> dict[str, object]:
    """``conf`` with librdkafka's lines routed to :data:`LIBRDKAFKA_LOG`."""
    return {**conf, "logger": LIBRDKAFKA_LOG}


#: Client properties of the classic group protocol that librdkafka refuses under KIP-848
#: (``group.protocol=consumer``): there the broker assigns, and keeps the session and heartbeat.
CLASSIC_ONLY = ("partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms", "group.protocol.type")


def make_consumer(common: Conf, group_id: str, group_instance_id: str | None = None,
                  group_protocol: str = "classic", **overrides: object) -> Consumer:
    """A group consumer that commits only what the worker stores (at-least-once): :func:`consumer_conf`."""
    return Consumer(logged(consumer_conf(common, group_id, group_instance_id, group_protocol, **overrides)))


def consumer_conf(common: Conf, group_id: str, group_instance_id: str | None = None,
                  group_protocol: str = "classic", **overrides: object) -> dict[str, object]:
    """The worker's consumer properties: its own, then ``common``, then ``overrides``.
    ``group_protocol="consumer"`` joins with KIP-848's protocol: :data:`CLASSIC_ONLY` properties are
    left out (librdkafka refuses them there; one warning names those the caller gave)."""
    conf: dict[str, object] = {
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
        "partition.assignment.strategy": "cooperative-sticky",
        # Bound what librdkafka buffers ahead of the worker (bounded memory).
        "queued.max.messages.kbytes": 65536,
        "fetch.max.bytes": 52_428_800,
        # A fetch at the end of the log waits this long for new records, and holds the broker's one
        # fetch slot meanwhile: after a resume (back-pressure) the refetch waited behind it (~0.25 s
        # idle per resume at the default 500 ms, measured).
        "fetch.wait.max.ms": 100,
        # How soon partitions added to the input topic (or a topic re-created with more) are seen and
        # assigned: librdkafka's default is 5 minutes. One metadata request each 30 s costs nothing.
        "topic.metadata.refresh.interval.ms": 30_000,
    }
    if group_instance_id:
        conf["group.instance.id"] = group_instance_id
    conf.update(common)
    conf.update(overrides)
    if group_protocol == "consumer":
        conf["group.protocol"] = "consumer"
        given = sorted(k for k in CLASSIC_ONLY if k in common or k in overrides)
        if given:
            log.warning("group.protocol=consumer: %s left out (under KIP-848 the broker assigns partitions and keeps "
                        "the group's session and heartbeat: group.consumer.session.timeout.ms and "
                        "group.consumer.heartbeat.interval.ms)", ", ".join(given))
        for key in CLASSIC_ONLY:
            conf.pop(key, None)
    return conf


#: Properties librdkafka refuses on a share consumer (the broker keeps a share group's session, and a
#: share group has no offsets to reset or commit, no isolation level and no prefetch queue of its own).
SHARE_REFUSED = ("enable.auto.commit", "auto.offset.reset", "isolation.level", "queued.", "session.timeout.ms",
                 "heartbeat.interval.ms", "group.protocol", "partition.assignment.strategy", "group.instance.id",
                 "enable.partition.eof", "auto.commit.")


def make_share_consumer(common: Conf, group_id: str, **overrides: object):
    """A member of the share group ``group_id`` (KIP-932) that acknowledges each record itself
    (``share.acknowledgement.mode=explicit``). Properties of ``common`` a share consumer refuses
    (:data:`SHARE_REFUSED`) are left out, with one warning naming them."""
    from confluent_kafka import ShareConsumer

    given = sorted(k for k in common if k.startswith(SHARE_REFUSED))
    if given:
        log.warning("share group: %s left out (a share consumer refuses them: the broker keeps the group's session "
                    "and its records' delivery state)", ", ".join(given))
    conf: dict[str, object] = {"group.id": group_id, "share.acknowledgement.mode": "explicit",
                               "fetch.wait.max.ms": 100}
    conf.update({k: v for k, v in common.items() if not k.startswith(SHARE_REFUSED)})
    conf.update(overrides)
    return ShareConsumer(logged(conf))


def prepare_share_group(common: Conf, group_id: str) -> float | None:
    """Read the share group ``group_id``'s configuration once, set its ``share.auto.offset.reset`` to
    ``earliest`` unless it is set already (a new share group starts at the end of the topic by
    default, and would skip every document produced before its first member joined; a consumer group
    of this worker starts at the beginning), and return how long the broker locks a record to the
    member it hands it to (``share.record.lock.duration.ms``, else the broker's default) in seconds;
    None when the broker does not say. Raises ``KafkaException`` where the broker refuses (an ACL)."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    admin = make_admin(common)
    resource = ConfigResource(ConfigResource.Type.GROUP, group_id)
    found = admin.describe_configs([resource])[resource].result(timeout=30)
    lock = found.get("share.record.lock.duration.ms")
    lock_s = int(lock.value) / 1000 if lock is not None and lock.value is not None else None
    reset = found.get("share.auto.offset.reset")
    if reset is not None and not reset.is_default:
        return lock_s
    change = ConfigResource(ConfigResource.Type.GROUP, group_id, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([change])[change].result(timeout=30)
    log.info("share group %s starts at the beginning of its topic (share.auto.offset.reset=earliest)", group_id)
    return lock_s


#: Consumer-only librdkafka properties, kept out of producers (librdkafka warns about each one).
CONSUMER_ONLY = ("session.timeout.ms", "heartbeat.interval.ms", "max.poll.interval.ms", "group.",
                 "partition.assignment.strategy", "auto.offset.reset", "isolation.level", "enable.auto.",
                 "auto.commit.", "fetch.", "queued.", "enable.partition.eof", "check.crcs")


def _for_producer(conf: Conf) -> dict[str, object]:
    return {k: v for k, v in conf.items() if not k.startswith(CONSUMER_ONLY)}


#: How the worker's output records are compressed unless the user's librdkafka properties say
#: otherwise: not at all. A record is mostly its float32 vector, which lz4 leaves as it is (real
#: all-MiniLM-L6-v2 vectors: 1.004 of their size) for CPU on both sides: librdkafka's threads took
#: 5.35 µs a document with lz4 and 4.7 without (S2, instant model, four alternating runs each), and
#: every consumer of the output topic pays to decompress.
OUTPUT_COMPRESSION = "none"

#: How long the output producers let records wait for more before sending, unless the user's
#: properties say otherwise. The sink hands a group's records to the producer, then flushes
#: (``DeliveryBatch.confirm``; a transaction's commit flushes too), and a flush sends at once
#: whatever the linger (librdkafka 1.8+): so a group's records leave by the flush at the latest,
#: in one request a partition instead of one every 5 ms of encoding. librdkafka's threads took
#: ~0.8 µs a document less (S2, instant model: 3.6/3.1/3.1/2.8 against 4.4/3.8/3.8/4.5).
OUTPUT_LINGER_MS = 100


#: The sink's producers' properties unless the user's say otherwise.
OUTPUT_DEFAULTS: Mapping[str, object] = {"compression.type": OUTPUT_COMPRESSION, "linger.ms": OUTPUT_LINGER_MS}


def producer_conf(common: Conf, delivery_timeout_s: float = 30.0, *, defaults: Mapping[str, object] | None = None,
                  **overrides: object) -> dict[str, object]:
    """The properties of :func:`make_producer`'s producer: its own (lz4, a 5 ms linger), then
    ``defaults`` (a caller's own, like :data:`OUTPUT_DEFAULTS`), then ``common`` (the user's
    properties), then ``overrides``, each winning over those before."""
    conf: dict[str, object] = {
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "compression.type": "lz4",
        "message.timeout.ms": int(delivery_timeout_s * 1000),
        # A delivery report only for a record that failed: a report builds a Python message (key and
        # value copied) and calls back into Python, ~1.5 µs a record; DeliveryBatch needs only the
        # failures, as ``flush`` returns once every record is acknowledged or reported failed.
        "delivery.report.only.error": True,
    }
    conf.update(defaults or {})
    conf.update(_for_producer(common))
    conf.update(overrides)
    return conf


def make_producer(common: Conf, delivery_timeout_s: float = 30.0, *, defaults: Mapping[str, object] | None = None,
                  **overrides: object) -> Producer:
    """An idempotent producer tuned for throughput (:func:`producer_conf`); delivery is confirmed by
    :class:`DeliveryBatch` (a record not acknowledged within ``delivery_timeout_s`` fails)."""
    return Producer(logged(producer_conf(common, delivery_timeout_s, defaults=defaults, **overrides)))


def make_output_producer(common: Conf, delivery_timeout_s: float = 30.0, **overrides: object) -> Producer:
    """The sink's producer (output and dead-letter records, at-least-once or transactional):
    :func:`make_producer` with :data:`OUTPUT_DEFAULTS`."""
    return make_producer(common, delivery_timeout_s, defaults=OUTPUT_DEFAULTS, **overrides)


def make_admin(common: Conf) -> AdminClient:
    return AdminClient(logged(_for_producer(common)))  # type: ignore[arg-type]  # values are librdkafka scalars


class _Heard(logging.LoggerAdapter):
    """librdkafka's log lines, kept (the last few) as they pass on to :data:`LIBRDKAFKA_LOG`: why a
    connection failed is said there, not in the error a call returns ("transport failure")."""

    def __init__(self) -> None:
        super().__init__(LIBRDKAFKA_LOG, {})
        self.lines: list[str] = []

    def log(self, level, msg, *args, **kwargs) -> None:
        text = msg % args if args else str(msg)
        self.lines = [*self.lines[-49:], text]
        LIBRDKAFKA_LOG.log(level, msg, *args, **kwargs)


def why_unreachable(lines: list[str]) -> str | None:
    """What librdkafka's ``lines`` say about a failed connection, as one sentence with the settings to
    look at; None when they name no cause of ours (the broker down, a wrong address)."""
    for line in reversed(lines):
        detail = line.split(": ", 2)[-1].split(" (after ")[0]
        if "SASL authentication error" in line or "Authentication failed" in line:
            return (f"the broker refused the login ({detail}): check EMBEDSTREAM_KAFKA__SASL_USERNAME, "
                    "EMBEDSTREAM_KAFKA__SASL_PASSWORD and EMBEDSTREAM_KAFKA__SASL_MECHANISM")
        if "certificate verify failed" in line:
            return (f"the broker's TLS certificate is not trusted ({detail.split(': broker certificate')[0]}): set "
                    "EMBEDSTREAM_KAFKA__SSL_CA_LOCATION to the file of the CA that signed it")
        if "SSL handshake failed" in line or "ssl.endpoint.identification" in line:
            return (f"the TLS handshake with the broker failed ({detail}): check EMBEDSTREAM_KAFKA__SECURITY_PROTOCOL "
                    "and the EMBEDSTREAM_KAFKA__SSL_* settings")
    return None


def check_broker(common: Conf, timeout: float = 10.0) -> None:
    """Raise :class:`ConfigError` when no broker answers at the bootstrap servers within ``timeout``:
    a refused login or an untrusted certificate said as such, with the setting to look at."""
    heard = _Heard()
    conf: dict[str, Any] = {**_for_producer(common), "logger": heard}
    admin = AdminClient(conf)
    try:
        admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        where = common.get("bootstrap.servers")
        admin.poll(0)  # librdkafka's lines wait in a queue that a poll serves
        cause = why_unreachable(heard.lines)
        if cause is not None:
            raise ConfigError(f"Kafka at {where!r}: {cause}") from None
        raise ConfigError(
            f"no Kafka broker answered at {where!r} within {timeout:.0f}s "
            f"({exc.args[0].str() if exc.args else exc}). Check EMBEDSTREAM_KAFKA_BOOTSTRAP_SERVERS; "
            "for the local stack run `embedstream dev up` and export what it prints."
        ) from None


#: The id a broker gives a topic it names by name only (KIP-516's all-zero UUID).
NO_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"


def topic_ids(common: Conf, topics: Iterable[str], timeout: float = 10.0) -> dict[str, str]:
    """``{topic name: topic id}`` (Kafka's topic UUID, KIP-516) for those of ``topics`` the broker
    names by id. A broker without topic ids leaves a topic out; a look-up that fails is logged (a
    warning naming the topic and the error) and leaves it out too: the caller decides what a
    missing id means."""
    from confluent_kafka import TopicCollection

    names = list(topics)
    out: dict[str, str] = {}
    admin = make_admin(common)  # held until the futures are done: a collected handle fails them (_DESTROY)
    try:
        futures = admin.describe_topics(TopicCollection(names), request_timeout=timeout)
    except Exception as exc:  # a broker without DescribeTopics (an old one, librdkafka's mock cluster)
        log.warning("could not ask the broker for the ids of topics %s: %s", ", ".join(names), exc)
        return out
    for name, fut in futures.items():
        try:
            tid = fut.result(timeout).topic_id
        except Exception as exc:
            log.warning("could not read the id of topic %r: %s", name, exc)
            continue
        if tid is not None and str(tid) not in ("", NO_TOPIC_ID):
            out[name] = str(tid)
    return out


def group_session_ms(common: Conf, group_id: str, timeout: float = 10.0) -> int | None:
    """The session timeout the broker applies to a KIP-848 group (its ``consumer.session.timeout.ms``,
    the group's own or the broker's default), or None when the broker does not tell it."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    admin = make_admin(common)  # held until the futures are done
    try:
        futures = admin.describe_configs([ConfigResource(ResourceType.GROUP, group_id)], request_timeout=timeout)
        entry = next(iter(futures.values())).result(timeout).get("consumer.session.timeout.ms")
    except Exception as exc:  # a broker before KIP-848's group configs
        log.warning("could not read the session timeout of group %r from the broker: %s", group_id, exc)
        return None
    return int(entry.value) if entry is not None and str(entry.value).isdigit() else None


def topic_settings(common: Conf, topics: Iterable[str], names: Iterable[str], timeout: float = 10.0,
                   denied: Callable[[str, KafkaError], None] | None = None) -> dict[str, dict[str, str]]:
    """``{topic: {name: value}}``: the configuration entries ``names`` of those of ``topics`` that the
    broker describes (DescribeConfigs); a broker that does not answer it, or a topic it does not
    describe, is left out (``denied(topic, error)`` is told of a refusal for want of an ACL)."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    wanted, out = set(names), dict[str, dict[str, str]]()
    admin = make_admin(common)  # held until the futures are done: a collected handle fails them
    try:
        futures = admin.describe_configs(
            [ConfigResource(ResourceType.TOPIC, t) for t in topics], request_timeout=timeout)
    except Exception:  # an old broker, or one without the API
        return out
    for resource, fut in futures.items():
        try:
            entries = fut.result(timeout)
        except Exception as exc:
            err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
            if denied is not None and isinstance(err, KafkaError) and err.code() in ACCESS_CODES:
                denied(resource.name, err)
            continue
        out[resource.name] = {n: str(e.value) for n, e in entries.items() if n in wanted and e.value is not None}
    return out


def topic_max_bytes(common: Conf, topics: Iterable[str], timeout: float = 10.0) -> dict[str, int]:
    """``{topic: max.message.bytes}`` for those of ``topics`` whose configuration the broker tells
    (DescribeConfigs); a broker that does not answer it leaves a topic out."""
    def denied(topic: str, err: KafkaError) -> None:
        log.warning("could not read max.message.bytes of topic %r (%s): the producer's own limit stands "
                    "alone; grant DescribeConfigs on it (docs/operations.md) so that records are fitted to "
                    "the topic's", topic, err.name())

    told = topic_settings(common, topics, ["max.message.bytes"], timeout, denied)
    return {t: int(v) for t, c in told.items() if (v := c.get("max.message.bytes", "")).isdigit() and int(v) > 0}


def create_topics(admin: AdminClient, topics: Iterable[str], partitions: int, timeout: float = 15.0,
                  config: dict[str, dict[str, str]] | None = None) -> None:
    """Create ``topics`` with ``partitions`` partitions (and ``config[topic]``, e.g. a cleanup policy);
    topics that already exist are left alone.

    A broker without the CreateTopics API (librdkafka's mock cluster, ``dev up --broker mock``) gets
    them by auto-creation instead, with its own default partition count."""
    futures = admin.create_topics(
        [NewTopic(t, num_partitions=partitions, replication_factor=1, config=(config or {}).get(t, {}))
         for t in topics],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    for topic, fut in futures.items():
        try:
            fut.result(timeout=timeout)
        except KafkaException as exc:
            if exc.args and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                continue
            if exc.args and exc.args[0].code() == KafkaError._UNSUPPORTED_FEATURE:
                # A metadata request for the topic auto-creates it (an admin handle allows that).
                found = admin.list_topics(topic, timeout=timeout).topics.get(topic)
                if found is not None and found.error is None:
                    continue
            raise RuntimeError(f"could not create topic {topic!r}: {exc}") from None


#: Delivery errors after which an idempotent producer stays unusable: its producer id or epoch was
#: rejected. Seen on the local broker (Tansu) after records timed out during an outage: librdkafka
#: bumps the epoch and every later record failed with PRODUCER_FENCED. A new producer gets a new id.
PRODUCER_BROKEN = frozenset({
    KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH, KafkaError.UNKNOWN_PRODUCER_ID,
    KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, KafkaError._FENCED, KafkaError._FATAL,
})


#: Errors for a record that retrying cannot change: the client or the broker refuses the record
#: itself (its size, its form, the topic's policy).
RECORD_REFUSED = frozenset({
    KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_RECORD,
    KafkaError.POLICY_VIOLATION,
})


def refused(topic: str, what: str, err: KafkaError) -> RecordRefused:
    """The error that stops the worker for a record ``topic`` refused, with what to do about it."""
    if err.code() in TOO_LARGE:
        todo = ("raise the topic's max.message.bytes, or set EMBEDSTREAM_KAFKA__MESSAGE_MAX_BYTES to that "
                "limit (records are cut or dead-lettered to fit it)")
    else:
        todo = f"fix the configuration of topic {topic!r}"
    return RecordRefused(f"topic {topic!r} refused {what} for good ({err.str()}): {todo}, then restart; "
                         "the worker resumes at that record")


#: The broker's answers that an ACL is missing, with what the principal must be granted.
ACCESS_CODES = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "a topic ACL",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "Read on the group",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "Write and Describe on the transactional id",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "a cluster ACL",
}


def access_refused(err: KafkaError, doing: str) -> AccessRefused | None:
    """The stop for ``err`` when it says an ACL is missing (None: it does not), naming what was being done
    (``doing``: "reading the input topic", "writing to topic 'x'")."""
    needs = ACCESS_CODES.get(err.code())
    if needs is None:
        return None
    return AccessRefused(f"the broker refused this principal {doing} ({err.name()}: {err.str()}): grant it {needs} "
                         "as docs/operations.md lists for this mode, then restart (nothing was committed past it)")


#: Of :data:`RECORD_REFUSED`, the answers that say a record is over a size limit.
TOO_LARGE = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})


class OutputRefused(Refused):
    """Records that the broker refused for good, each standing for the entry that ``owner`` named in
    :meth:`DeliveryBatch.produce`: ``too_large`` (over a size limit) and ``refused`` (anything else) map
    ``id(owner)`` to the broker's answer."""

    def __init__(self, topic: str, too_large: dict[int, str], refused: dict[int, str]) -> None:
        first = next(iter({**too_large, **refused}.values()))
        super().__init__("kafka", f"topic {topic!r} refused {len(too_large) + len(refused)} record(s) for good "
                                  f"(first: {first})")
        self.too_large = too_large
        self.refused = refused


class DeliveryBatch:
    """Produce a group of records and wait until the broker acknowledged every one.

    ``produce`` never blocks for long (it polls the producer when its queue is full); ``confirm``
    flushes with a deadline and raises :class:`TransientError` if any record was not acknowledged,
    so the caller retries the whole group instead of committing. ``broken`` is True when a failure
    means the producer itself must be replaced before the retry (:data:`PRODUCER_BROKEN`).

    A record refused for good (:data:`RECORD_REFUSED`, by librdkafka's own size check at ``produce``
    or by the broker) cannot succeed on a retry. One produced with an ``owner`` (an output record, which
    stands for an input record that can be dead-lettered instead) is noted, and ``confirm`` raises
    :class:`OutputRefused` for all such once everything else was acknowledged; one without (a dead
    letter: nowhere else to go) raises :class:`RecordRefused`, which stops the worker with what to fix.
    ``what`` names the record in that message.
    """

    def __init__(self, producer: Producer, timeout: float) -> None:
        self._producer = producer
        self._timeout = timeout
        self._errors: list[str] = []
        self._refused: RecordRefused | None = None
        #: Refused records' owners, by ``id()``, with the broker's answer (over a size limit, or not);
        #: and their topic.
        self._owned: dict[int, str] = {}
        self._owned_large: dict[int, str] = {}
        #: An ACL the broker says is missing: nothing of the group can be written (raised by ``confirm``).
        self._access: AccessRefused | None = None
        self._owned_topic = ""
        self.broken = False

    def _on_delivery(self, err, msg, topic: str | None = None, what: str | None = None,
                     owner: object | None = None) -> None:
        # make_producer's producers report failures only; another producer may report successes too
        if err is None:
            return
        if err.code() in ACCESS_CODES and self._access is None:
            self._access = access_refused(err, f"writing to topic {topic or (msg.topic() if msg else '?')!r}")
            return
        if err.code() in RECORD_REFUSED:
            if owner is not None:
                self._note_refused(topic or (msg.topic() if msg is not None else "?"), owner, err)
            elif self._refused is None:
                self._refused = refused(topic or (msg.topic() if msg is not None else "?"), what or "a record", err)
            return
        self._errors.append(str(err))
        if err.fatal() or err.code() in PRODUCER_BROKEN:
            self.broken = True

    def _note_refused(self, topic: str, owner: object, err: KafkaError) -> None:
        (self._owned_large if err.code() in TOO_LARGE else self._owned)[id(owner)] = f"{err.name()}: {err.str()}"
        self._owned_topic = topic

    def produce(self, topic: str, key: bytes | str | None, value: bytes | None, headers=None,
                what: str | None = None, owner: object | None = None) -> None:
        """Hand one record to the producer; ``what`` names it should it be refused for good; ``owner``
        (an output record's entry): a refusal of it is noted for ``confirm``, not raised."""
        deadline = None
        report: Callable[[Any, Any], None] = self._on_delivery
        if what is not None or owner is not None:
            def report(err, msg) -> None:
                self._on_delivery(err, msg, topic, what, owner)
        while True:
            try:
                self._producer.produce(topic, value=value, key=key, headers=headers, on_delivery=report)
                return
            except KafkaException as exc:
                denied = access_refused(exc.args[0], f"writing to topic {topic!r}") if exc.args else None
                if denied is not None:
                    raise denied from None
                if exc.args and exc.args[0].code() in RECORD_REFUSED:
                    if owner is not None:
                        self._note_refused(topic, owner, exc.args[0])
                        return
                    raise refused(topic, what or f"a record of {len(value or b''):,} bytes", exc.args[0]) from None
                raise
            except BufferError:
                deadline = deadline or time.monotonic() + self._timeout
                if time.monotonic() > deadline:
                    raise TransientError("kafka", "producer queue stayed full (broker not accepting)") from None
                self._producer.poll(0.05)

    def settle(self) -> None:
        """Send what was handed over so far and wait for its answers (within the timeout), so that the
        next record goes out in a request of its own: a broker refuses a request's records together,
        and one alone is refused only for itself. ``confirm`` still judges every record."""
        self._producer.flush(self._timeout)

    def confirm(self) -> None:
        # flush returns how many records are still queued, in flight, or with a report not yet
        # served: 0 means each was acknowledged or its failure reported to _on_delivery.
        remaining = self._producer.flush(self._timeout)
        if self._access is not None:
            raise self._access
        if self._refused is not None:
            raise self._refused
        if remaining:
            raise TransientError("kafka", f"{remaining} records not acknowledged in time")
        if self._errors:
            raise TransientError("kafka", f"{len(self._errors)} deliveries failed, first: {self._errors[0]}")
        if self._owned or self._owned_large:
            raise OutputRefused(self._owned_topic, dict(self._owned_large), dict(self._owned))
