"""Does the suite notice when a guarantee is switched off? (``make mutate`` runs this first.)

Each :class:`SwitchOff` is one edit that turns a guarantee off in a scratch copy of the checkout, inside a
function named by its dotted name (found by reading the module, so a refactor that moves or renames it
fails :func:`apply` loudly, and ``tests/unit/test_switch_offs.py`` runs that in ``make test-fast``), and
the end-to-end tests that must then fail. The copy is made from the working tree's files (``git
ls-files``), so uncommitted work is judged too; the worker processes that the fault tests start import
the copy (``PYTHONPATH``).

A switch-off is judged in two runs of the same tests: on the unedited copy first (they must pass: else
the verdict is "inconclusive"), then on the edited copy, where it is **caught** only when a test fails on
an assertion. A stack that would not start, a timeout or an error in a fixture is "inconclusive", not
caught. The end-to-end tests are judged first; when they do not catch it, its unit tests are, so the
table says which tier did. The run ends with exit 1 when any switch-off is not caught end to end.

Every run of the suite here uses one local stack (Apache Kafka, Redis, Milvus, the registry) that the
tool starts once in its scratch root and stops at the end (``SUITE_STACK_DIR``), and one model cache
(``SUITE_CACHE_DIR``: one int8 export): a scenario makes its own topics, group and collection.

``--write`` puts the verdicts in ``docs/mutation.md``'s table (between its ``switch-offs`` markers),
one row a switch-off, each with the edit as the tool made it and the day it was judged: a row cannot
describe an edit the tool no longer makes. Rows of switch-offs not judged in this run are kept.

    python -m tools.switch_offs                  # every switch-off
    python -m tools.switch_offs "fence lease"    # one
    python -m tools.switch_offs --write          # every one, the table rewritten
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class SwitchOff:
    name: str
    path: str
    #: The function (``name`` or ``Class.method``) the edit is made in.
    function: str
    #: The text of the guarantee inside that function, and what it becomes when switched off (``find``
    #: must occur there exactly once).
    find: str
    replace: str
    #: pytest arguments (paths, -k) of the end-to-end tests that must fail without it (``embedstream run``
    #: or the worker on the real stack); empty where no end-to-end test can see it yet.
    tests: tuple[str, ...]
    #: The unit tests judged when the end-to-end ones do not catch it (so the table says which tier did).
    unit: tuple[str, ...] = ()


def _span(source: str, function: str) -> tuple[int, int]:
    """The lines (1-based, inclusive) of ``function`` (``name`` or ``Class.method``) in ``source``."""
    parts = function.split(".")
    body: list[ast.stmt] = ast.parse(source).body
    node: ast.AST | None = None
    for part in parts:
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            raise LookupError(f"no {function} (no {part!r})")
        body = getattr(node, "body", [])
    assert node is not None
    return node.lineno, node.end_lineno or node.lineno  # type: ignore[attr-defined]


def apply(switch: SwitchOff, source: str) -> str:
    """``source`` with ``switch`` applied; raises ``LookupError`` naming what moved when the function or
    the text is not where the switch-off says (update :data:`SWITCH_OFFS` to the code)."""
    first, last = _span(source, switch.function)
    lines = source.splitlines(keepends=True)
    inside = "".join(lines[first - 1:last])
    if inside.count(switch.find) != 1:
        raise LookupError(f"{switch.name}: {switch.find!r} is in {switch.path}:{switch.function} "
                          f"{inside.count(switch.find)} times, not once")
    return "".join(lines[:first - 1]) + inside.replace(switch.find, switch.replace) + "".join(lines[last:])


SWITCH_OFFS = (
    SwitchOff("exactly-once", "worker/assembly/groups.py", "join",
              "kind = KINDS[(s.group_type, s.delivery)]", 'kind = KINDS[(s.group_type, "at-least-once")]',
              ("tests/faults/test_on_kafka.py", "-k", "killed_inside_its_transaction")),
    SwitchOff("fence lease", "worker/core/fence.py", "Fence.check",
              "if age > self.lease_s:", "if False:",
              ("tests/faults/test_zombie.py", "-k", "version_read"), ("tests/unit/test_fence.py",)),
    SwitchOff("fence ownership", "worker/core/fence.py", "Fence.stale",
              "return {tp for tp in batch.offsets if tenures.get(tp) is None or tenures.get(tp) != "
              "batch.tenure.get(tp)}", "return set()",
              ("tests/faults/test_zombie.py", "-k", "version_read"),
              ("tests/unit/test_fence.py", "tests/unit/test_sink.py")),
    SwitchOff("version guard", "worker/steps/writing/versions.py", "VersionGuard.superseded",
              "return have[0] == self.source(entry.source) and have[1] > entry.source.offset", "return False",
              ("tests/integration/test_recreated_topic.py", "-k", "older_version"), ("tests/unit/test_versions.py",)),
    SwitchOff("DLQ breaker", "worker/steps/polling/dlq_limit.py", "DlqLimit._trip",
              "raise DlqLimitExceeded(", "return DlqLimitExceeded(",
              ("tests/faults/test_data_and_group.py", "-k", "refuses_every_document"),
              ("tests/unit/test_loop.py", "tests/unit/test_dlq_limit.py")),
    SwitchOff("stale chunks", "worker/steps/writing/targets.py", "write_collection",
              "store.delete(stale)", "pass",
              ("tests/faults/test_long_documents.py",), ("tests/unit/test_sink_rows.py",)),
    SwitchOff("share lock", "worker/core/fence.py", "Fence.stale",
              "if locked_until is not None and self._clock() > locked_until:", "if False:",
              ("tests/faults/test_share_group.py", "-k", "lock_that_expires"), ("tests/unit/test_fence.py",)),
    SwitchOff("share release", "worker/core/ledger/share.py", "ShareLedger.finished",
              "kind = AcknowledgeType.RELEASE if src.tp in written.fenced else AcknowledgeType.ACCEPT",
              "kind = AcknowledgeType.ACCEPT",
              ("tests/faults/test_share_group.py", "-k", "lock_margin"), ("tests/unit/test_share.py",)),
    SwitchOff("exactly-once fence", "worker/steps/writing/sink.py", "SinkStep.owned_offsets",
              "if gone:", "if False:",
              ("tests/faults/test_zombie.py", "-k", "transaction_open"), ("tests/unit/test_transactions.py",)),
    SwitchOff("delete versions", "connectors/milvus/writes.py", "MilvusStore.versions",
              "versions = dict(deleted)", "versions: dict[str, Version] = {}",
              ("tests/integration/test_recreated_topic.py", "-k", "after_its_tombstone"),
              ("tests/connectors/test_milvus_store.py",)),
)

#: The table's place in docs/mutation.md.
DOC = REPO / "docs" / "mutation.md"
BEGIN, END = "<!-- switch-offs: begin (written by python -m tools.switch_offs --write) -->", "<!-- switch-offs: end -->"
HEADER = ("| switched off | the edit (in the named function) | verdict | the test that failed | seconds | judged |\n"
          "|---|---|---|---|---|---|")


def scratch_copy(dest: Path) -> None:
    """The checkout's tracked and new files (what ``git ls-files`` lists, ignored ones left out)."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


