"""The staging root's watch: a call skips the root's check only while inotify has seen
nothing the check looks at change (host/disk/dir_watch.py), and a change a script makes is
still met by the check on the next call."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import enabled_config

from lemon_exec import ExecuteCode, SessionScope
from lemon_exec.host.disk.dir_watch import DirWatch
from lemon_exec.host.kernels.engine import Engine

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "work").mkdir()
    (tmp_path / "owner").write_text("{}")
    return tmp_path


@pytest.fixture
def watch() -> Iterator[DirWatch]:
    opened = DirWatch.open()
    assert opened is not None, "inotify is missing: every call would check its root"
    yield opened
    opened.close()


def _dirs(tree: Path) -> dict[Path, frozenset[str]]:
    return {tree: frozenset({"owner", "work"}), tree / "work": frozenset()}


def _checked(watch: DirWatch, tree: Path) -> bool:
    with watch.checking(_dirs(tree)):
        pass
    return watch.intact()


def test_intact_only_after_a_check_passed(watch: DirWatch, tree: Path) -> None:
    assert not watch.intact()
    with pytest.raises(OSError), watch.checking(_dirs(tree)):
        raise OSError("the check failed")
    assert not watch.intact()
    assert _checked(watch, tree)


def test_a_hosts_own_traffic_leaves_it_intact(watch: DirWatch, tree: Path) -> None:
    """Workspaces made and removed, the index rewritten by rename: none of it is checked."""
    assert _checked(watch, tree)
    for n in range(3):
        run = tree / "work" / f"run-{n}"
        run.mkdir(mode=0o700)
        (run / "script.py").write_text("print(1)")
        shutil.rmtree(run)
        (tree / ".kernels.json.tmp").write_text("[]")
        os.replace(tree / ".kernels.json.tmp", tree / "kernels.json")
    assert watch.intact()


def _symlinked(tree: Path) -> None:
    shutil.rmtree(tree / "work")
    (tree / "work").symlink_to(tree)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda t: os.chmod(t / "work", 0o755), id="chmod-subdir"),
        pytest.param(lambda t: os.chmod(t, 0o755), id="chmod-root"),
        pytest.param(lambda t: (t / "owner").unlink(), id="marker-removed"),
        pytest.param(lambda t: os.rename(t / "owner", t / "x"), id="marker-renamed"),
        pytest.param(lambda t: shutil.rmtree(t / "work"), id="subdir-removed"),
        pytest.param(lambda t: os.rename(t / "work", t / "w2"), id="subdir-renamed"),
        pytest.param(_symlinked, id="symlinked"),
    ],
)
def test_any_change_the_check_looks_at_means_check_again(
    watch: DirWatch, tree: Path, change: object
) -> None:
    assert _checked(watch, tree)
    change(tree)  # type: ignore[operator]
    assert not watch.intact()
    assert not watch.intact()  # it stays so until a check passes


def test_a_directory_made_anew_is_watched_anew(watch: DirWatch, tree: Path) -> None:
    assert _checked(watch, tree)
    shutil.rmtree(tree / "work")
    with watch.checking(_dirs(tree)):
        (tree / "work").mkdir()  # what the check mends is not yet "as the check left it"
    assert not watch.intact()
    assert _checked(watch, tree)  # the next check finds it stable
    os.chmod(tree / "work", 0o755)  # and the new directory is the one watched
    assert not watch.intact()


def test_a_directory_removed_again_and_again_leaves_no_trail(watch: DirWatch, tree: Path) -> None:
    """A script may remove the root on every call: each removed directory's watch is
    forgotten once the kernel drops it, so the bookkeeping does not grow."""
    for _ in range(3):
        assert _checked(watch, tree)
    settled = len(watch._names)
    for _ in range(20):
        shutil.rmtree(tree / "work")
        (tree / "work").mkdir()
        assert not watch.intact()
        with watch.checking(_dirs(tree)):
            pass
    assert _checked(watch, tree)
    assert len(watch._names) == settled == 2


def test_watches_share_one_instance_and_keep_apart(tree: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    first, second = DirWatch.open(), DirWatch.open()
    assert first is not None and second is not None
    try:
        assert _checked(first, tree)
        with second.checking({other: frozenset(), tree: frozenset()}):
            pass
        assert second.intact()
        (tree / "owner").unlink()  # a name only the first one guards
        assert not first.intact() and second.intact()
        second.close()
        assert not second.intact()  # closed: never intact again
    finally:
        first.close()
        second.close()


def test_calls_skip_the_check_until_a_script_changes_the_root(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    checks: list[int] = []
    ensure = Engine.ensure_staging

    def counted(self: Engine) -> None:
        checks.append(1)
        ensure(self)

    monkeypatch.setattr(Engine, "ensure_staging", counted)
    scope = SessionScope("watch", "agent", str(tmp_path))
    with ExecuteCode(enabled_config(kernel_mode="session")) as tool:
        for n in range(2):
            assert tool.run_sync(f"print({n})", scope=scope).content == f"{n}\n"
        checks.clear()
        for n in range(3):
            assert tool.run_sync(f"print({n})", scope=scope).content == f"{n}\n"
        assert checks == [], "an unchanged root was checked again"

        root = tool.diagnostics.staging_root
        assert root is not None
        # A script loosens the root's mode: the next call checks, and fails closed.
        loosened = tool.run_sync(f"import os\nos.chmod({str(root)!r}, 0o755)", scope=scope)
        assert loosened.ok, loosened.content
        refused = tool.run_sync("print('must not run')", scope=scope)
        assert "mode 0755" in refused.content and "must not run" not in refused.content
        os.chmod(root, 0o700)
        assert tool.run_sync("print('again')", scope=scope).content == "again\n"

        # A script removes the kernels' PYTHONPATH link: made again before the next start.
        link = root / "pypath" / "lemon_exec"
        assert tool.run_sync(f"import os\nos.unlink({str(link)!r})", scope=scope).ok
        with ExecuteCode(enabled_config(kernel_mode="per_call")) as other:
            assert other.run_sync("print(1)").ok  # another host: its own root
        assert not link.exists()
        after = tool.run_sync("print('after')", scope=SessionScope("new", "agent", str(tmp_path)))
        assert after.content == "after\n", after.content
        assert link.is_symlink()


def test_a_call_that_could_skip_the_check_keeps_its_place_behind_one_checking(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Admission is FIFO: a call arriving while an earlier call's check is in flight (slow
    here) waits for it, though the root is intact by the time it asks."""
    ensure = Engine.ensure_staging

    def slow(self: Engine) -> None:
        time.sleep(0.3)
        ensure(self)

    monkeypatch.setattr(Engine, "ensure_staging", slow)
    order = tmp_path / "order"
    scripts = [f"open({str(order)!r}, 'a').write('{n} ')" for n in ("one", "two")]

    async def body() -> None:
        async with ExecuteCode(enabled_config(max_concurrent_per_call=1)) as tool:
            assert (await tool.run("pass")).ok  # the host exists; its root is checked
            engine = tool._runner.host.engine  # type: ignore[union-attr]
            monkeypatch.setattr(engine, "staging_intact", lambda: False)
            first = await tool.start(scripts[0])  # its check sleeps on the disk worker
            await asyncio.sleep(0.1)
            monkeypatch.setattr(engine, "staging_intact", lambda: True)
            second = await tool.start(scripts[1])  # could skip: must not overtake
            for job in (first, second):
                assert (await job.wait()).ok
        assert order.read_text() == "one two "

    asyncio.run(body())
