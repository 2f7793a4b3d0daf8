"""`make mutate`'s switch-offs still find what they switch off: a refactor that moves or renames a
guarantee's code fails here, in `make test-fast`, not in an hour-long run a month later."""

from __future__ import annotations

import pytest

from tools.switch_offs import REPO, SWITCH_OFFS, SwitchOff, apply, verdict


@pytest.mark.parametrize("switch", SWITCH_OFFS, ids=[s.name for s in SWITCH_OFFS])
def test_each_switch_off_finds_its_guarantee_in_the_named_function(switch):
    source = (REPO / switch.path).read_text()
    edited = apply(switch, source)
    assert edited != source and switch.replace in edited
    compile(edited, switch.path, "exec")  # still Python


def test_a_switch_off_whose_function_moved_fails_loudly():
    moved = SwitchOff("x", "worker/core/fence.py", "Fence.no_such_method", "if age", "if False", ())
    with pytest.raises(LookupError, match="no_such_method"):
        apply(moved, (REPO / moved.path).read_text())


def _report(*cases: str) -> str:
    body = "".join(f'<testcase classname="t" name="t{i}">{c}</testcase>' for i, c in enumerate(cases))
    return f'<?xml version="1.0"?><testsuites><testsuite>{body}</testsuite></testsuites>'


_ASSERTED = '<failure message="assert 3 == 4">E   assert 3 == 4\n\ntests/x.py:9: AssertionError</failure>'
_CRASHED = '<failure message="RuntimeError: worker crashed">E   RuntimeError\n\ntests/x.py:9: RuntimeError</failure>'
_TIMED_OUT = '<failure message="Failed: Timeout &gt;600.0s">E   Failed: Timeout\n\ntests/x.py:9: Failed</failure>'
_NOT_RAISED = ('<failure message="Failed: DID NOT RAISE &lt;class \'FenceClosed\'&gt;">E   Failed: DID NOT RAISE'
               '\n\ntests/x.py:9: Failed</failure>')
_FIXTURE = '<error message="failed on setup">E   RuntimeError: the stack did not start\n\nx.py:3: RuntimeError</error>'


@pytest.mark.parametrize("code, report, expected", [
    (0, _report(""), "passed"),
    (1, _report("", _ASSERTED), "caught"),
    (1, _report(_ASSERTED, _FIXTURE), "inconclusive"),
    (1, _report(_CRASHED), "inconclusive"),
    (1, _report(_TIMED_OUT), "inconclusive"),
    (1, _report(_NOT_RAISED), "caught"),
    (1, _report(_ASSERTED, _CRASHED), "inconclusive"),
    (4, "", "inconclusive"),
    (1, "", "inconclusive"),
], ids=["passed", "asserted", "fixture-error", "crashed", "timed-out", "did-not-raise", "asserted-and-crashed",
        "usage", "no-report"])
def test_only_an_assertion_counts_as_caught(code, report, expected):
    assert verdict(code, report) == expected


def test_a_row_shows_the_edit_as_made_and_the_test_that_failed():
    from tools.switch_offs import row

    sw = SwitchOff("x", "worker/a.py", "A.b", "if a | b:", "if False:", ())
    line = row(sw, "caught end to end", 61.4, "FAILED tests/t.py::test_it[p] - AssertionError: no", "2026-12-02")
    assert line == ("| x | `worker/a.py` `A.b`: `if a \\| b:` → `if False:` | caught end to end | "
                    "`tests/t.py::test_it[p]` | 61 | 2026-12-02 |")
    assert line.count(" | ") == 5  # the pipe inside the code is escaped: still six cells


def test_the_table_is_written_between_its_markers_keeping_the_rows_not_judged(tmp_path):
    from tools.switch_offs import BEGIN, END, write_table

    first, second = SWITCH_OFFS[0].name, SWITCH_OFFS[1].name
    doc = tmp_path / "m.md"
    doc.write_text(f"intro\n{BEGIN}\n| switched off | … |\n|---|\n| {second} | old | caught | t | 1 | then |\n"
                   f"| gone | a switch-off no longer made | caught | t | 1 | then |\n{END}\nafter\n")
    write_table({first: f"| {first} | new |"}, doc)
    text = doc.read_text()
    assert text.startswith(f"intro\n{BEGIN}\n| switched off |") and text.endswith(f"{END}\nafter\n")
    body = text.split(BEGIN)[1].split(END)[0]
    assert f"| {first} | new |" in body and f"| {second} | old |" in body and "gone" not in body
    assert body.index(first) < body.index(f"| {second} |")  # the tool's order
    doc.write_text("no markers")
    with pytest.raises(SystemExit, match="markers"):
        write_table({}, doc)
