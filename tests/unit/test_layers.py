"""The layering rules, read from the source: schemas imports nothing of ours, connectors import only
schemas, each room of the worker imports only the rooms below it (``ROOMS``), the steps of one thread
never import those of another, the runtime never imports a tool, nothing forms an import cycle, and
only the CLI layer touches the environment."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Every module of the worker (the command line reaches the tools by name, at run time, where they exist).
RUNTIME = [str(p.relative_to(ROOT)) for p in (ROOT / "worker").rglob("*.py")]

#: The rooms, bottom first: a module may import its own room and the rooms below it, never above.
ROOMS = ["schemas", "connectors", "worker.settings", "worker.process", "worker.embedding", "worker.core",
         "worker.steps", "worker.assembly", "worker.commands"]


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


@pytest.mark.parametrize("path", sorted((ROOT / "connectors").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_connectors_import_no_worker(path):
    assert {n for n in _ours(_imports(path)) if n.startswith("worker")} == set()


@pytest.mark.parametrize("rel", sorted(RUNTIME))
def test_the_runtime_never_imports_a_tool(rel):
    assert len(RUNTIME) > 40
    assert {n for n in _imports(ROOT / rel) if n.startswith("tools")} == set()


def test_only_the_cli_layer_reads_or_writes_the_environment():
    offenders = []
    for path in [*ROOT.glob("worker/**/*.py"), *ROOT.glob("connectors/**/*.py"), *ROOT.glob("schemas/*.py")]:
        rel = str(path.relative_to(ROOT))
        if rel == "worker/settings.py" or rel.startswith(("worker/commands/cli/", "tools/")):
            continue
        text = path.read_text()
        if "os.environ" in text or "getenv" in text:
            offenders.append(rel)
    assert offenders == []


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _top_level_imports(path: Path) -> set[str]:
    """Modules of ours ``path`` imports at module level, those under ``if TYPE_CHECKING:`` included (a
    cycle of types is a cycle of design, even when it cannot fail at import time); not those inside
    functions (imported late, on purpose: the tools' and the optional back-ends')."""
    names: set[str] = set()
    body = ast.parse(path.read_text()).body
    checking = [n for n in body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)]
    for node in [*body, *(stmt for block in checking for stmt in block.body)]:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return _ours(names)


def test_no_import_cycles():
    paths = [p for root in ("worker", "connectors", "schemas") for p in (ROOT / root).rglob("*.py")]
    modules = {_module(p): p for p in paths}
    graph = {m: {n for n in _top_level_imports(p) if n in modules and n != m} for m, p in modules.items()}
    cycles, state = [], dict.fromkeys(graph, 0)  # 0 unseen, 1 on the path, 2 done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state[n] == 1:
                cycles.append([*path[path.index(n):], n] if n in path else [m, n])
            elif state[n] == 0:
                visit(n, [*path, n])
        state[m] = 2

    for m in sorted(graph):
        if state[m] == 0:
            visit(m, [m])
    assert len(graph) > 50 and cycles == []


def _room(module: str) -> str:
    return next(r for r in sorted(ROOMS, key=len, reverse=True) if module == r or module.startswith(r + "."))


def test_each_room_imports_only_the_rooms_below_it_and_one_threads_steps_no_others():
    paths = [p for root in ("worker", "connectors", "schemas") for p in (ROOT / root).rglob("*.py")
             if p != ROOT / "worker" / "__init__.py"]  # the package itself, empty
    assert {_room(_module(p)) for p in paths} == set(ROOMS)  # every module sits in a room
    upward, across = [], []
    for path in paths:
        mine = _module(path)
        for name in _ours(_imports(path)):
            if ROOMS.index(_room(name)) > ROOMS.index(_room(mine)):
                upward.append(f"{mine} -> {name}")
            if mine.startswith("worker.steps.") and name.startswith("worker.steps."):
                if mine.split(".")[2] != name.split(".")[2]:
                    across.append(f"{mine} -> {name}")
    assert upward == [] and across == []
