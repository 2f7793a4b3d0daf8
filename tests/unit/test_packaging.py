"""The wheel (and so the image, which pip-installs it) holds every runtime module and data file of
the checkout, and none of the tools: an editable install finds modules a wheel leaves out, so only a
built wheel shows it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ("worker", "schemas", "connectors")


def test_the_wheel_holds_every_runtime_module(tmp_path):
    # Built from a copy: setuptools reuses the checkout's build/ folder, which may hold modules an
    # earlier build put there.
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__", "docs",
                                                             "helm"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "--wheel-dir", str(tmp_path), str(src)], check=True, capture_output=True, timeout=120)
    wheel = next(tmp_path.glob("embedstream-*.whl"))
    inside = set(zipfile.ZipFile(wheel).namelist())
    expected = {p.relative_to(ROOT).as_posix() for root in RUNTIME for p in (ROOT / root).rglob("*")
                if p.suffix in (".py", ".avsc") and "__pycache__" not in p.parts}
    assert expected, "no runtime modules found: is ROOT right?"
    assert not expected - inside, f"left out of the wheel: {sorted(expected - inside)}"
    assert not [n for n in inside if n.startswith(("tools/", "tests/"))]  # tools ship with a checkout only


def _declared() -> tuple[set[str], set[str], dict[str, str]]:
    """pyproject's dependencies and its int8 and gpu extras (normalised names), and the constraints."""
    import re

    import tomllib

    def name(req: str) -> str:
        return re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0].lower().replace("_", "-")

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = {name(r) for r in project["dependencies"]}
    extras = {name(r) for key in ("int8", "gpu") for r in project["optional-dependencies"][key]}
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            k, v = line.split("==", 1)
            pins[k.strip().lower().replace("_", "-")] = v.strip()
    return deps, extras, pins


def test_every_package_the_runtime_imports_is_declared():
    """`pip install embedstream` could not run: rich, numpy and yaml were imported but not declared (they
    came with the dev extra). Every third-party module the runtime imports is a declared dependency, or
    one of the int8 or gpu extras (imported only on their paths)."""
    import ast
    from importlib.metadata import packages_distributions

    found = packages_distributions()
    named = {"yaml": "pyyaml", "pynvml": "nvidia-ml-py"}  # not installed here, or named otherwise
    imported: set[str] = set()
    for root in RUNTIME:
        for path in (ROOT / root).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    imported |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    imported.add(node.module.split(".")[0])
    third = {m for m in imported if m not in sys.stdlib_module_names and m not in (*RUNTIME, "tools")}
    dists = {m: named.get(m) or (found.get(m) or [m])[0].lower().replace("_", "-") for m in third}
    deps, extras, _ = _declared()
    assert {m: d for m, d in dists.items() if d not in deps | extras} == {}
    assert dists["yaml"] in deps and dists["rich"] in deps and dists["numpy"] in deps


def test_the_constraints_pin_the_suites_torch_and_every_dependency():
    """constraints.txt (the image installs with it) holds the torch the Makefile pins and a version of every
    dependency and extra: a package it left out would be whatever PyPI has on the day of the build."""
    import re

    deps, extras, pins = _declared()
    pin = re.search(r"TORCH_PIN \?= torch==(\S+)", (ROOT / "Makefile").read_text()).group(1)
    assert pins["torch"] == pin
    assert sorted((deps | extras) - set(pins)) == []
