"""The read tool, on real files in tmp_path."""

from __future__ import annotations

import os
import pathlib

import pytest

from lemon_exec.errors import ToolFailure
from lemon_exec.tools import _read

from .conftest import Invoke

pytestmark = pytest.mark.timeout(10)


def test_reads_a_relative_path_against_cwd(tmp_path: pathlib.Path, invoke: Invoke) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("one\ntwo\n")
    assert invoke("read", path="sub/a.txt") == "one\ntwo\n"
    assert invoke("read", path=str(tmp_path / "sub" / "a.txt")) == "one\ntwo\n"


def test_tilde_expands(
    tmp_path: pathlib.Path, invoke: Invoke, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "notes.txt").write_text("from home\n")
    monkeypatch.setenv("HOME", str(home))
    assert invoke("read", path="~/notes.txt") == "from home\n"


def test_offset_and_limit(tmp_path: pathlib.Path, invoke: Invoke) -> None:
    (tmp_path / "f.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    out = invoke("read", path="f.txt", offset=3, limit=2)
    assert out == (
        "line 3\nline 4\n[truncated: showing lines 3-4; continue with read('f.txt', offset=5)]"
    )
    assert invoke("read", path="f.txt", offset=9) == "line 9\nline 10\n"
    assert invoke("read", path="f.txt", offset=9, limit=2) == "line 9\nline 10\n"  # nothing cut
    assert invoke("read", path="f.txt", offset=11) == ""


def test_default_line_limit(tmp_path: pathlib.Path, invoke: Invoke) -> None:
    (tmp_path / "long.txt").write_text("".join(f"{i}\n" for i in range(1, 2501)))
    out = invoke("read", path="long.txt")
    lines = out.splitlines()
    assert lines[0] == "1" and lines[_read.DEFAULT_LIMIT - 1] == str(_read.DEFAULT_LIMIT)
    assert len(lines) == _read.DEFAULT_LIMIT + 1
    assert (
        lines[-1]
        == "[truncated: showing lines 1-2000; continue with read('long.txt', offset=2001)]"
    )


def test_byte_cap(tmp_path: pathlib.Path, invoke: Invoke) -> None:
    line = "x" * 99 + "\n"  # 100 bytes
    (tmp_path / "big.txt").write_text(line * 5000)  # 500 kB
    out = invoke("read", path="big.txt", limit=5000)
    body, note = out.rsplit("\n", 1)[0], out.rsplit("\n", 1)[1]
    assert len(body.encode()) <= _read.MAX_BYTES
    full_lines = _read.MAX_BYTES // 100
    assert body.count("\n") == full_lines - 1
    assert note == (
        f"[truncated: output capped at {_read.MAX_BYTES} bytes after line {full_lines}; "
        f"continue with read('big.txt', offset={full_lines + 1})]"
    )


def test_single_line_longer_than_the_cap(tmp_path: pathlib.Path, invoke: Invoke) -> None:
    (tmp_path / "min.js").write_text("a" * (_read.MAX_BYTES + 10) + "\nnext\n")
    out = invoke("read", path="min.js")
    head, note = out.split("\n", 1)
    assert head == "a" * _read.MAX_BYTES
    assert note.startswith("[truncated: line 1 is longer than")
    assert "offset=2" in note
    assert invoke("read", path="min.js", offset=2) == "next\n"


def test_invalid_utf8_is_replaced(tmp_path: pathlib.Path, invoke: Invoke) -> None:
    (tmp_path / "latin.txt").write_bytes(b"caf\xe9\n")
    assert invoke("read", path="latin.txt") == "caf\ufffd\n"


def test_binary_file(tmp_path: pathlib.Path, invoke: Invoke) -> None:
    (tmp_path / "blob.bin").write_bytes(b"abc\0def")
    with pytest.raises(ToolFailure, match=r"'blob.bin' .* is a binary file"):
        invoke("read", path="blob.bin")


def test_nul_after_the_sniff_window_is_not_binary(tmp_path: pathlib.Path, invoke: Invoke) -> None:
    (tmp_path / "late.txt").write_bytes(b"a" * 9000 + b"\0")
    assert invoke("read", path="late.txt").startswith("aaa")


def test_missing_file_names_the_path(tmp_path: pathlib.Path, invoke: Invoke) -> None:
    with pytest.raises(ToolFailure) as info:
        invoke("read", path="nope.txt")
    msg = str(info.value)
    assert msg.startswith("read: no such file or directory: 'nope.txt'")
    assert str(tmp_path / "nope.txt") in msg


def test_directory_suggests_ls(tmp_path: pathlib.Path, invoke: Invoke) -> None:
    (tmp_path / "d").mkdir()
    with pytest.raises(ToolFailure, match=r"is a directory; use ls\('d'\)"):
        invoke("read", path="d")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")
def test_fifo_is_refused_not_blocked_on(tmp_path: pathlib.Path, invoke: Invoke) -> None:
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(ToolFailure, match="not a regular file"):
        invoke("read", path="pipe")


@pytest.mark.parametrize(
    ("params", "message"),
    [({"offset": 0}, "offset must be >= 1"), ({"limit": 0}, "limit must be >= 1")],
)
def test_bad_offset_and_limit(
    tmp_path: pathlib.Path, invoke: Invoke, params: dict, message: str
) -> None:
    (tmp_path / "f.txt").write_text("x\n")
    with pytest.raises(ToolFailure, match=message):
        invoke("read", path="f.txt", **params)


def test_wrong_types_are_rejected_by_the_host(invoke: Invoke) -> None:
    with pytest.raises(ToolFailure, match=r"read\(\) argument 'limit' must be int, not str"):
        invoke("read", path="f.txt", limit="10")
    with pytest.raises(ToolFailure, match=r"read\(\) got an unexpected keyword argument 'x'"):
        invoke("read", path="f.txt", x=1)
    with pytest.raises(
        ToolFailure, match=r"read\(\) missing 1 required positional argument: 'path'"
    ):
        invoke("read")


# -- a symlink: the policy hook sees where it leads, and the tool reads exactly that ----------


def test_policy_sees_a_symlinks_target_and_read_opens_it(tmp_path: pathlib.Path) -> None:
    import asyncio

    from lemon_exec.tools import PolicyDecision, ToolCall, ToolHost, default_registry

    secrets = tmp_path / "home" / ".ssh"
    secrets.mkdir(parents=True)
    (secrets / "id_rsa").write_text("KEY\n")
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("notes\n")
    (work / "innocent.txt").symlink_to(secrets / "id_rsa")
    (work / "dir-link").symlink_to(secrets)
    seen: list[tuple[str, pathlib.Path | None]] = []

    def policy(call: ToolCall) -> PolicyDecision:
        seen.append((call.params["path"], call.resolved_path))
        if call.resolved_path is not None and secrets in call.resolved_path.parents:
            return PolicyDecision.deny("no keys")
        return PolicyDecision.allow()

    host = ToolHost(default_registry(), policy=policy)

    def read(path: str) -> str:
        call = ToolCall(tool="read", params={"path": path}, cwd=work, call_id=1)
        return asyncio.run(host.invoke(call))

    assert read("notes.txt") == "notes\n"
    for name in ("innocent.txt", "dir-link/id_rsa", str(work / "innocent.txt")):
        with pytest.raises(ToolFailure, match="denied by policy: no keys"):
            read(name)
    # The name as the script gave it, and the resolved target, side by side.
    assert seen[0] == ("notes.txt", work / "notes.txt")
    assert seen[1] == ("innocent.txt", secrets / "id_rsa")
    assert seen[2] == ("dir-link/id_rsa", secrets / "id_rsa")


def test_read_opens_the_path_the_hooks_approved(tmp_path: pathlib.Path) -> None:
    """A link swapped between the check and the open changes nothing: read opens the
    resolved path the hooks saw, never the name again."""
    import asyncio

    from lemon_exec.tools import PolicyDecision, ToolCall, ToolHost, default_registry

    (tmp_path / "allowed.txt").write_text("allowed\n")
    (tmp_path / "secret.txt").write_text("secret\n")
    link = tmp_path / "link.txt"
    link.symlink_to(tmp_path / "allowed.txt")

    def policy(call: ToolCall) -> PolicyDecision:
        assert call.resolved_path == tmp_path / "allowed.txt"
        link.unlink()  # the script swaps the link once the check has passed
        link.symlink_to(tmp_path / "secret.txt")
        return PolicyDecision.allow()

    host = ToolHost(default_registry(), policy=policy)
    call = ToolCall(tool="read", params={"path": "link.txt"}, cwd=tmp_path, call_id=1)
    assert asyncio.run(host.invoke(call)) == "allowed\n"
