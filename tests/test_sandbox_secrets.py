"""The sandbox's defaults keep what people actually keep out of a script's reach (issue 25
item 9): secret-looking environment variables are not in a sandboxed kernel's environment,
and the home directory is hidden (but for the working directory and ``sandbox_visible``),
so credential files nobody listed, and those created after the kernel started, are not
readable. Real kernels under bwrap, forked from the template and started cold.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import enabled_config

from lemon_exec import ExecuteCode, SessionScope

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow, pytest.mark.kernel]

SECRET_ENV = {
    "GITHUB_TOKEN": "ghp_planted0000000000000000000000000000",
    "AWS_ACCESS_KEY_ID": "AKIAPLANTED000000000",
    "AWS_SECRET_ACCESS_KEY": "planted/aws/secret/access/key/000000000",
    "LEMON_EXEC_MCP_TOKEN": "planted-mcp-token",
    "LEMON_EXECUTE_CODE_GATEWAY_AUTH_TOKEN": "planted-gateway-token",
    "OPENAI_API_KEY": "sk-planted-openai",
    "DB_PASSWORD": "planted-db-password",
    "HF_TOKEN": "hf_planted",
}
#: Not secrets: kept.
PLAIN_ENV = {"LSS_PLAIN_SETTING": "plain-value", "TOKENIZERS_PARALLELISM": "false"}
CREDENTIAL_FILES = [
    ".npmrc",
    ".config/gh/hosts.yml",
    ".cache/huggingface/token",
    ".config/git/credentials",
]
LATE_FILES = [".config/late-tool/credentials.json", ".late-token"]

PROBE = """
import json, os
found = {}
for name in NAMES:
    try:
        found[name] = open(os.path.expanduser('~/' + name)).read()
    except OSError as exc:
        found[name] = type(exc).__name__
