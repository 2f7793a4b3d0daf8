"""The project's pages: every link between them resolves (file and heading), the README stays a
README (short), and no page speaks of the work log (tracker numbers, session ordinals)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: A markdown link or image: ``[text](target)``; the target's own parentheses are not used here.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def _prose(text: str) -> str:
    """``text`` without its fenced code blocks (a link or a word in code is not the page's)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return "\n".join(out)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as dashes."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(page.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if not m:
            continue
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def test_slugs_are_githubs():
    assert slug("Hybrid search: sparse vectors beside the dense ones") == \
        "hybrid-search-sparse-vectors-beside-the-dense-ones"
    assert slug("`embedstream run` — exit codes") == "embedstream-run--exit-codes"
    assert slug("INT8 on CPUs") == "int8-on-cpus"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(page: Path):
    broken = []
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"^[a-z]+://|^mailto:", target):
            continue  # outside the repository: not checked here (no network in the suite)
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


#: What a page of the project does not say: a tracker's numbers, a work session's ordinal.
WORK_LOG = re.compile(
    r"\bissues? #?\d+|\btracker\b|\b(?:session|round|sprint) \d+\b"
    r"|\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
    r"thirteenth|fourteenth|fifteenth) (?:session|round|sprint)\b", re.IGNORECASE)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_speaks_of_the_work_log(page: Path):
    found = [m.group(0) for m in WORK_LOG.finditer(page.read_text())]
    assert not found, f"{page.relative_to(ROOT)}: {found}"


def test_the_readme_stays_short():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 350, f"README.md has {lines} lines: move reference material into docs/"


def test_the_operations_page_lists_the_acls_the_secured_broker_test_grants():
    from tools.acls import table

    page = (ROOT / "docs" / "operations.md").read_text()
    assert "\n".join(table()) in page, "docs/operations.md's ACL table differs from tools/acls.py: paste table()"


def _cli_options() -> dict[tuple[str, ...], set[str]]:
    """Each command's path (``("lag",)``, ``("dlq", "show")``) → the options it takes, from the CLI itself."""
    import click
    import typer

    from worker.commands.cli import app

    out: dict[tuple[str, ...], set[str]] = {}

    def walk(cmd: click.Command, path: tuple[str, ...]) -> None:
        out[path] = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")} | {"--help"}
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, (*path, name))

    walk(typer.main.get_command(app), ())
    return out


#: ``embedstream`` and what follows on the same line of code (an inline span or a line of a block).
COMMAND_LINE = re.compile(r"\bembedstream((?: +[\w.<>/=:'\"$-]+)+)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_flag_a_page_gives_a_command_is_one_it_takes(page: Path):
    """``embedstream lag --group``: a flag no command has is a reader's failed first try."""
    commands = _cli_options()
    wrong = []
    spans = re.findall(r"`([^`\n]+)`", _prose(page.read_text()))
    blocks = [line for line in page.read_text().splitlines() if line.startswith(("embedstream ", "$ embedstream "))]
    for text in [*spans, *blocks]:
        for m in COMMAND_LINE.finditer(text):
            words = m.group(1).split()
            path: tuple[str, ...] = ()
            while words and (*path, words[0]) in commands:
                path, words = (*path, words[0]), words[1:]
            flags = {w.split("=")[0] for w in words if re.fullmatch(r"--[a-z][a-z0-9-]*(=.*)?", w)}
            wrong += [f"embedstream {' '.join(path)} {f}" for f in sorted(flags - commands[path])]
    assert not wrong, f"flags the CLI does not take: {wrong}"


def test_the_data_page_names_every_dead_letter_reason():
    from worker.steps.polling.dlq_limit import HINTS

    page = (ROOT / "docs" / "data.md").read_text()
    assert not [r for r in HINTS if f"`{r}`" not in page]
