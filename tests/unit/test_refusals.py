"""Refusals: what Milvus answers for good is told from an outage, and the refused documents are found
by halves (``worker.steps.writing.refusals``)."""

from __future__ import annotations

import grpc
import pytest
from pymilvus.exceptions import MilvusException, ParamError

from connectors.milvus.connection import failure, refused
from schemas.errors import Refused, TransientError
from worker.steps.writing.refusals import isolate


@pytest.mark.parametrize("exc, refusal", [
    (MilvusException(1100, "invalid parameter", is_input_error=True), True),  # Milvus 2.5 marks input errors
    (MilvusException(1100, "invalid parameter[expected=...]"), True),  # ParameterInvalid
    (MilvusException(1102, "parameter too large"), True),
    (MilvusException(65535, "x", 5), True),  # the older error_code IllegalArgument
    (MilvusException(6, "unknown escape sequence \\s", 6), True),  # milvus-lite's illegal argument
    (ParamError(message="invalid data type"), True),  # pymilvus' own check, before the call
    (MilvusException(1, "unexpected error", 1), False),
    (MilvusException(8, "rate limit exceeded", 49), False),  # a limit is an outage: it passes
    (MilvusException(100, "collection not found", 4), False),
    (MilvusException(6, "cross cluster routing", 1), False),  # Milvus' own 6 is not milvus-lite's
    (MilvusException(2, "service unavailable"), False),
    (TimeoutError("deadline exceeded"), False),
    (grpc.RpcError(), False),
    (ConnectionError("refused"), False),
])
def test_a_refusal_is_what_milvus_says_of_the_request_itself(exc, refusal):
    assert refused(exc) is refusal
    assert isinstance(failure(exc), Refused if refusal else TransientError)


def test_isolate_finds_each_refused_key_alone_and_runs_every_other():
    bad = {5, 6, 31}
    ran: list[list[int]] = []
    done: set[int] = set()

    def run(keys: list[int]) -> None:
        ran.append(keys)
        hit = bad & set(keys)
        if hit:
            raise Refused("milvus", f"row {min(hit)} refused")
        done.update(keys)

    assert isolate(list(range(32)), run) == {5: "row 5 refused", 6: "row 6 refused", 31: "row 31 refused"}
    assert done == set(range(32)) - bad
    assert len(ran) <= 2 * len(bad) * 5 + 1
    assert isolate([], run) == {}


def test_isolate_never_splits_an_outage():
    calls = []

    def run(keys):
        calls.append(keys)
        raise TransientError("milvus", "timed out")

    with pytest.raises(TransientError):
        isolate(list(range(10)), run)
    assert calls == [list(range(10))]
