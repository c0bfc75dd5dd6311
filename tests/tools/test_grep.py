"""The grep tool, on real trees in tmp_path."""

from __future__ import annotations

import os
import pathlib

import pytest

from lemon_exec.errors import ToolFailure
from lemon_exec.tools import _grep

from .conftest import Invoke

pytestmark = pytest.mark.timeout(10)


@pytest.fixture
def tree(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "main.py").write_text("import os\nTODO: main\n")
    (tmp_path / "src" / "pkg" / "util.py").write_text("x = 1\n# todo lower\nTODO: util\n")
    (tmp_path / "README.md").write_text("TODO: docs\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("TODO: hidden\n")
    (tmp_path / "image.bin").write_bytes(b"TODO\0binary")
    return tmp_path


def test_recursive_search_output_format(tree: pathlib.Path, invoke: Invoke) -> None:
    assert invoke("grep", pattern="TODO").splitlines() == [
        "README.md:1:TODO: docs",
        "src/main.py:2:TODO: main",
        "src/pkg/util.py:3:TODO: util",
    ]


def test_paths_are_joined_to_the_given_path(tree: pathlib.Path, invoke: Invoke) -> None:
    assert invoke("grep", pattern="TODO", path="src/pkg") == "src/pkg/util.py:3:TODO: util"
    assert invoke("grep", pattern="TODO", path="src/main.py") == "src/main.py:2:TODO: main"
    absolute = str(tree / "src" / "pkg")
    assert invoke("grep", pattern="TODO", path=absolute) == f"{absolute}/util.py:3:TODO: util"


def test_ignore_case(tree: pathlib.Path, invoke: Invoke) -> None:
    out = invoke("grep", pattern="todo", path="src/pkg", ignore_case=True)
    assert out.splitlines() == ["src/pkg/util.py:2:# todo lower", "src/pkg/util.py:3:TODO: util"]
    assert invoke("grep", pattern="todo", path="src/pkg") == "src/pkg/util.py:2:# todo lower"


def test_glob_on_names_and_paths(tree: pathlib.Path, invoke: Invoke) -> None:
    assert invoke("grep", pattern="TODO", glob="*.md") == "README.md:1:TODO: docs"
    assert invoke("grep", pattern="TODO", glob="src/*.py") == "src/main.py:2:TODO: main"
    assert invoke("grep", pattern="TODO", glob="src/**/*.py").count("\n") == 1
    assert invoke("grep", pattern="TODO", glob="*.rs") == ""


def test_skips_hidden_dirs_and_binary_files(tree: pathlib.Path, invoke: Invoke) -> None:
    out = invoke("grep", pattern="TODO")
    assert ".git" not in out and "image.bin" not in out


def test_hidden_dir_can_be_searched_explicitly(tree: pathlib.Path, invoke: Invoke) -> None:
    assert invoke("grep", pattern="TODO", path=".git") == ".git/config:1:TODO: hidden"


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")
def test_does_not_follow_symlinked_dirs(tree: pathlib.Path, invoke: Invoke) -> None:
    os.symlink(tree / "src", tree / "src" / "pkg" / "loop")  # a cycle
    os.symlink(tree / "README.md", tree / "link.md")  # a file link is fine
    out = invoke("grep", pattern="TODO").splitlines()
    assert "link.md:1:TODO: docs" in out
    assert not any("loop" in line for line in out)


def test_no_match_is_empty(tree: pathlib.Path, invoke: Invoke) -> None:
    assert invoke("grep", pattern="nothing-like-this") == ""


def test_max_results_stops_early(tmp_path: pathlib.Path, invoke: Invoke) -> None:
    for i in range(5):
        (tmp_path / f"f{i}.txt").write_text("hit\nhit\n")
    out = invoke("grep", pattern="hit", max_results=3).splitlines()
    assert out[:3] == ["f0.txt:1:hit", "f0.txt:2:hit", "f1.txt:1:hit"]
    assert out[3].startswith("[truncated: stopped at 3 matches")
    assert len(out) == 4


def test_default_and_hard_cap(tmp_path: pathlib.Path, invoke: Invoke) -> None:
    (tmp_path / "many.txt").write_text("hit\n" * 2500)
    out = invoke("grep", pattern="hit").splitlines()
    assert len(out) == _grep.DEFAULT_MAX_RESULTS + 1
    out = invoke("grep", pattern="hit", max_results=100_000).splitlines()
    assert len(out) == _grep.MAX_RESULTS_CAP + 1
    assert f"capped at {_grep.MAX_RESULTS_CAP}" in out[-1]


def test_long_lines_are_cut(tmp_path: pathlib.Path, invoke: Invoke) -> None:
    (tmp_path / "min.js").write_text("x" * 2000 + "needle\n")
    out = invoke("grep", pattern="needle")
    prefix = "min.js:1:"
    assert out == prefix + "x" * _grep.MAX_LINE_CHARS + " [...]"


def test_file_limit(
    tmp_path: pathlib.Path, invoke_here: Invoke, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_grep, "MAX_FILES_SEARCHED", 3)
    for i in range(6):
        (tmp_path / f"f{i}.txt").write_text("hit\n")
    out = invoke_here("grep", pattern="hit").splitlines()
    assert out[:3] == ["f0.txt:1:hit", "f1.txt:1:hit", "f2.txt:1:hit"]
    assert out[3] == "[truncated: stopped after searching 3 files; narrow the path or glob]"


def test_oversized_files_are_skipped(
    tmp_path: pathlib.Path, invoke_here: Invoke, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_grep, "MAX_FILE_BYTES", 100)
    (tmp_path / "big.txt").write_text("hit\n" * 100)
    (tmp_path / "small.txt").write_text("hit\n")
    assert invoke_here("grep", pattern="hit").splitlines() == [
        "small.txt:1:hit",
        "[skipped 1 files larger than 0 MiB]",
    ]


def test_invalid_regex(tmp_path: pathlib.Path, invoke: Invoke) -> None:
    with pytest.raises(
        ToolFailure, match=r"grep: invalid regex '\(unclosed': missing \), unterminated subpattern"
    ):
        invoke("grep", pattern="(unclosed")


def test_missing_path_and_binary_file(tree: pathlib.Path, invoke: Invoke) -> None:
    with pytest.raises(ToolFailure, match="grep: no such file or directory: 'nope'"):
        invoke("grep", pattern="x", path="nope")
    with pytest.raises(ToolFailure, match="is a binary file"):
        invoke("grep", pattern="x", path="image.bin")


def test_bad_params(invoke: Invoke) -> None:
    with pytest.raises(ToolFailure, match="max_results must be >= 1"):
        invoke("grep", pattern="x", max_results=0)
    with pytest.raises(ToolFailure, match=r"argument 'ignore_case' must be bool, not int"):
        invoke("grep", pattern="x", ignore_case=1)
