"""The canary (``worker.embedding.canary``, ``worker.assembly.canaries``): kept by the first worker on
a collection, compared by every later one; a model that no longer makes the collection's vectors
stops the worker with one line."""

from __future__ import annotations

import numpy as np
import pytest

from schemas.errors import ConfigError, TransientError
from tools.fake_embedder import FakeEmbedder
from worker.assembly.canaries import check_canary
from worker.embedding.canary import CANARY_TEXTS, MIN_COSINE, Canary, bound, library_versions


class _Admin:
    """A collection's canary property, as ``MilvusAdmin`` keeps it."""

    CANARY_PROPERTY = "embedstream.canary"
    collection = "docs_fake_model"
    where = "http://milvus:19530"

    def __init__(self, kept: str | None = None, failing: bool = False) -> None:
        self.kept = kept
        self.failing = failing
        self.writes = 0

    def canary(self):
        if self.failing:
            raise TransientError("milvus", "ConnectionError: no answer")
        return self.kept

    def keep_canary(self, record: str) -> None:
        self.kept = record
        self.writes += 1


class _Drifted(FakeEmbedder):
    """The same model id, computing something else: each vector pushed off by a fixed direction."""

    def __init__(self, push: float, precision: str = "fp32") -> None:
        super().__init__(dim=16)
        self.precision = precision
        self.push = push

    def embed(self, texts):
        out = super().embed(texts) + self.push * np.linspace(-1, 1, self.dim, dtype=np.float32)
        return out / np.linalg.norm(out, axis=1, keepdims=True)


def test_the_texts_vary_in_length_and_script():
    assert len(CANARY_TEXTS) >= 8 and len(set(CANARY_TEXTS)) == len(CANARY_TEXTS)
    assert max(map(len, CANARY_TEXTS)) > 1000 and min(map(len, CANARY_TEXTS)) < 20
    scripts = {"Cyrillic": "\u0400", "CJK": "\u4e00", "Arabic": "\u0600", "Kana": "\u3040"}
    for name, start in scripts.items():
        assert any(any(start <= ch < chr(ord(start) + 0x100) or (name == "CJK" and "\u4e00" <= ch <= "\u9fff")
                       for ch in t) for t in CANARY_TEXTS), name


def test_a_record_round_trips_within_float16_and_says_what_made_it():
    made = Canary.of(FakeEmbedder(dim=16))
    back = Canary.loads(made.dumps())
    assert back.comparable(made) and back.precision == "fp32" and back.device == "cpu"
    assert float(back.cosines(made).min()) > 0.9999
    assert back.versions == library_versions() and "numpy" in back.versions
    with pytest.raises(ValueError, match="not a canary record"):
        Canary.loads('{"model_id": "m"}')


def test_the_bound_is_the_looser_of_the_two_precisions():
    assert bound("fp32", "fp32") == MIN_COSINE["fp32"] == 0.999
    assert bound("fp32", "int8") == bound("int8", "fp32") == MIN_COSINE["int8"]
    assert bound("fp16", "fp4-new") == min(MIN_COSINE.values())


def test_the_first_worker_keeps_the_canary_and_the_next_one_compares_with_it(caplog):
    admin = _Admin()
    assert check_canary(admin, FakeEmbedder(dim=16)) is None and admin.writes == 1  # type: ignore[arg-type]
    with caplog.at_level("INFO", logger="worker.assembly.canaries"):
        worst = check_canary(admin, FakeEmbedder(dim=16))  # type: ignore[arg-type]
    assert worst is not None and worst > 0.9999 and admin.writes == 1
    assert "cosine 1.0000 at least against the one kept at fp32 on cpu (bound 0.999)" in caplog.text


def test_a_model_that_computes_something_else_stops_the_worker_with_one_line_saying_what_differs():
    admin = _Admin()
    check_canary(admin, FakeEmbedder(dim=16))  # type: ignore[arg-type]
    stored = Canary.loads(admin.kept)  # type: ignore[arg-type]
    admin.kept = Canary(stored.model_id, stored.precision, stored.device, {**stored.versions, "torch": "2.0.0"},
                        stored.texts, stored.vectors).dumps()
    with pytest.raises(ConfigError) as raised:
        check_canary(admin, _Drifted(push=0.6))  # type: ignore[arg-type]
    line = str(raised.value)
    assert "\n" not in line and line.startswith("model fake-model at fp32 on cpu does not make the vectors")
    assert "canary cosine 0." in line and "under the 0.999 that fp32 against fp32 must reach" in line
    assert "torch 2.0.0 → " in line and "embedstream migrate" in line
    assert admin.writes == 1  # the reference stays


