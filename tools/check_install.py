"""What users install, installed and run as they would (``make check-install``; ``.ci/run`` after ``make test``).

1. **The package.** The wheel and the sdist built from the checkout (``python -m build``); the wheel holds
   the worker, its schema files and nothing of the tools or tests.
2. **``pip install embedstream``.** A fresh virtualenv, PyPI's torch first, then the wheel with no extras
   and no constraints (what a user gets today), and from a folder outside the checkout:
   ``embedstream --version``, ``embedstream run --check`` on the local stack, ``embedstream produce`` of a
   JSONL file, a short ``embedstream run --stop-when-idle`` and ``embedstream tail`` of what it wrote.
3. **The image's install.** ``docker/install-worker.sh`` (what the Dockerfile runs) into a prefix of its
   own from the unpacked sdist, the CPU variant (int8), and the same run from that prefix.

The local stack is started with the development environment (``embedstream dev up --broker kafka``) and
stopped at the end. Exits non-zero, naming the step, when anything fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = 40


class Failed(RuntimeError):
    pass


def _run(args: list[str], *, cwd: Path, env: dict[str, str] | None = None, timeout: float = 900,
         what: str) -> subprocess.CompletedProcess:
    t0 = time.monotonic()
    try:
        res = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise Failed(f"{what}: no end within {timeout:.0f} s:\n{str(exc.stderr or '')[-3000:]}") from None
    print(f"  {what}: exit {res.returncode} in {time.monotonic() - t0:.0f} s", flush=True)
    if res.returncode != 0:
        raise Failed(f"{what} failed (exit {res.returncode}):\n{(res.stdout + res.stderr)[-4000:]}")
    return res


def torch_pin() -> str:
    """The torch the suite runs on (the Makefile's pin)."""
    for line in (REPO / "Makefile").read_text().splitlines():
        if line.startswith("TORCH_PIN"):
            return line.split("=", 1)[1].strip()  # TORCH_PIN ?= torch==X
    raise Failed("no TORCH_PIN in the Makefile")


def build(out: Path) -> tuple[Path, Path]:
    """The wheel and the sdist, checked for what they hold."""
    out.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out), str(REPO)], cwd=out,
         what="python -m build")
    wheel, sdist = next(out.glob("embedstream-*.whl")), next(out.glob("embedstream-*.tar.gz"))
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("schemas/document.avsc", "schemas/embedding.avsc", "worker/commands/cli/__init__.py",
                   "connectors/milvus/expressions.py"):
        if needed not in names:
            raise Failed(f"the wheel has no {needed}")
    stray = [n for n in names if n.startswith(("tools/", "tests/"))]
    if stray:
        raise Failed(f"the wheel holds development files: {stray[:5]}")
    with tarfile.open(sdist) as tar:
        if not any(n.endswith("/constraints.txt") for n in tar.getnames()):
            raise Failed("the sdist has no constraints.txt (docker/install-worker.sh installs with it)")
    print(f"  {wheel.name}: {len(names)} files; {sdist.name}", flush=True)
    return wheel, sdist


def worker_round(bin_dir: Path, env: dict[str, str], work: Path, label: str, expect_precision: str | None) -> None:
    """``--version``, ``run --check``, ``produce``, ``run --stop-when-idle`` and ``tail`` from ``bin_dir``,
    run in ``work`` (outside the checkout)."""
    es = str(bin_dir / "embedstream")
    version = _run([es, "--version"], cwd=work, env=env, what=f"{label}: embedstream --version").stdout.strip()
    print(f"  {version}", flush=True)
    _run([es, "run", "--check"], cwd=work, env=env, timeout=300, what=f"{label}: embedstream run --check")
    docs = work / f"{label}.jsonl"
    docs.write_text("".join(json.dumps({"id": f"{label}-{i}", "text": f"an installed worker's document number {i}",
                                        "metadata": {"from": label}}) + "\n" for i in range(DOCS)))
    _run([es, "produce", str(docs)], cwd=work, env=env, timeout=300, what=f"{label}: embedstream produce")
    ran = _run([es, "run", "--stop-when-idle", "3"], cwd=work, env=env, timeout=600,
               what=f"{label}: embedstream run --stop-when-idle 3")
    if expect_precision and f"precision {expect_precision}" not in ran.stderr and \
            f"'{expect_precision}'" not in ran.stderr and expect_precision not in ran.stderr:
        raise Failed(f"{label}: the run did not use {expect_precision}:\n{ran.stderr[-2000:]}")
    tail = _run([es, "tail", "--from-beginning", "--timeout", "5", "--no-vectors"], cwd=work, env=env, timeout=120,
                what=f"{label}: embedstream tail")
    ids = {json.loads(line)["id"] for line in tail.stdout.splitlines() if line.startswith("{")}
    mine = {i for i in ids if i.startswith(f"{label}-")}
    if len(mine) != DOCS:
        raise Failed(f"{label}: {len(mine)} of {DOCS} documents on the output topic")


def fresh_env(stack_env: dict[str, str]) -> dict[str, str]:
    """The environment of a user's shell: no development path, the stack's settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EMBEDSTREAM_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(stack_env)
    env["HF_HUB_OFFLINE"] = "1"
    return env


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="embedstream-install-"))
    dev = REPO / ".venv" / "bin" / "embedstream"
    state = root / "stack"
    t0 = time.monotonic()
    try:
        print("1. the package", flush=True)
        wheel, sdist = build(root / "dist")
        print("   the local stack (Apache Kafka)", flush=True)
        up = _run([str(dev), "dev", "up", "--broker", "kafka", "--state-dir", str(state)], cwd=REPO,
                  what="embedstream dev up", timeout=600)
        stack_env = dict(line.split("=", 1) for line in up.stdout.splitlines() if "=" in line)
        env = fresh_env(stack_env)
        work = root / "elsewhere"
        work.mkdir()

        print("2. pip install embedstream (the wheel, no extras) in a fresh virtualenv", flush=True)
        plain = root / "plain"
        _run([sys.executable, "-m", "venv", str(plain)], cwd=work, what="python -m venv")
        pip = [str(plain / "bin" / "python"), "-m", "pip", "install", "--quiet"]
        _run([*pip, torch_pin()], cwd=work, what=f"pip install {torch_pin()}")
        _run([*pip, str(wheel)], cwd=work, what=f"pip install {wheel.name}")
        worker_round(plain / "bin", env, work, "plain", None)

        print("3. docker/install-worker.sh cpu into a prefix, from the unpacked sdist", flush=True)
        with tarfile.open(sdist) as tar:
            tar.extractall(root / "sdist", filter="data")
        source = next((root / "sdist").iterdir())
        prefix = root / "image"
        _run(["sh", str(source / "docker" / "install-worker.sh"), str(prefix), "cpu", str(source)], cwd=work,
             what="docker/install-worker.sh cpu", timeout=1200)
        worker_round(prefix / "bin", {**env, "EMBEDSTREAM_PRECISION": "int8"}, work, "image", "int8")
    except Failed as exc:
        print(f"check-install: {exc}", file=sys.stderr)
        return 1
    finally:
        subprocess.run([str(dev), "dev", "down", "--state-dir", str(state)], cwd=REPO, capture_output=True,
                       timeout=120)
        shutil.rmtree(root, ignore_errors=True)
    print(f"check-install: all passed in {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
