"""The layering rules, read from the source: schemas imports nothing of ours, connectors import only
schemas, the runtime never imports a tool, and only the CLI layer touches the environment."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ["worker/loop.py", "worker/assignment.py", "worker/offsets.py", "worker/chain.py", "worker/pipeline.py",
           "worker/records.py", "worker/stats.py", "worker/metrics.py", "worker/runner.py", "worker/settings.py",
           "worker/heap.py", "worker/processes.py", "worker/gpu_metrics.py",
           *[str(p.relative_to(ROOT)) for p in (ROOT / "worker/steps").glob("*.py")],
           *[str(p.relative_to(ROOT)) for p in (ROOT / "worker/embedding").glob("*.py")]]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _ours(names: set[str]) -> set[str]:
    return {n for n in names if n.split(".")[0] in ("worker", "connectors", "schemas")}


@pytest.mark.parametrize("path", sorted((ROOT / "schemas").glob("*.py")), ids=lambda p: p.name)
def test_schemas_import_only_schemas(path):
    assert {n for n in _ours(_imports(path)) if not n.startswith("schemas")} == set()


@pytest.mark.parametrize("path", sorted((ROOT / "connectors").glob("*.py")), ids=lambda p: p.name)
def test_connectors_import_no_worker(path):
    assert {n for n in _ours(_imports(path)) if n.startswith("worker")} == set()


@pytest.mark.parametrize("rel", sorted(RUNTIME))
def test_the_runtime_never_imports_a_tool(rel):
    assert {n for n in _imports(ROOT / rel) if n.startswith("worker.tools")} == set()


def test_only_the_cli_layer_reads_or_writes_the_environment():
    offenders = []
    for path in [*ROOT.glob("worker/**/*.py"), *ROOT.glob("connectors/*.py"), *ROOT.glob("schemas/*.py")]:
        rel = str(path.relative_to(ROOT))
        if rel in ("worker/cli.py", "worker/settings.py") or rel.startswith("worker/tools/"):
            continue
        text = path.read_text()
        if "os.environ" in text or "getenv" in text:
            offenders.append(rel)
    assert offenders == []