environ = open('/proc/self/environ', 'rb').read().decode(errors='replace')
print('RESULT', json.dumps({'files': found, 'env': dict(os.environ), 'proc_env': environ}))
"""


def probe(names: list[str]) -> str:
    return f"NAMES = {names!r}\n" + PROBE


def parse(out: str) -> dict[str, Any]:
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return result


@pytest.fixture
def home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A HOME with planted credentials, a project inside it (the cwd), secrets in the env."""
    root = Path(tempfile.mkdtemp(prefix="lss-", dir="/var/tmp"))
    home = root / "home"
    for name in CREDENTIAL_FILES:
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text("planted-credential\n")
    (home / "project").mkdir()
    (home / "project" / "notes.txt").write_text("project notes\n")
    (home / ".local" / "lib").mkdir(parents=True)
    (home / ".local" / "lib" / "site.txt").write_text("user site\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(home / "project")
    for key, value in {**SECRET_ENV, **PLAIN_ENV}.items():
        monkeypatch.setenv(key, value)
    try:
        yield home
    finally:
        shutil.rmtree(root, ignore_errors=True)


def check_nothing_leaks(result: dict[str, Any]) -> None:
    env, proc_env = result["env"], result["proc_env"]
    for key, value in SECRET_ENV.items():
        assert key not in env, key
        assert value not in proc_env and value not in json.dumps(env), key
    for key, value in PLAIN_ENV.items():
        assert env.get(key) == value, key
    for name, got in result["files"].items():
        assert got in ("FileNotFoundError", "PermissionError"), (name, got)


def wait_forked(tool: ExecuteCode, scope: SessionScope | None) -> SessionScope | None:
    """Until the kernel comes from the sandboxed template; the scope it came in."""
    deadline = time.monotonic() + 60
    for n in range(1000):
        this = SessionScope(f"{scope.session_id}-{n}") if scope is not None else None
        out = tool.run_sync(
            "import os\nprint(open('/proc/%d/cmdline' % os.getppid(), 'rb').read())", scope=this
        ).content
        if "lemon_exec.template.server" in out:
            return this
        assert time.monotonic() < deadline, out
        time.sleep(0.2)
    raise AssertionError("unreachable")


@pytest.mark.parametrize("forked", [True, False], ids=["forked", "cold"])
def test_a_session_kernel_sees_no_secret_env_and_no_credential_file(
    home: Path, forked: bool
) -> None:
    tool = ExecuteCode(enabled_config(sandbox="bwrap", kernel_mode="session", fork_server=forked))
    try:
        scope: SessionScope | None = SessionScope("lss")
        if forked:
            scope = wait_forked(tool, scope)
        first = tool.run_sync(probe(CREDENTIAL_FILES), scope=scope).content
        check_nothing_leaks(parse(first))
        # Credentials created after the kernel started are not readable either.
        for name in LATE_FILES:
            (home / name).parent.mkdir(parents=True, exist_ok=True)
            (home / name).write_text("planted-later\n")
        later = tool.run_sync(probe(LATE_FILES), scope=scope).content
        check_nothing_leaks(parse(later))
        # The working directory (inside HOME) and sandbox_visible's default stay visible.
        seen = tool.run_sync(
            "import os\n"
            "print(open('notes.txt').read().strip(), os.getcwd())\n"
            "open('written.txt', 'w').write('ok')\n"
            "print(open(os.path.expanduser('~/.local/lib/site.txt')).read().strip())\n"
            "try:\n"
            "    open(os.path.expanduser('~/.local/lib/x'), 'w')\n"
            "except OSError as exc:\n"
            "    print('VISIBLE-RO', type(exc).__name__)\n",
            scope=scope,
        ).content
        assert f"project notes {home / 'project'}" in seen, seen
        assert "user site" in seen and "VISIBLE-RO" in seen, seen
        assert (home / "project" / "written.txt").read_text() == "ok"
    finally:
        tool.close()


def test_a_warm_spare_sees_no_secret_env_and_the_allowlist_is_kept(home: Path) -> None:
    tool = ExecuteCode(
        enabled_config(
            sandbox="bwrap",
            warm_kernels=1,
            sandbox_env_allowed=["hf_token"],  # any case
        )
    )
    try:
        wait_forked(tool, None)
        result = parse(tool.run_sync(probe(CREDENTIAL_FILES)).content)
        assert result["env"].get("HF_TOKEN") == SECRET_ENV["HF_TOKEN"]
        result["env"].pop("HF_TOKEN")
        result["proc_env"] = result["proc_env"].replace(SECRET_ENV["HF_TOKEN"], "")
        check_nothing_leaks({**result, "env": result["env"]})
    finally:
        tool.close()


def test_hidden_env_patterns_are_configurable() -> None:
    from lemon_exec.host.kernels import sandbox as sandboxes

    config = enabled_config(sandbox_env_hidden=["*_TOKEN", "MY_*"], sandbox_env_allowed=["CI_*"])
    spec = sandboxes.spec_from_config(config)
    environ = {
        "GITHUB_TOKEN": "x",
        "CI_JOB_TOKEN": "x",
        "my_thing": "x",
        "AWS_SECRET_ACCESS_KEY": "x",  # not matched by this list
        "LEMON_EXEC_HOST_LINK": "x",  # the kernel's own: never removed
    }
    assert sandboxes.hidden_env(spec, environ) == ["GITHUB_TOKEN", "my_thing"]
    default = sandboxes.spec_from_config(enabled_config())
    names = sandboxes.hidden_env(default, {**SECRET_ENV, **PLAIN_ENV, "PATH": "/bin"})
    assert names == sorted(SECRET_ENV)


def test_a_home_of_root_hides_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    """HOME=/ (some containers): hiding ~ must not put a tmpfs over the whole view."""
    from lemon_exec.host.kernels import sandbox as sandboxes

    monkeypatch.setenv("HOME", "/")
    spec = sandboxes.spec_from_config(enabled_config(sandbox="bwrap"))
    argv = sandboxes.kernel_argv_prefix(
        spec,
        bwrap="bwrap",
        cwd=Path("/var/tmp"),
        kernel_dir=Path("/tmp/lemon-exec.0/lemon-exec-x/k"),
        staging_root=Path("/tmp/lemon-exec-x"),
        pypath=Path("/tmp/lemon-exec-x/pypath"),
    )
    tmpfs = [argv[i + 1] for i, word in enumerate(argv) if word == "--tmpfs"]
    assert "/" not in tmpfs, tmpfs
