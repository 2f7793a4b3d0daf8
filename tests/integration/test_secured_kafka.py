"""The worker against Apache Kafka with its doors shut (``tools.secure_kafka``): SASL_SSL with a private
CA, its authorizer on. A wrong password and an untrusted certificate are each said as such, with the
setting to look at, in the last line of `embedstream run` (it read "no Kafka broker answered" before)."""

from __future__ import annotations

import pytest

from tests.helpers import fresh_settings, run_cli, settings_env
from tools.secure_kafka import SecureKafka

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def secured(acl_kafka):
    """The module's one secured broker (a second one cost a broker start): alice is one of its users."""
    return acl_kafka


def _client_env(client: dict[str, str]) -> dict[str, str]:
    """A client's librdkafka properties as the worker's variables."""
    return {"EMBEDSTREAM_KAFKA_BOOTSTRAP_SERVERS": client["bootstrap.servers"],
            **{"EMBEDSTREAM_KAFKA__" + k.replace(".", "_").upper(): v for k, v in client.items()
               if k != "bootstrap.servers"}}


def _env(stack, client: dict[str, str]) -> dict[str, str]:
    s = fresh_settings(stack, partitions=1).model_copy(update={"kafka": {}})
    return {**settings_env(s), **_client_env(client)}


@pytest.mark.parametrize("case", ["wrong password", "untrusted certificate"])
def test_a_refused_login_or_an_untrusted_certificate_is_said_as_such(secured, stack, case):
    client = secured.client("alice", "not-her-password") if case == "wrong password" else secured.client("alice",
                                                                                                          ca=False)
    res = run_cli(["run", "--stop-when-idle", "1"], _env(stack, client), timeout=300)
    assert res.returncode == 2, res.stderr[-3000:]
    last = [line for line in res.stderr.splitlines() if line.strip()][-1]
    if case == "wrong password":
        assert "refused the login" in last and "EMBEDSTREAM_KAFKA__SASL_PASSWORD" in last, last
    else:
        assert "certificate is not trusted" in last and "EMBEDSTREAM_KAFKA__SSL_CA_LOCATION" in last, last
    assert "not-her-password" not in res.stderr and "no Kafka broker answered" not in last


# -- the ACLs each mode needs (tools/acls.py, the table of docs/operations.md) ----------------------------
USERS = {"alice": "alice-pw-1", "alo": "alo-pw-1", "eos": "eos-pw-2", "share": "share-pw-3", "lagger": "lag-pw-4",
         "migrator": "mig-pw-5", "short": "short-pw-6"}
MODE_ENV = {"at-least-once": {}, "exactly-once": {"EMBEDSTREAM_DELIVERY": "exactly-once"},
            "share group": {"EMBEDSTREAM_GROUP_TYPE": "share"}}


@pytest.fixture(scope="module")
def acl_kafka(tmp_path_factory):
    with SecureKafka(tmp_path_factory.mktemp("acl-kafka"), users=USERS) as kafka:
        yield kafka


def _grant(kafka, user: str, acls, names: dict[str, str]) -> None:
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    bindings = [AclBinding(getattr(ResourceType, a.resource), a.named(**names).name,
                           ResourcePatternType.PREFIXED if a.prefixed else ResourcePatternType.LITERAL,
                           f"User:{user}", "*", getattr(AclOperation, a.operation), AclPermissionType.ALLOW)
                for a in acls]
    admin = AdminClient(kafka.admin_conf)  # held until the futures are done: a collected handle fails them
    for fut in admin.create_acls(bindings).values():
        fut.result(30)