#: Set by :func:`main`: what every run of the suite shares (``tests/conftest.py``'s SUITE_* names).
SHARED: dict[str, str] = {}


def _pytest(copy: Path, tests: tuple[str, ...]) -> tuple[subprocess.CompletedProcess, str]:
    """Run ``tests`` in ``copy``: the process and its JUnit XML report (read for the verdict: the summary
    line is cut to the terminal's width, the report is not)."""
    env = {**os.environ, **SHARED, "PYTHONPATH": str(copy)}
    report = copy / ".switch-off-report.xml"
    report.unlink(missing_ok=True)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-rfE", "-p", "no:cacheprovider",
                          f"--junitxml={report}", *tests], cwd=copy, env=env, capture_output=True, text=True)
    return run, report.read_text() if report.exists() else ""


def verdict(returncode: int, junit: str) -> str:
    """``caught`` (a test failed on an assertion, and none errored), ``passed``, or ``inconclusive`` (an
    error in a fixture, a timeout, a crash, a stack that did not start, nothing collected).

    ``junit`` is pytest's JUnit XML report: each failure's text ends with ``path:line: ExceptionType``."""
    if returncode == 0:
        return "passed"
    if returncode != 1 or not junit:
        return "inconclusive"
    cases = ElementTree.fromstring(junit).iter("testcase")
    failures, errors = [], 0
    for case in cases:
        errors += len(case.findall("error"))
        for failure in case.findall("failure"):
            last = (failure.text or "").strip().splitlines()[-1:] or [""]
            failures.append((last[0].rsplit(": ", 1)[-1].strip(), failure.get("message", "")))
    return "caught" if failures and not errors and all(map(_asserted, failures)) else "inconclusive"


def _asserted(failure: tuple[str, str]) -> bool:
    """An assertion: ``AssertionError``, or pytest's own ``Failed`` of an expectation (``pytest.raises``'
    "DID NOT RAISE"), never its timeout."""
    kind, message = failure
    return kind == "AssertionError" or (kind == "Failed" and "DID NOT" in message and "Timeout" not in message)


