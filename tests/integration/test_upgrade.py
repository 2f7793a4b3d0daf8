"""An upgrade from release 0.1.0, whose model ids were paths, to this one, whose ids are a name and a hash
of the files: the worker keeps writing the collection readers query through the alias when its model
reproduces the vectors stored there, and stops saying to run `migrate` when it does not.

0.1.0 itself writes the collection first: its code (the commit before model ids changed), taken from this
repository's history with `git archive` and run with the same environment. A clone without that history
skips these tests, saying why."""

from __future__ import annotations

import subprocess
import sys

import pytest

from connectors.kafka import make_producer
from connectors.milvus import MilvusAdmin, MilvusReader
from schemas.codec import Document, encode_document
from tests.helpers import REPO, fresh_settings, missing_tool, run_cli, settings_env
from worker.core.records import content_hash, normalise_text

pytestmark = pytest.mark.integration

#: The last commit of release 0.1.0's model identity (its child made ids a name and a hash of the files).
RELEASE_0_1_0 = "948a1e4958e1750595ad51e19cf5da46592d7f9b"


@pytest.fixture(scope="module")
def old_release(tmp_path_factory):
    """Release 0.1.0's code, unpacked from the repository's history."""
    where = tmp_path_factory.mktemp("release-0.1.0")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", RELEASE_0_1_0], capture_output=True, timeout=120)
    if archive.returncode != 0:
        missing_tool(f"this clone has no commit {RELEASE_0_1_0[:10]} (release 0.1.0): a shallow clone? `git fetch "
                     f"--unshallow` brings the history. {archive.stderr.decode()[-200:]}")
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive.stdout, check=True, timeout=120)
    return where


def _run_old(old_release, s, *args: str, **env: str) -> subprocess.CompletedProcess:
    environment = {**settings_env(s), "PYTHONPATH": str(old_release), **env}
    return subprocess.run([sys.executable, "-c", "from worker.commands.cli import main; main()", "run", *args],
                          cwd=old_release, env=environment, capture_output=True, text=True, timeout=600)


def _produce(s, docs: dict[str, str]) -> None:
    producer = make_producer(s.kafka_common())
    for doc_id, text in docs.items():
        producer.produce(s.input_topic, key=doc_id.encode(), value=encode_document(Document(doc_id, text)))
    assert producer.flush(30) == 0


def test_an_upgrade_keeps_writing_the_collection_readers_query(stack, old_release):
    s = fresh_settings(stack, partitions=1)
    first = {f"d{i}": f"a short document about subject {i}" for i in range(20)}
    _produce(s, first)
    old = _run_old(old_release, s, "--stop-when-idle", "3")
    assert old.returncode == 0, old.stderr[-3000:]
    admin = MilvusAdmin(s.milvus_uri, s.milvus_collection, timeout=30)
    written_by_old = admin.alias_target(s.milvus_collection)
    assert written_by_old is not None  # 0.1.0 made the alias and its collection, named from the old id

    updates = {f"d{i}": f"the second version of document {i}, rewritten" for i in range(10)}
    _produce(s, updates)
    new = run_cli(["run", "--stop-when-idle", "0.5"], settings_env(s), timeout=600)
    assert new.returncode == 0, new.stderr[-3000:]
    assert "an earlier release wrote for this model" in new.stderr, new.stderr[-3000:]
    assert admin.alias_target(s.milvus_collection) == written_by_old
    assert admin.collections(s.milvus_collection + "__") in ([written_by_old, f"{written_by_old}_deleted"],
                                                             [written_by_old])  # no collection nobody reads
    reader = MilvusReader(s.milvus_uri, s.milvus_collection, timeout=30)  # through the alias, as readers do
    rows = {r["doc_id"]: r["content_hash"] for r in reader.query("chunk_index == 0", ["doc_id", "content_hash"])}
    assert rows == {d: content_hash(normalise_text({**first, **updates}[d])) for d in first}
    reader.close()
    admin.close()


def test_an_upgrade_whose_model_files_changed_stops_saying_to_migrate(stack, old_release, tmp_path):
    """0.1.0 wrote with the model at a path; the files at that path are another model's now: the new
    release cannot tell the old vectors from its own by the id, so it embeds stored texts again, finds
    they differ, and stops (exit 2) rather than write a collection nobody reads."""
    import shutil

    from tools.derived_models import packaged_model_path, projected_model

    model_dir = tmp_path / "model"
    shutil.copytree(packaged_model_path(), model_dir)
    s = fresh_settings(stack, partitions=1, model=str(model_dir))
    _produce(s, {f"d{i}": f"a short document about subject {i}" for i in range(10)})
    old = _run_old(old_release, s, "--stop-when-idle", "3")
    assert old.returncode == 0, old.stderr[-3000:]
    shutil.rmtree(model_dir)
    projected_model(model_dir, dim=384, seed=3)  # other vectors, the same dimension, at the same path
    res = run_cli(["run", "--stop-when-idle", "0.5"], settings_env(s), timeout=600)
    assert res.returncode == 2, res.stderr[-3000:]
    last = [line for line in res.stderr.splitlines() if line.strip()][-1]
    assert "does not reproduce" in last and "embedstream migrate" in last, last
