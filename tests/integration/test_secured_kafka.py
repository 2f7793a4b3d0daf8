"""The worker against Apache Kafka with its doors shut (``tools.secure_kafka``): SASL_SSL with a private
CA, its authorizer on. A wrong password and an untrusted certificate are each said as such, with the
setting to look at, in the last line of `embedstream run` (it read "no Kafka broker answered" before)."""

from __future__ import annotations

import pytest

from tests.helpers import fresh_settings, run_cli, settings_env
from tools.secure_kafka import SecureKafka

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    with SecureKafka(tmp_path_factory.mktemp("secure-kafka"), users={"alice": "alice-pw-1"}) as kafka:
        yield kafka


def _env(stack, client: dict[str, str]) -> dict[str, str]:
    s = fresh_settings(stack, partitions=1).model_copy(update={"kafka_bootstrap_servers": client["bootstrap.servers"]})
    env = settings_env(s)
    for key, value in client.items():
        if key != "bootstrap.servers":
            env["EMBEDSTREAM_KAFKA__" + key.replace(".", "_").upper()] = value
    return env


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