def _judge_tests(copy: Path, switch: SwitchOff, tests: tuple[str, ...]) -> tuple[str, str]:
    """``tests`` on the unedited copy, then with ``switch`` applied (the copy is put back after):
    ``(verdict, the edited run's first failure or last line)``; ``caught`` only when the unedited run
    passed and the edited one failed on an assertion."""
    target = copy / switch.path
    original = target.read_text()
    baseline, report = _pytest(copy, tests)
    if verdict(baseline.returncode, report) != "passed":
        lines = [line for line in baseline.stdout.splitlines() if line.strip()]
        return "inconclusive (fails unedited)", lines[-1] if lines else baseline.stderr[-200:]
    target.write_text(apply(switch, original))
    try:
        run, report = _pytest(copy, tests)
    finally:
        target.write_text(original)
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    failed = [line for line in lines if line.startswith("FAILED ")]
    return verdict(run.returncode, report), failed[0] if failed else lines[-1] if lines else run.stderr[-200:]


def judge(switch: SwitchOff, root: Path) -> tuple[str, float, str]:
    """Judge ``switch`` on a scratch copy under ``root``: its end-to-end tests first, then (when they do not
    catch it) its unit tests. ``(verdict, seconds, the deciding run's line)``; the verdict is ``caught end
    to end``, ``caught by unit tests only``, ``not caught`` or ``inconclusive …``."""
    copy = Path(tempfile.mkdtemp(prefix=switch.name.replace(" ", "-") + "-", dir=root))
    scratch_copy(copy)
    apply(switch, (copy / switch.path).read_text())  # a moved target fails here, before any run
    t0 = time.monotonic()
    found, last = "not caught", "no end-to-end test"
    try:
        for tier, tests in (("end to end", switch.tests), ("by unit tests only", switch.unit)):
            if not tests:
                continue
            found, last = _judge_tests(copy, switch, tests)
            if found == "caught":
                return f"caught {tier}", time.monotonic() - t0, last
            found = "not caught" if found == "passed" else found
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    return found, time.monotonic() - t0, last


def row(switch: SwitchOff, found: str, seconds: float, last: str, day: str) -> str:
    """The table's row of ``switch``: the edit as :func:`apply` makes it, the verdict, the failing test
    (from the deciding run's ``FAILED path::name - message`` line, else that line), the seconds."""
    def code(text: str) -> str:
        return "`" + text.replace("|", "\\|") + "`"

    failed = last.removeprefix("FAILED ").split(" - ", 1)[0] if last.startswith("FAILED ") else last
    edit = f"{code(switch.path)} `{switch.function}`: {code(switch.find)} → {code(switch.replace)}"
    return f"| {switch.name} | {edit} | {found} | {code(failed) if failed else ''} | {seconds:.0f} | {day} |"


def write_table(rows: dict[str, str], doc: Path = DOC) -> None:
    """Put ``rows`` (by switch-off name) between the markers of ``doc``; the rows already there of
    switch-offs not in ``rows`` are kept (those no longer in :data:`SWITCH_OFFS` are dropped), in the
    order of :data:`SWITCH_OFFS`."""
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{doc}: no switch-offs markers ({BEGIN} … {END}) to write the table between")
    head, rest = text.split(BEGIN, 1)
    old, tail = rest.split(END, 1)
    kept = {line.split("|")[1].strip(): line for line in old.splitlines() if line.startswith("| ")
            and not line.startswith("| switched off")}
    merged = {**kept, **rows}
    lines = [merged[s.name] for s in SWITCH_OFFS if s.name in merged]
    doc.write_text(f"{head}{BEGIN}\n{HEADER}\n" + "\n".join(lines) + f"\n{END}{tail}")


def shared_stack(root: Path):
    """One local stack for every run (Apache Kafka, the suite's broker), started in ``root``."""
    from tools.suite import start_stack

    return start_stack(root)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help=f"switch-offs to judge (default: all of {[s.name for s in SWITCH_OFFS]})")
    ap.add_argument("--write", action="store_true", help=f"write the verdicts into {DOC.relative_to(REPO)}'s table")
    args = ap.parse_args(argv)
    chosen = [s for s in SWITCH_OFFS if not args.names or s.name in args.names]
    if not chosen:
        raise SystemExit(f"no switch-off named {args.names}: choose from {[s.name for s in SWITCH_OFFS]}")
    missed, rows = [], {}
    day = time.strftime("%Y-%m-%d")
    with tempfile.TemporaryDirectory(prefix="switch-offs-") as root:
        stack = shared_stack(Path(root))
        SHARED.update(SUITE_STACK_DIR=str(stack.state_dir), SUITE_CACHE_DIR=str(Path(root) / "cache"))
        try:
            print(f"{'switched off':<28} {'verdict':<30} {'seconds':>7}  the failing test, or the deciding run's line")
            for switch in chosen:
                found, seconds, last = judge(switch, Path(root))
                print(f"{switch.name:<28} {found:<30} {seconds:>7.0f}  {last[:200]}", flush=True)
                rows[switch.name] = row(switch, found, seconds, last, day)
                if found != "caught end to end":
                    missed.append(switch.name)
        finally:
            stack.down()
    if args.write:
        write_table(rows)
        print(f"{DOC.relative_to(REPO)}: {len(rows)} rows written")
    if missed:
        print(f"not caught end to end: {', '.join(missed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
