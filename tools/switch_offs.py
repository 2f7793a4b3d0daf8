"""Does the suite notice when a guarantee is switched off? (``make mutate`` runs this first.)

Each :class:`SwitchOff` is one edit that turns a guarantee off in a scratch copy of the checkout
(exactly-once delivery, the fence, the version guard, the DLQ breaker), and the tests that must then
fail. The copy is made from the working tree's files (``git ls-files``), so uncommitted work is
judged too; the worker processes that the fault tests start import the copy (``PYTHONPATH``).

A switch-off whose tests still pass is a promise nothing checks: the run ends with exit 1 and a table
that names it.

    python -m tools.switch_offs            # every switch-off
    python -m tools.switch_offs fence      # one
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class SwitchOff:
    name: str
    path: str
    #: The text of the guarantee, and what it becomes when switched off (each must occur once).
    find: str
    replace: str
    #: pytest arguments (paths, -k) of the tests that must fail without it.
    tests: tuple[str, ...]


SWITCH_OFFS = (
    SwitchOff("exactly-once", "worker/assembly/runner.py",
              'if s.delivery == "exactly-once":', "if False:",
              ("tests/faults/test_exactly_once.py", "-k", "kill_9")),
    SwitchOff("fence", "worker/core/fence.py",
              "if age > self.lease_s:", "if False:",
              ("tests/unit/test_fence.py", "tests/unit/test_sink.py")),
    SwitchOff("version guard", "worker/steps/writing/versions.py",
              "return have[0] == self.source(entry.source) and have[1] > entry.source.offset", "return False",
              ("tests/unit/test_versions.py", "tests/unit/test_sink.py")),
    SwitchOff("DLQ breaker", "worker/steps/polling/dlq_limit.py",
              "        reason, count = (self._reasons.most_common(1)", "        return\n        reason, count = "
              "(self._reasons.most_common(1)",
              ("tests/unit/test_dlq_limit.py", "tests/unit/test_intake.py")),
)


def scratch_copy(dest: Path) -> None:
    """The checkout's tracked and new files (what ``git ls-files`` lists, ignored ones left out)."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def judge(switch: SwitchOff, root: Path) -> tuple[bool, float, str]:
    """Apply ``switch`` in a fresh copy under ``root`` and run its tests: (caught, seconds, last line);
    caught is pytest's exit 1 (tests failed), never an error of collection or usage."""
    copy = Path(tempfile.mkdtemp(prefix=switch.name.replace(" ", "-") + "-", dir=root))
    scratch_copy(copy)
    target = copy / switch.path
    text = target.read_text()
    if text.count(switch.find) != 1:
        raise SystemExit(f"{switch.name}: {switch.find!r} is not in {switch.path} exactly once: update "
                         "tools/switch_offs.py to the code")
    target.write_text(text.replace(switch.find, switch.replace))
    env = {**os.environ, "PYTHONPATH": str(copy)}
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *switch.tests],
                         cwd=copy, env=env, capture_output=True, text=True)
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    shutil.rmtree(copy, ignore_errors=True)
    return run.returncode == 1, time.monotonic() - t0, lines[-1] if lines else run.stderr[-200:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help=f"switch-offs to judge (default: all of {[s.name for s in SWITCH_OFFS]})")
    args = ap.parse_args(argv)
    chosen = [s for s in SWITCH_OFFS if not args.names or s.name in args.names]
    if not chosen:
        raise SystemExit(f"no switch-off named {args.names}: choose from {[s.name for s in SWITCH_OFFS]}")
    missed = []
    with tempfile.TemporaryDirectory(prefix="switch-offs-") as root:
        print(f"{'switched off':<16} {'caught':<7} {'seconds':>7}  tests' last line")
        for switch in chosen:
            caught, seconds, last = judge(switch, Path(root))
            print(f"{switch.name:<16} {'yes' if caught else 'NO':<7} {seconds:>7.0f}  {last}", flush=True)
            if not caught:
                missed.append(switch.name)
    if missed:
        print(f"not caught: {', '.join(missed)}: the suite passes with these guarantees switched off")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
