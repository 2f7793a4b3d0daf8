"""Judge mutmut's survivors again, one at a time, against the unit tests of their module.

``mutmut run`` picks the tests a mutant is run against from which tests called its function in a
first pass. Its first run here reported mutants as surviving that fail their own module's tests when
run alone (the offsets' ``store`` with its offsets list made ``None`` "survived", and fails
``test_offsets.py``). So each survivor is run again here: its module's unit tests, in the
``mutants/`` copy mutmut made, with ``MUTANT_UNDER_TEST`` naming it. What survives that is listed
with its diff, for a person to sort into "a user would notice" (a test is missing) and "nothing
observable changes" (log text, an equivalent comparison).

Run after ``mutmut run`` (``make mutate`` does both): ``python -m tools.mutants [--jobs 2]``; with
``--again [--only PREFIX]`` only the last run's survivors are judged (after tests were added for
them). Writes ``mutants/rejudged.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MUTANTS = REPO / "mutants"

#: The unit tests of each mutated module (a prefix of the mutant's name), fastest first.
TESTS = {
    "worker.core.delivery": ["test_transactions.py", "test_sink.py", "test_sink_rows.py", "test_loop.py"],
    "worker.core.ledger": ["test_share.py", "test_offsets.py", "test_transactions.py", "test_loop.py"],
    "worker.core.fence": ["test_fence.py", "test_sink.py", "test_sink_rows.py", "test_loop.py"],
    "worker.steps.writing.versions": ["test_versions.py", "test_sink.py"],
    "worker.steps.writing.sink": ["test_sink.py", "test_sink_rows.py", "test_transactions.py"],
    "worker.steps.writing.planning": ["test_sink_rows.py", "test_sink.py", "test_versions.py"],
    "worker.steps.writing.targets": ["test_sink_rows.py", "test_sink.py", "test_refusals.py"],
    "worker.steps.polling.validate": ["test_validate.py", "test_intake.py"],
    "worker.steps.polling.dlq_limit": ["test_dlq_limit.py", "test_intake.py"],
}


def survivors() -> list[str]:
    """The mutants ``mutmut results`` lists as survived, or not checked (a run stopped early)."""
    out = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    return [line.split(":")[0].strip() for line in out.splitlines()
            if line.strip().endswith((": survived", ": not checked"))]


def tests_for(mutant: str) -> list[str]:
    for prefix, files in TESTS.items():
        if mutant.startswith(prefix):
            return [f"tests/unit/{f}" for f in files]
    raise KeyError(f"no tests named for {mutant}: add its module to tools.mutants.TESTS")


def judge(mutant: str, timeout: float = 30.0) -> str:
    """``killed`` (a test failed), ``survived`` or ``timeout`` (a mutant that breaks a wait)."""
    env = {**os.environ, "MUTANT_UNDER_TEST": mutant}
    try:
        res = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests_for(mutant)],
                             cwd=MUTANTS, env=env, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout"
    return "survived" if res.returncode == 0 else "killed"


def check_baseline(names: list[str]) -> None:
    """The tests of each module pass on ``mutants/``'s unmutated code, or nothing here means anything
    (a test that fails there "kills" every mutant): stop with what to do when one does not."""
    for files in {tuple(tests_for(n)) for n in names}:
        res = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *files],
                             cwd=MUTANTS, env={k: v for k, v in os.environ.items() if k != "MUTANT_UNDER_TEST"},
                             capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"{' '.join(files)} fail on the unmutated copy in mutants/ (its source is older than the "
                             f"tests?): run `mutmut run` again first\n{res.stdout[-2000:]}")


def kind(diff_text: str) -> str:
    """A first sorting of a surviving mutant by what it touches: ``log`` (a log call's text or
    arguments), ``text`` (a message's wording), ``metric`` (a metric's labels) or ``behaviour`` (the
    rest: each needs a person to call it a missing test or an equivalent mutant)."""
    minus = " ".join(line[1:] for line in diff_text.splitlines() if line.startswith("-"))
    plus = " ".join(line[1:] for line in diff_text.splitlines() if line.startswith("+"))
    if re.search(r"\blog\.(debug|info|warning|error|log|exception)\(", minus):
        return "log"
    if "XX" in plus or (plus != minus and plus.lower() == minus.lower()):
        return "text"
    if ".labels(" in minus:
        return "metric"
    return "behaviour"


def survivors_markdown(still: dict[str, str]) -> str:
    """The survivors by module and kind, each with its changed line: a list to work through."""
    rows: dict[str, list[str]] = {}
    for name, text in sorted(still.items()):
        module, _, rest = name.partition(".x")
        if not rest:
            module = name.split("__mutmut")[0].rsplit(".", 1)[0]
        plus = next((line[1:].strip() for line in text.splitlines() if line.startswith("+")), "(a line removed)")
        rows.setdefault(f"{module} — {kind(text)}", []).append(f"- `{name.rsplit('ǁ', 1)[-1]}`: `{plus[:110]}`")
    out = ["# Surviving mutants\n", "Generated by `python -m tools.mutants` (see docs/mutation.md).\n"]
    for heading in sorted(rows):
        out += [f"\n## {heading} ({len(rows[heading])})\n", *rows[heading]]
    return "\n".join(out) + "\n"


def diff(mutant: str) -> str:
    out = subprocess.run([sys.executable, "-m", "mutmut", "show", mutant], cwd=REPO, capture_output=True, text=True)
    return "\n".join(line for line in out.stdout.splitlines() if line.startswith(("-", "+"))
                     and not line.startswith(("---", "+++")))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--again", action="store_true",
                    help="judge only those the last run of this tool left surviving (mutants/rejudged.json)")
    ap.add_argument("--only", default="", metavar="PREFIX", help="only mutants whose name starts with PREFIX")
    args = ap.parse_args(argv)
    # the tests as they are now (mutmut copied them when it ran): a test added for a survivor counts
    shutil.copytree(REPO / "tests", MUTANTS / "tests", dirs_exist_ok=True)
    last = json.loads((MUTANTS / "rejudged.json").read_text()) if args.again else None
    names = [n for n in (list(last["surviving"]) if last else survivors()) if n.startswith(args.only)]
    check_baseline(names)
    print(f"{len(names)} survivors to judge again", flush=True)
    verdicts: dict[str, str] = {}
    with ThreadPoolExecutor(args.jobs) as pool:
        for i, (name, verdict) in enumerate(zip(names, pool.map(judge, names)), 1):
            verdicts[name] = verdict
            if i % 20 == 0 or i == len(names):
                print(f"{i}/{len(names)} judged", flush=True)
    counts = {v: sum(1 for x in verdicts.values() if x == v) for v in ("killed", "survived", "timeout")}
    still = {n: diff(n) for n, v in verdicts.items() if v == "survived"}
    if last:  # the others keep their last verdict
        verdicts = {**last["verdicts"], **verdicts}
        still = {**{n: d for n, d in last["surviving"].items() if n not in names}, **still}
    (MUTANTS / "rejudged.json").write_text(json.dumps({"verdicts": verdicts, "surviving": still}, indent=1))
    (MUTANTS / "survivors.md").write_text(survivors_markdown(still))
    print(f"of {len(names)} reported survivors: {counts}; the survivors' diffs are in mutants/rejudged.json")


if __name__ == "__main__":
    main()
