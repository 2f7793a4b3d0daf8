"""The stack tiers of ``make test``: one local stack and one model cache for two pytest sessions.

1. The tests marked ``alone`` run one at a time, the guarantees first: those that freeze a part of the
   shared stack (they ask for the fault suite's ``parts``), and those that time sessions, locks and
   stalls that a test beside them would stretch (the zombie and share-group scenarios, static
   members, a Redis timeout, the lag exporter).
2. Every other test on the stack runs two at a time (pytest-xdist, a module's tests on one worker),
   the fault scenarios that kill, signal or flood only their own workers among them:
   each makes its own topics, group and collection (``tests.helpers.fresh_settings``), so two of them
   share the broker, Milvus, Redis and the registry as two teams would. On this project's 2-core host
   most of their time is spent waiting on the worker under test, not computing.

The stack is started here (``tools.dev.LocalStack``, Apache Kafka unless ``EMBEDSTREAM_TEST_BROKER``
says otherwise) and handed to both sessions through ``SUITE_STACK_DIR``; the int8 export is made once,
in ``SUITE_CACHE_DIR`` (``tests/conftest.py``). Extra arguments go to both pytest runs. Exit status:
the first failing session's, else 0."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: How many tests of the second session run at once.
SHARED_WORKERS = 2


def sessions(extra: list[str]) -> list[tuple[str, list[str]]]:
    """The two pytest command lines: (what it runs, argv)."""
    base = [sys.executable, "-m", "pytest", "-q", *extra]
    return [("one at a time", [*base, "-m", "not fast and alone", "--durations=25"]),
            (f"{SHARED_WORKERS} at a time", [*base, "-m", "not fast and not alone", "-n", str(SHARED_WORKERS),
                                             "--dist", "loadfile", "--durations=25"])]


def start_stack(root: Path):
    """The suite's local stack in ``root`` (Apache Kafka unless EMBEDSTREAM_TEST_BROKER says otherwise), up."""
    from tools.dev import LocalStack

    stack = LocalStack(root / "stack", broker=os.environ.get("EMBEDSTREAM_TEST_BROKER", "kafka"))
    stack.up(partitions=6)
    return stack


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pytest_args", nargs="*", help="more arguments for both pytest runs (after --)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="embedstream-suite-") as root:
        started = time.monotonic()
        stack = start_stack(Path(root))
        print(f"suite stack up in {time.monotonic() - started:.0f} s ({stack.state_dir})", flush=True)
        env = {**os.environ, "SUITE_STACK_DIR": str(stack.state_dir), "SUITE_CACHE_DIR": str(Path(root) / "cache")}
        code, spent = 0, []
        try:
            for name, command in sessions(args.pytest_args):
                print(f"\n== the stack's tests, {name}: {' '.join(command[1:])}", flush=True)
                t0 = time.monotonic()
                rc = subprocess.run(command, cwd=REPO, env=env).returncode
                spent.append(f"{name} {time.monotonic() - t0:.0f} s (exit {rc})")
                code = code or (0 if rc == 5 else rc)  # 5: nothing selected (a subset given)
        finally:
            stack.down()
        print(f"\nstack tiers: {'; '.join(spent)}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