def _topics_with_documents(kafka, stack, n: int = 12):
    """Fresh settings on the secured broker: its three topics made by the super user, ``n`` documents and
    one bad record in the input."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from schemas.codec import Document, encode_document

    s = fresh_settings(stack, partitions=2).model_copy(update={"kafka_bootstrap_servers": kafka.bootstrap,
                                                               "kafka": {}})
    admin = AdminClient(kafka.admin_conf)
    for fut in admin.create_topics([NewTopic(t, 2, 1) for t in (s.input_topic, s.output_topic, s.dlq_topic)]).values():
        fut.result(30)
    producer = Producer(kafka.admin_conf)
    for i in range(n):
        producer.produce(s.input_topic, key=f"d{i}", value=encode_document(Document(f"d{i}", f"document {i}")))
    producer.produce(s.input_topic, key="bad", value=b"{not json")
    assert producer.flush(30) == 0
    return s


def _read_as_admin(kafka, topic: str) -> list:
    import uuid

    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({**kafka.admin_conf, "group.id": f"reader-{uuid.uuid4().hex[:6]}", "isolation.level": "read_committed",
                  "enable.partition.eof": True})
    c.assign([TopicPartition(topic, p, 0) for p in range(2)])
    out, ends = [], 0
    while ends < 2:
        for m in c.consume(100, 5) or [None]:
            if m is None:
                ends = 2  # nothing for 5 s
            elif m.error():
                ends += 1
            else:
                out.append(m)
    c.close()
    return out


def _names(s) -> dict[str, str]:
    return {"input": s.input_topic, "output": s.output_topic, "dlq": s.dlq_topic, "group": s.group_id}


@pytest.mark.parametrize("mode,user", [("at-least-once", "alo"), ("exactly-once", "eos"), ("share group", "share")])
def test_a_principal_with_exactly_the_listed_acls_runs_each_mode(acl_kafka, stack, mode, user):
    """Exactly the ACLs docs/operations.md lists for the mode, and no more: the documents embedded, the bad
    record dead-lettered; then `embedstream lag` by a principal holding only the lag ACLs."""
    from tools.acls import ACLS

    s = _topics_with_documents(acl_kafka, stack)
    _grant(acl_kafka, user, ACLS[mode], _names(s))
    env = {**settings_env(s), **MODE_ENV[mode], **_client_env(acl_kafka.client(user))}
    # a new broker's share coordinator loads its state before the first records of a share group come
    idle = "10" if mode == "share group" else "3"
    res = run_cli(["run", "--stop-when-idle", idle], env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "refused" not in res.stderr and "could not read" not in res.stderr, res.stderr[-3000:]
    assert {m.key().decode() for m in _read_as_admin(acl_kafka, s.output_topic)} == {f"d{i}" for i in range(12)}, \
        res.stderr[-3000:]
    assert [m.key() for m in _read_as_admin(acl_kafka, s.dlq_topic)] == [b"bad"]
    _grant(acl_kafka, "lagger", ACLS["lag"], _names(s))
    lag_env = {**env, **_client_env(acl_kafka.client("lagger"))}
    lag = run_cli(["lag", "--json"], lag_env, timeout=120)
    assert lag.returncode == 0, lag.stdout + lag.stderr[-2000:]
    import json

    shown = json.loads(lag.stdout)
    totals = {k: v for k, v in shown.items() if k in ("total_lag", "backlog")}
    assert totals and set(totals.values()) == {0}, shown  # nothing left: the lag, or a share group's backlog


@pytest.mark.parametrize("missing", ["READ on the input topic", "READ on the group", "WRITE on the output topic",
                                     "WRITE on the transactional id"])
def test_a_principal_missing_one_acl_gets_a_line_naming_what_was_refused(acl_kafka, stack, missing):
    from tools.acls import ACLS

    s = _topics_with_documents(acl_kafka, stack, n=3)
    acls = list(ACLS["exactly-once"])
    gone = {"READ on the input topic": ("TOPIC", "{input}", "READ"), "READ on the group": ("GROUP", "{group}", "READ"),
            "WRITE on the output topic": ("TOPIC", "{output}", "WRITE"),
            "WRITE on the transactional id": ("TRANSACTIONAL_ID", "embedstream-{group}-", "WRITE")}[missing]
    acls = [a for a in acls if (a.resource, a.name, a.operation) != gone]
    assert len(acls) == len(ACLS["exactly-once"]) - 1
    user = "short"
    from confluent_kafka.admin import AclBindingFilter, AclOperation, AclPermissionType, AdminClient
    from confluent_kafka.admin import ResourcePatternType as P
    from confluent_kafka.admin import ResourceType as R

    admin = AdminClient(acl_kafka.admin_conf)
    for fut in admin.delete_acls([AclBindingFilter(R.ANY, None, P.ANY, f"User:{user}", None, AclOperation.ANY,
                                                   AclPermissionType.ANY)]).values():
        fut.result(30)
    _grant(acl_kafka, user, acls, _names(s))
    env = {**settings_env(s), **MODE_ENV["exactly-once"], **_client_env(acl_kafka.client(user))}
    res = run_cli(["run", "--stop-when-idle", "0.5"], env, timeout=300)
    assert res.returncode == 2, res.stderr[-3000:]
    last = [line for line in res.stderr.splitlines() if line.strip()][-1]
    assert "refused this principal" in last and "AUTHORIZATION_FAILED" in last and "docs/operations.md" in last, last
    expect = {"READ on the input topic": "TOPIC_AUTHORIZATION_FAILED", "READ on the group": "GROUP_AUTHORIZATION",
              # from the produce or from the transaction, whichever the broker answers first
              "WRITE on the output topic": s.output_topic,
              "WRITE on the transactional id": "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"}[missing]
    assert expect in last, last
    assert not _read_as_admin(acl_kafka, s.output_topic), "something was written past the refusal"


def test_a_principal_with_exactly_the_migrate_acls_migrates(acl_kafka, stack, tmp_path):
    """`embedstream migrate` as a principal holding only the migrate ACLs (its backfill group by prefix), after
    a live worker wrote the collection: the backfill re-reads the topic and the alias moves."""
    from tools.acls import ACLS
    from tools.derived_models import projected_model

    s = _topics_with_documents(acl_kafka, stack)
    _grant(acl_kafka, "alo", ACLS["at-least-once"], _names(s))
    live = run_cli(["run", "--stop-when-idle", "0.5"], {**settings_env(s), **_client_env(acl_kafka.client("alo"))},
                   timeout=300)
    assert live.returncode == 0, live.stderr[-3000:]
    _grant(acl_kafka, "migrator", ACLS["migrate"], _names(s))
    new_model = projected_model(tmp_path / "projected", dim=128)
    env = {**settings_env(s), **_client_env(acl_kafka.client("migrator")), "COLUMNS": "200"}
    res = run_cli(["migrate", "--model", str(new_model)], env, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "switched" in res.stdout and "could not read" not in res.stdout + res.stderr, res.stdout[-2000:]


def test_a_dlq_topic_that_refuses_writes_mid_run_commits_nothing_past_it(acl_kafka, stack, tmp_path):
    """A worker running at-least-once with every ACL; its Write on the DLQ topic is taken away mid-run and a
    bad record arrives among good ones. It stops with one line naming the DLQ topic (exit 2), committing
    nothing at or past that record (it reached neither topic); given the ACL back, a restart dead-letters
    it and embeds the rest: nothing lost."""
    import subprocess
    import time

    from confluent_kafka import ConsumerGroupTopicPartitions, Producer, TopicPartition
    from confluent_kafka.admin import AclBindingFilter, AclOperation, AclPermissionType, AdminClient
    from confluent_kafka.admin import ResourcePatternType as P
    from confluent_kafka.admin import ResourceType as R

    from schemas.codec import Document, encode_document
    from tests.helpers import CLI, REPO
    from tools.acls import ACLS

    s = _topics_with_documents(acl_kafka, stack)  # 12 good documents and one bad record: d0..d11, "bad"
    user = "alo"
    _grant(acl_kafka, user, ACLS["at-least-once"], _names(s))
    env = {**settings_env(s), **_client_env(acl_kafka.client(user))}
    log = tmp_path / "worker.log"
    worker = subprocess.Popen([*CLI, "run"], env=env, cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT)
    admin = AdminClient(acl_kafka.admin_conf)
    try:
        deadline = time.monotonic() + 180
        while len(_read_as_admin(acl_kafka, s.dlq_topic)) < 1:  # running: the first bad record dead-lettered
            assert worker.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(1)
        for fut in admin.delete_acls([AclBindingFilter(R.TOPIC, s.dlq_topic, P.LITERAL, f"User:{user}", None,
                                                       AclOperation.WRITE, AclPermissionType.ANY)]).values():
            assert fut.result(30), "no ACL removed"
        producer = Producer(acl_kafka.admin_conf)
        late = [f"late{i}" for i in range(6)]
        producer.produce(s.input_topic, key="bad2", value=b"{still not json", partition=0)
        for key in late:
            producer.produce(s.input_topic, key=key, value=encode_document(Document(key, f"after the refusal {key}")),
                             partition=0)
        assert producer.flush(30) == 0
        assert worker.wait(180) == 2, log.read_text()[-3000:]
    finally:
        if worker.poll() is None:
            worker.kill()
    last = [line for line in log.read_text().splitlines() if line.strip()][-1]
    assert s.dlq_topic in last and "AUTHORIZATION_FAILED" in last, last
    # where bad2 sits on partition 0: nothing at or past it is committed
    c_end = [tp for tp in admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(
        s.group_id, [TopicPartition(s.input_topic, 0)])])[s.group_id].result(30).topic_partitions][0].offset
    offsets = {m.key().decode(): m.offset() for m in _read_as_admin(acl_kafka, s.input_topic) if m.partition() == 0}
    assert c_end <= offsets["bad2"], (c_end, offsets["bad2"])

    _grant(acl_kafka, user, ACLS["at-least-once"], _names(s))
    res = run_cli(["run", "--stop-when-idle", "0.5"], env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert sorted(m.key().decode() for m in _read_as_admin(acl_kafka, s.dlq_topic)) == ["bad", "bad2"]
    out = {m.key().decode() for m in _read_as_admin(acl_kafka, s.output_topic)}
    assert out == {f"d{i}" for i in range(12)} | set(late), out