def test_a_precision_s_own_noise_passes_and_is_logged_with_its_cosine(caplog):
    admin = _Admin()
    check_canary(admin, FakeEmbedder(dim=16))  # type: ignore[arg-type]
    slight = _Drifted(push=0.05, precision="int8")  # an int8 worker on a collection a float32 one began
    with caplog.at_level("INFO", logger="worker.assembly.canaries"):
        worst = check_canary(admin, slight)  # type: ignore[arg-type]
    assert worst is not None and MIN_COSINE["int8"] <= worst < 0.999
    assert f"cosine {worst:.4f} at least against the one kept at fp32 on cpu (bound 0.95)" in caplog.text
    with pytest.raises(ConfigError, match="under the 0.999 that fp32 against fp32"):
        check_canary(admin, _Drifted(push=0.05))  # type: ignore[arg-type]  # the same drift at fp32 does not


@pytest.mark.parametrize("kept", ["garbage", '{"vectors": ' + "[" * 5000 + "]" * 5000 + "}", "x" * 2_000_000,
                                  '{"model_id": "m", "shape": [3, 4], "vectors": "AAAA"}'])
def test_an_unreadable_canary_stops_the_start_with_one_line_and_is_never_replaced(kept):
    admin = _Admin(kept=kept)
    with pytest.raises(ConfigError, match="cannot read .*'embedstream.canary'"):
        check_canary(admin, FakeEmbedder(dim=16), sleep=lambda s: None)  # type: ignore[arg-type]
    assert admin.writes == 0


def test_a_canary_replaced_by_a_worker_storing_at_the_same_time_is_compared_with():
    """No compare-and-set in Milvus: a worker reads its canary back after storing it, and where another
    worker's replaced it meanwhile, compares with that one as if it had been there first."""
    theirs = _Admin()
    check_canary(theirs, _Drifted(0.0, precision="int8"), sleep=lambda s: None)  # type: ignore[arg-type]

    class Raced(_Admin):
        def keep_canary(self, record: str) -> None:
            super().keep_canary(record)
            self.kept = theirs.kept  # the other one's write landed after ours

    raced = Raced()
    worst = check_canary(raced, FakeEmbedder(dim=16), sleep=lambda s: None)  # type: ignore[arg-type]
    assert worst is not None and worst > 0.9999 and raced.writes == 1


def test_an_other_texts_canary_is_replaced_and_milvus_down_is_a_start_up_error():
    admin = _Admin()
    check_canary(admin, FakeEmbedder(dim=16), sleep=lambda s: None)  # type: ignore[arg-type]
    other = Canary.loads(admin.kept)  # type: ignore[arg-type]
    admin.kept = Canary(other.model_id, "fp32", "cpu", {}, "0123456789ab", other.vectors).dumps()
    assert check_canary(admin, FakeEmbedder(dim=16), sleep=lambda s: None) is None  # type: ignore[arg-type]
    assert admin.writes == 2
    now = iter(range(0, 100, 3))  # a clock 3 s a call: the race window runs out after a few tries
    slept: list[float] = []
    with pytest.raises(ConfigError, match="did not answer, or refused, while checking the canary"):
        check_canary(_Admin(failing=True), FakeEmbedder(dim=16), clock=lambda: next(now),  # type: ignore[arg-type]
                     sleep=slept.append)
    assert slept == [0.5] * 3  # tries at 3, 6 and 9 s; the one at 12 s is past the 10 s window


def test_a_worker_that_loses_the_race_to_store_the_canary_compares_with_the_winners():
    """Two processes starting together both find no canary; the second one's write fails (milvus-lite
    renames its schema file under the first one's): it reads again and compares."""
    winner = _Admin()
    check_canary(winner, FakeEmbedder(dim=16))  # type: ignore[arg-type]

    class Racing(_Admin):
        def keep_canary(self, record: str) -> None:
            self.kept = winner.kept  # the other process stored its canary meanwhile
            raise TransientError("milvus", "MilvusException: schema.json.tmp -> schema.json")

    loser = Racing()
    worst = check_canary(loser, FakeEmbedder(dim=16), sleep=lambda s: None)  # type: ignore[arg-type]
    assert worst is not None and worst > 0.9999 and loser.kept == winner.kept
