"""The sparse mode, chosen once from the setting, carries what each part needs of it."""

from __future__ import annotations

import pytest

from schemas.errors import ConfigError
from schemas.sparse import BM25, MAX_ACTIVE_DIMS, OFF, SparseKind, SparseMode


def test_a_setting_names_one_mode_and_the_mode_names_its_setting_again(tmp_path):
    assert SparseMode.of(None) is OFF and SparseMode.of(" off ") is OFF and SparseMode.of("Bm25") is BM25
    learned = SparseMode.of("naver/splade-v3")
    assert learned.kind is SparseKind.LEARNED and learned.model == "naver/splade-v3" and learned.learned
    assert SparseMode.of(learned) is learned
    model = tmp_path / "splade"
    model.mkdir()
    (model / "modules.json").write_text("[]")
    assert SparseMode.of(str(model) + "/").model == str(model.resolve())  # a path, resolved
    for mode in (OFF, BM25, learned):
        assert SparseMode.of(mode.setting) == mode and str(mode) == mode.setting
    with pytest.raises(ConfigError, match="EMBEDSTREAM_SPARSE='/no/such/model'.*Use off, bm25"):
        SparseMode.of("/no/such/model")


def test_each_mode_says_what_a_row_an_output_record_and_a_vector_space_carry():
    learned, other = SparseMode.of("org/a"), SparseMode.of("org/b")
    assert [m.space_suffix for m in (OFF, BM25)] == ["", "+bm25"]
    assert learned.space_suffix.startswith("+sparse-") and learned.space_suffix != other.space_suffix
    assert [m.rows_carry_text for m in (OFF, BM25, learned)] == [False, True, False]
    assert [m.learned for m in (OFF, BM25, learned)] == [False, False, True]
    assert [m.output_dims for m in (OFF, BM25, learned)] == [0, 0, MAX_ACTIVE_DIMS]


def test_a_collection_kind_has_the_metric_its_sparse_field_is_searched_with():
    assert SparseKind.BM25.metric == "BM25" and SparseKind.LEARNED.metric == "IP"
    with pytest.raises(ValueError, match="no sparse metric"):
        SparseKind.OFF.metric  # noqa: B018 - the property raises
    assert SparseKind("learned") is SparseKind.LEARNED
