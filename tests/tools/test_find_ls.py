"""The find and ls tools, on real trees in tmp_path."""

from __future__ import annotations

import os
import pathlib

import pytest

from lemon_exec.errors import ToolFailure
from lemon_exec.tools import _find, _ls

from .conftest import Invoke

pytestmark = pytest.mark.timeout(10)


@pytest.fixture
def tree(tmp_path: pathlib.Path) -> pathlib.Path:
    for rel in [
        "a.py",
        "b.txt",
        "src/c.py",
        "src/pkg/d.py",
        "src/pkg/e.txt",
        "tests/test_a.py",
        ".github/workflows/ci.yml",
        ".hidden.py",
    ]:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("x\n")
    return tmp_path


# -- find ----------------------------------------------------------------------------------------


def test_bare_name_pattern_matches_at_any_depth(tree: pathlib.Path, invoke: Invoke) -> None:
    assert invoke("find", pattern="*.py").splitlines() == [
        ".hidden.py",
        "a.py",
        "src/c.py",
        "src/pkg/d.py",
        "tests/test_a.py",
    ]


def test_path_patterns_and_double_star(tree: pathlib.Path, invoke: Invoke) -> None:
    assert invoke("find", pattern="src/*.py") == "src/c.py"
    assert invoke("find", pattern="src/**/*.py").splitlines() == ["src/c.py", "src/pkg/d.py"]
    assert invoke("find", pattern="**/pkg/*").splitlines() == ["src/pkg/d.py", "src/pkg/e.txt"]
    assert invoke("find", pattern="./src/pkg/d.py") == "src/pkg/d.py"
    assert invoke("find", pattern="nope/**/*.py") == ""


def test_directories_get_a_trailing_slash(tree: pathlib.Path, invoke: Invoke) -> None:
    assert invoke("find", pattern="pkg") == "src/pkg/"
    assert invoke("find", pattern="src/**").splitlines() == [
        "src/c.py",
        "src/pkg/",
        "src/pkg/d.py",
        "src/pkg/e.txt",
    ]


def test_results_are_joined_to_the_given_path(tree: pathlib.Path, invoke: Invoke) -> None:
    assert invoke("find", pattern="*.py", path="src").splitlines() == ["src/c.py", "src/pkg/d.py"]
    absolute = str(tree / "src")
    assert invoke("find", pattern="d.py", path=absolute) == f"{absolute}/pkg/d.py"


def test_hidden_dirs_only_when_named(tree: pathlib.Path, invoke: Invoke) -> None:
    assert invoke("find", pattern="*.yml") == ""
    assert invoke("find", pattern=".github/**/*.yml") == ".github/workflows/ci.yml"


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")
def test_symlinked_dirs_are_listed_but_not_entered(tree: pathlib.Path, invoke: Invoke) -> None:
    os.symlink(tree / "src", tree / "src" / "pkg" / "loop")
    out = invoke("find", pattern="*").splitlines()
    assert "src/pkg/loop/" in out
    assert not any(line.startswith("src/pkg/loop/") and line != "src/pkg/loop/" for line in out)


def test_find_cap(
    tmp_path: pathlib.Path, invoke_here: Invoke, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_find, "MAX_RESULTS", 5)
    for i in range(8):
        (tmp_path / f"f{i}.txt").write_text("")
    out = invoke_here("find", pattern="*.txt").splitlines()
    assert out == [f"f{i}.txt" for i in range(5)] + [
        "[truncated: showing 5 of 8 matches; narrow the pattern]"
    ]


def test_find_walk_limit(
    tmp_path: pathlib.Path, invoke_here: Invoke, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_find, "MAX_WALK_ENTRIES", 3)
    for i in range(8):
        (tmp_path / f"f{i}.txt").write_text("")
    out = invoke_here("find", pattern="*.txt").splitlines()
    assert out[:3] == ["f0.txt", "f1.txt", "f2.txt"]
    assert out[3].startswith("[truncated: stopped after visiting 3 entries")


def test_find_errors(tree: pathlib.Path, invoke: Invoke) -> None:
    with pytest.raises(
        ToolFailure, match="find: invalid pattern '/etc/\\*': pattern must be relative"
    ):
        invoke("find", pattern="/etc/*")
    with pytest.raises(ToolFailure, match="is not a directory"):
        invoke("find", pattern="*", path="a.py")
    with pytest.raises(ToolFailure, match="no such file or directory: 'missing'"):
        invoke("find", pattern="*", path="missing")


# -- ls ------------------------------------------------------------------------------------------


def test_ls_sorted_with_dir_slashes_and_hidden(tree: pathlib.Path, invoke: Invoke) -> None:
    assert invoke("ls").splitlines() == [
        ".github/",
        ".hidden.py",
        "a.py",
        "b.txt",
        "src/",
        "tests/",
    ]
    assert invoke("ls", path="src").splitlines() == ["c.py", "pkg/"]
    assert invoke("ls", path=str(tree / "src" / "pkg")).splitlines() == ["d.py", "e.txt"]


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")
def test_ls_symlink_to_dir_has_a_slash(tree: pathlib.Path, invoke: Invoke) -> None:
    os.symlink(tree / "src", tree / "tests" / "src-link")
    assert invoke("ls", path="tests").splitlines() == ["src-link/", "test_a.py"]


def test_ls_empty_dir(tmp_path: pathlib.Path, invoke: Invoke) -> None:
    (tmp_path / "empty").mkdir()
    assert invoke("ls", path="empty") == ""


def test_ls_cap(tmp_path: pathlib.Path, invoke: Invoke) -> None:
    for i in range(_ls.MAX_ENTRIES + 5):
        (tmp_path / f"f{i:05d}").write_text("")
    out = invoke("ls").splitlines()
    assert len(out) == _ls.MAX_ENTRIES + 1
    assert out[0] == "f00000"
    assert out[-1] == f"[truncated: showing {_ls.MAX_ENTRIES} of {_ls.MAX_ENTRIES + 5} entries]"


def test_ls_errors(tree: pathlib.Path, invoke: Invoke) -> None:
    with pytest.raises(ToolFailure, match=r"ls: 'a.py' .*is not a directory; use read\('a.py'\)"):
        invoke("ls", path="a.py")
    with pytest.raises(ToolFailure, match="ls: no such file or directory: 'nope'"):
        invoke("ls", path="nope")
