"""The tiers of ``make test``: the fast tier beside the stack's start, then one local stack and one
model cache for two pytest sessions.

0. While the stack starts (a JVM, Milvus, Redis, the registry: most of its minute is waiting on
   them) and the model's int8 export is made, the fast tier runs beside them at low CPU priority
   (its output shown whole when it ends). The stack's sessions start once all three are done, so
   no test that times sessions or stalls shares the cores with them.
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
in ``SUITE_CACHE_DIR`` (``tests/conftest.py``), before the sessions. Extra arguments go to the two
stack sessions (``--no-fast`` leaves the fast tier out). Exit status: the first failing tier's, else 0."""

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


def fast_tier() -> list[str]:
    """The fast tier's command line (as ``make test-fast``); run at nice 19 beside the stack's start."""
    return [sys.executable, "-m", "pytest", "-q", "-m", "fast", "-n", "auto", "tests/unit", "tests/connectors"]


def export_model() -> None:
    """Load the default model as a worker does (precision ``auto``): on a CPU without bf16 that makes
    its int8 export and records its check, in ``$XDG_CACHE_HOME``, once for every test of the run."""
    from worker.commands.cli import process_defaults
    from worker.embedding.sentence import SentenceTransformerEmbedder

    process_defaults()
    SentenceTransformerEmbedder()


def sessions(extra: list[str], workers: int = SHARED_WORKERS) -> list[tuple[str, list[str]]]:
    """The two pytest command lines: (what it runs, argv); ``workers``: the second's tests at once."""
    base = [sys.executable, "-m", "pytest", "-q"]  # ``extra`` last: a --durations of its own overrides the 25
    return [("one at a time", [*base, "-m", "not fast and alone", "--durations=25", *extra]),
            (f"{workers} at a time", [*base, "-m", "not fast and not alone", "-n", str(workers),
                                      "--dist", "loadfile", "--durations=25", *extra])]


def start_stack(root: Path):
    """The suite's local stack in ``root`` (Apache Kafka unless EMBEDSTREAM_TEST_BROKER says otherwise), up."""
    from tools.dev import LocalStack

    stack = LocalStack(root / "stack", broker=os.environ.get("EMBEDSTREAM_TEST_BROKER", "kafka"))
    stack.up(partitions=6)
    return stack


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-fast", action="store_true",
                    help="leave the fast tier out (it is left out too when tests are named after --)")
    ap.add_argument("--shared-workers", type=int, default=SHARED_WORKERS, metavar="N",
                    help=f"how many of the second session's tests run at once (default {SHARED_WORKERS})")
    ap.add_argument("pytest_args", nargs="*", help="more arguments for both stack sessions (after --)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="embedstream-suite-") as scratch:
        root, started = Path(scratch), time.monotonic()
        cache, code, spent = root / "cache", 0, []
        children = [_child("model export", ["nice", "-n", "10", sys.executable, "-c",
                                            "from tools.suite import export_model; export_model()"],
                           root, XDG_CACHE_HOME=str(cache))]
        if not (args.no_fast or args.pytest_args):
            children.append(_child("fast tier", ["nice", "-n", "19", *fast_tier()], root))
        stack = None
        try:
            stack = start_stack(root)
            print(f"suite stack up in {time.monotonic() - started:.0f} s ({stack.state_dir})", flush=True)
            for name, child, log in children:
                rc = child.wait()
                took = time.monotonic() - started
                if name == "fast tier":
                    print(f"\n== the fast tier, beside the stack's start: {' '.join(fast_tier())}\n"
                          f"{log.read_text(errors='replace')}", flush=True)
                    spent.append(f"fast tier {took:.0f} s from the start (exit {rc})")
                    code = code or rc
                elif rc != 0:  # not a failure of the suite: each test's worker makes the export itself
                    print(f"the model's export failed (exit {rc}):\n{log.read_text(errors='replace')[-3000:]}")
            print(f"stack, model export and fast tier done {time.monotonic() - started:.0f} s from the start")
            env = {**os.environ, "SUITE_STACK_DIR": str(stack.state_dir), "SUITE_CACHE_DIR": str(cache)}
            for name, command in sessions(args.pytest_args, args.shared_workers):
                print(f"\n== the stack's tests, {name}: {' '.join(command[1:])}", flush=True)
                t0 = time.monotonic()
                rc = subprocess.run(command, cwd=REPO, env=env).returncode
                spent.append(f"{name} {time.monotonic() - t0:.0f} s (exit {rc})")
                code = code or (0 if rc == 5 else rc)  # 5: nothing selected (a subset given)
        finally:
            for _, child, _ in children:
                child.kill()
                child.wait()
            if stack is not None:
                stack.down()
        print(f"\ntiers: {'; '.join(spent)}; all {time.monotonic() - started:.0f} s", flush=True)
    return code


def _child(name: str, argv: list[str], root: Path, **env: str) -> tuple[str, subprocess.Popen, Path]:
    """``argv`` started in the checkout, its output to a file in ``root`` (a pipe left unread while
    the stack starts could fill and stop it)."""
    log = root / f"{name.replace(' ', '-')}.log"
    with log.open("w") as out:
        child = subprocess.Popen(argv, cwd=REPO, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)
    return name, child, log


if __name__ == "__main__":
    sys.exit(main())
