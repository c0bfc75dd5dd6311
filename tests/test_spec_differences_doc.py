"""docs/spec-differences.md: one table of every deliberate difference from the spec.

Kept easy to extend (issue 26 item 10): rows are numbered in order, each has every column
filled and points to the page that documents it, and the page is reachable from the index
and the README.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "spec-differences.md"
KINDS = {"changed", "added", "reading", "out of scope"}


def rows() -> list[list[str]]:
    table = [
        line for line in PAGE.read_text(encoding="utf-8").splitlines() if line.startswith("| ")
    ]
    header, *body = table
    assert header.startswith("| # | Kind | Spec (section) |"), header
    # A cell may hold an escaped pipe (\|); split on the others.
    return [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in body[1:]]


def test_rows_are_numbered_in_order_and_complete() -> None:
    table = rows()
    assert len(table) >= 20
    for number, row in enumerate(table, start=1):
        assert len(row) == 7, row
        assert row[0] == str(number), row
        assert row[1] in KINDS, row
        assert all(row), f"row {number} has an empty column"
        assert re.search(r"\]\([a-z-]+\.md(#[a-z0-9-]+)?\)", row[6]), f"row {number}: no page"


def test_the_differences_named_in_the_issue_are_listed() -> None:
    text = PAGE.read_text(encoding="utf-8")
    for needle in (
        "--mcp-config",  # code mode adds helpers
        "default_enabled=True",  # lemon-exec mcp enables execute_code
        "**exact** line numbers",  # tracebacks
        "comm channel",  # instead of the file bridge
        "bubblewrap",  # the sandbox
        "cmd.exe",  # the shell's Windows branch
    ):
        assert needle in text, needle


def test_the_page_is_linked_from_the_index_and_the_readme() -> None:
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    assert "\nspec-differences\n" in index  # in a toctree
    assert "(spec-differences.md)" in index
    assert "(docs/spec-differences.md)" in (ROOT / "README.md").read_text(encoding="utf-8")
