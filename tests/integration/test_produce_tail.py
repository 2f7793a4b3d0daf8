"""`produce` into the real broker and back; `tail` decodes what a producer wrote with embedding.avsc."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from confluent_kafka import Producer

from connectors.kafka import make_producer
from schemas.codec import decode_document, encode_embedding
from tests.helpers import fresh_settings, read_topic, run_cli, settings_env

pytestmark = pytest.mark.integration


def test_produce_jsonl_round_trip(stack, tmp_path):
    s = fresh_settings(stack)
    n = 1200
    docs = [{"id": f"doc-{i}", "text": f"text number {i} — ünïcödé ✓", "metadata": {"i": str(i)}} for i in range(n)]
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(json.dumps(d, ensure_ascii=False) for d in docs) + "\n")
    res = run_cli(["produce", str(path)], settings_env(s))
    assert res.returncode == 0, res.stderr
    assert f"produced {n}" in res.stderr.replace("\x1b[1m", "").replace("\x1b[0m", "")
    msgs = read_topic(s, s.input_topic, expect=n)
    decoded = [decode_document(m.key(), m.value()) for m in msgs]
    assert sorted(d.id for d in decoded) == sorted(d["id"] for d in docs)  # every id exactly once
    by_id = {d["id"]: d for d in docs}
    for m, d in zip(msgs, decoded):
        assert m.key().decode() == d.id
        assert d.text == by_id[d.id]["text"] and d.metadata == by_id[d.id]["metadata"]
        assert d.event_time is not None


def test_produce_bad_line_stops_or_skips(stack, tmp_path):
    s = fresh_settings(stack, partitions=1)
    path = tmp_path / "docs.jsonl"
    path.write_text('{"id": "a", "text": "x"}\n{"id": "b"}\n{"id": "c", "text": "y"}\n')
    res = run_cli(["produce", str(path)], settings_env(s))
    assert res.returncode == 1 and "line 2" in res.stderr and "--skip-bad" in res.stderr
    res = run_cli(["produce", str(path), "--skip-bad"], settings_env(s))
    assert res.returncode == 0, res.stderr
    assert "skipped" in res.stderr
    ids = [decode_document(m.key(), m.value()).id for m in read_topic(s, s.input_topic, expect=2)]
    # The first run stopped before producing anything; the second produced "a" and "c".
    assert sorted(ids) == ["a", "c"]


def test_produce_rate_paces_the_stream(stack, tmp_path):
    s = fresh_settings(stack, partitions=1)
    path = tmp_path / "docs.txt"
    path.write_text("\n".join(f"line {i}" for i in range(30)) + "\n")
    t0 = time.monotonic()
    res = run_cli(["produce", str(path), "--rate", "20"], settings_env(s))
    assert res.returncode == 0, res.stderr
    assert time.monotonic() - t0 >= 29 / 20


def test_tail_decodes_embeddings_and_tombstones(stack):
    s = fresh_settings(stack, partitions=2)
    p = make_producer(s.kafka_common())
    recs = [{"id": f"e{i}", "model": "m", "dim": 3, "vector": [0.5, 0.25, -1.0], "content_hash": "h",
             "cached": bool(i % 2), "source_topic": "docs", "source_partition": 0, "source_offset": i,
             "metadata": {"i": str(i)}, "embedded_at": 1_700_000_000_000 + i} for i in range(5)]
    for r in recs:
        p.produce(s.output_topic, key=r["id"], value=encode_embedding(r))
    p.produce(s.output_topic, key="gone", value=None)
    assert p.flush(10) == 0
    res = run_cli(["tail", "--from-beginning", "--max", "6", "--timeout", "20"], settings_env(s))
    assert res.returncode == 0, res.stderr
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    assert len(lines) == 6
    got = {x["id"]: x for x in lines}
    assert got["gone"]["tombstone"] is True
    for r in recs:
        assert {k: got[r["id"]][k] for k in r} == r


def test_tail_reads_committed_records_unless_asked(stack):
    """A transactional producer's open transaction is hidden from `tail` (read_committed, as consumers
    of an exactly-once output read) until it commits, and shown with --read-uncommitted."""
    s = fresh_settings(stack, partitions=1)
    p = Producer({**s.kafka_common(), "transactional.id": f"tail-{s.group_id}"})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(s.output_topic, key="kept", value=None)
    p.commit_transaction(30)
    p.begin_transaction()
    p.produce(s.output_topic, key="open", value=None)
    assert p.flush(10) == 0  # written, its transaction still open
    args = ["tail", "--from-beginning", "--timeout", "3"]
    res = run_cli(args, settings_env(s))
    assert res.returncode == 0, res.stderr
    assert [json.loads(x)["id"] for x in res.stdout.splitlines()] == ["kept"]
    res = run_cli([*args, "--read-uncommitted"], settings_env(s))
    assert res.returncode == 0, res.stderr
    assert [json.loads(x)["id"] for x in res.stdout.splitlines()] == ["kept", "open"]
    p.commit_transaction(30)
    res = run_cli(args, settings_env(s))
    assert [json.loads(x)["id"] for x in res.stdout.splitlines()] == ["kept", "open"]


def test_the_readmes_quick_start_runs_as_written(stack):
    """The README's "try the pieces" block, line by line in a shell, on the test stack (`dev up` and `dev down`
    left out: the suite's stack stands in, with topics of this test's own): the document it produces is
    embedded, tailed and found."""
    import re
    from pathlib import Path

    from tests.helpers import REPO

    readme = (Path(REPO) / "README.md").read_text()
    block = readme.split("Try the pieces one at a time on the local stack:", 1)[1].split("```sh\n", 1)[1]
    block = block.split("```", 1)[0]
    commands = re.sub(r"\\\n\s*", "", block).splitlines()  # continued lines joined
    commands = [c.split("  #", 1)[0].strip() for c in commands if c.strip() and " dev " not in c]
    assert any("produce -" in c for c in commands), commands
    s = fresh_settings(stack, partitions=1)
    env = settings_env(s)
    out = {}
    for command in commands:
        res = subprocess.run(["bash", "-c", command.replace(".venv/bin/embedstream",
                                                            f"{Path(REPO) / '.venv' / 'bin' / 'embedstream'}")],
                             env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, (command, res.stderr[-2000:])
        out["tail" if " tail " in command else "search" if " search " in command else command] = res.stdout
    tailed = [json.loads(line) for line in out["tail"].splitlines() if line.startswith("{")]
    assert [t["id"] for t in tailed] == ["doc-1"] and tailed[0]["metadata"] == {"lang": "en"}
    assert "doc-1" in out["search"]
