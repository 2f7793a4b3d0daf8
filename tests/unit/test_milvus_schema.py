"""The upsert request's vector column, written as packed wire bytes: the same message protobuf
builds from Python floats."""

from __future__ import annotations

import numpy as np
import pytest
from pymilvus.grpc_gen import schema_pb2

from connectors.milvus.schema import packed_floats


@pytest.mark.parametrize("rows", [1, 3, 1000])
def test_packed_floats_parse_to_the_same_float_vector(rows):
    vectors = np.random.default_rng(rows).standard_normal((rows, 384)).astype(np.float32)
    expected = schema_pb2.VectorField(dim=384)
    expected.float_vector.data.extend(vectors.ravel().tolist())
    got = schema_pb2.VectorField(dim=384)
    got.float_vector.MergeFromString(packed_floats(vectors))
    assert got == expected and got.SerializeToString() == expected.SerializeToString()


def test_other_dtypes_and_layouts_become_little_endian_float32():
    vectors = np.arange(12, dtype=np.float64).reshape(3, 4)[:, ::2]  # not contiguous, not float32
    got = schema_pb2.FloatArray()
    got.MergeFromString(packed_floats(vectors))
    assert list(got.data) == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]


def test_bm25_indexes_the_words_of_compound_identifiers_after_the_text():
    from connectors.milvus.schema import bm25_text

    assert bm25_text("plain words, nothing compound.") == "plain words, nothing compound."
    assert bm25_text("xmlrpc.server.register_instance") == ("xmlrpc.server.register_instance\n\n"
                                                            "xmlrpc server register instance")
    got = bm25_text("call getLogger on an EntryPoint: ERR_SSL_VERSION")
    assert got.startswith("call getLogger on an EntryPoint: ERR_SSL_VERSION\n\n")
    assert got.split("\n\n")[1].split() == ["get", "logger", "entry", "point", "err", "ssl", "version"]
    assert bm25_text("a_b and a_b again") == "a_b and a_b again\n\na b"  # each word once


def test_bm25_leaves_long_runs_alone_and_finds_names_in_prose():
    """A run of word characters past 256 (a hash, a blob) is no identifier: nothing is appended.
    Names are found inside prose and punctuation, a sentence's full stop not taken for a dot."""
    from connectors.milvus.schema import bm25_text

    blob = "é" * 40_000 + " " + "a_" * 200
    assert bm25_text(blob) == blob
    prose = "See json.dumps. Then (os.path.join)!"
    assert bm25_text(prose) == prose + "\n\njson dumps os path join"
