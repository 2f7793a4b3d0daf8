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
