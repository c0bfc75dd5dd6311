"""Smoke run of the built wheel on every Python 3.11+ interpreter this machine has.

For each interpreter: a fresh venv, the wheel installed with its ``mcp`` and ``notebook``
extras, then a script through ``lemon-exec run``, a ``tools/call`` through the MCP server
over stdio (the official SDK client, in that venv), and a scenario notebook through
``lemon-exec notebook run --check``. Run by ``.ci/run`` after the tests:

    python .ci/smoke.py [--work DIR]

Exit status 1 when any interpreter fails (each is tried); 1 too when none is found.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MIN_VERSION = (3, 11)

_SCRIPT = "import sys\nnotify('smoke')\ntext(f'ok {sys.version_info[0]}.{sys.version_info[1]}')\n"
_MCP_CLIENT = """
import anyio, os, sys
from mcp import Client, StdioServerParameters

async def main() -> None:
    exe = os.path.join(os.path.dirname(sys.executable), "lemon-exec")
    params = StdioServerParameters(command=exe, args=["mcp"], env=dict(os.environ))
    async with Client(params) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        assert "execute_code" in names, names
        result = await client.call_tool("execute_code", {"script": "text(6 * 7)"})
        text = result.content[0].text
        assert text == "Script result (text()):\\n42", text
        print("mcp ok", names)

anyio.run(main)
"""


def interpreters() -> list[Path]:
    """Distinct Python 3.11+ interpreters: on PATH, Debian's, and pyenv's."""
    found: list[Path] = []
    candidates = [shutil.which(f"python3.{minor}") for minor in range(11, 20)]
    candidates += glob.glob("/usr/bin/python3.1[1-9]") + glob.glob("/usr/local/bin/python3.1[1-9]")
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += sorted(glob.glob(str(root / "versions" / "*" / "bin" / "python3")))
    seen: set[str] = set()
    for candidate in candidates:
        if not candidate:
            continue
        probed = _probe(candidate)
        if probed is None or probed[0] < MIN_VERSION or probed[1] in seen:
            continue
        seen.add(probed[1])
        found.append(Path(probed[1]))
    return found


def _probe(python: str) -> tuple[tuple[int, int], str] | None:
    """((major, minor), the real executable) of ``python`` (a pyenv shim names another), or
    None when it cannot run or has no venv module."""
    code = "import os, sys, venv; print(*sys.version_info[:2], os.path.realpath(sys.executable))"
    try:
        out = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=30, check=True
        ).stdout.split(maxsplit=2)
    except (OSError, subprocess.SubprocessError):
        return None
    return (int(out[0]), int(out[1])), out[2].strip()


def build_wheel(out: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "-w", str(out), str(REPO)],
        check=True,
    )
    [wheel] = out.glob("lemon_exec-*.whl")
    return wheel


def smoke(python: Path, wheel: Path, work: Path) -> None:
    venv = work / "venv"
    subprocess.run([str(python), "-m", "venv", str(venv)], check=True)
    bin_ = venv / "bin"
    env = {**os.environ, "PATH": f"{bin_}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)
    run = lambda *argv, **kw: subprocess.run(  # noqa: E731
        [str(a) for a in argv], check=True, env=env, cwd=work, timeout=900, **kw
    )
    pip = [bin_ / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    run(*pip, f"{wheel}[mcp,notebook]", stderr=subprocess.DEVNULL)
    script = work / "smoke.py"
    script.write_text(_SCRIPT)
    done = run(bin_ / "lemon-exec", "run", script, capture_output=True, text=True)
    major_minor = f"{python_version(python)[0]}.{python_version(python)[1]}"
    assert f"ok {major_minor}" in done.stdout, done.stdout + done.stderr
    print(f"  run ok: {done.stdout.strip().splitlines()[-1]}")
    client = work / "mcp_client.py"
    client.write_text(_MCP_CLIENT)
    done = run(bin_ / "python", client, capture_output=True, text=True)
    print(f"  {done.stdout.strip()}")
    # Scenarios without tracebacks: their caret lines differ between Python versions.
    for name in ("02_reset.ipynb", "04_notify.ipynb"):
        run(bin_ / "lemon-exec", "notebook", "run", "--check", "-q", REPO / "notebooks" / name)
        print(f"  notebook ok: {name} matches its stored outputs")


def python_version(python: Path) -> tuple[int, int]:
    probed = _probe(str(python))
    assert probed is not None
    return probed[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, help="keep the venvs here (default: a temp dir)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="lemon-smoke-"))
    pythons = interpreters()
    if not pythons:
        print("smoke: no Python 3.11+ interpreter found", file=sys.stderr)
        return 1
    wheel = build_wheel(work / "dist")
    failed: list[str] = []
    for python in pythons:
        version = python_version(python)
        print(f"== smoke on Python {version[0]}.{version[1]} ({python})", flush=True)
        started = time.monotonic()
        here = work / f"py{version[0]}{version[1]}-{len(failed)}-{python.parent.parent.name}"
        here.mkdir(parents=True, exist_ok=True)
        try:
            smoke(python, wheel, here)
        except (subprocess.SubprocessError, AssertionError, OSError) as exc:
            detail = getattr(exc, "stderr", None) or getattr(exc, "output", None) or ""
            print(f"  FAILED: {exc}\n{detail}", file=sys.stderr, flush=True)
            failed.append(str(python))
        print(f"  ({time.monotonic() - started:.0f} s)", flush=True)
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    if failed:
        print(f"smoke failed on: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"smoke passed on {len(pythons)} interpreters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
