"""``lemon-exec kernelspec install`` and ``python -m lemon_exec.kernel install``.

The installed kernel.json must name this interpreter by absolute path and start the lemon
kernel, so that a Jupyter from *another* environment (one without lemon_exec or ipykernel)
runs a kernel in which ``text`` is defined. That Jupyter is a second venv made by the test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import lemon_exec
from lemon_exec.host.kernels.kernelspec import kernel_json

pytestmark = pytest.mark.timeout(120)

REPO = Path(lemon_exec.__file__).resolve().parents[1]
PYTHON = os.path.abspath(sys.executable)
ARGV_TAIL = ["-m", "lemon_exec.kernel", "-f", "{connection_file}"]


def _cli() -> list[str]:
    script = Path(PYTHON).with_name("lemon-exec")
    return [str(script)] if script.exists() else [PYTHON, "-m", "lemon_exec"]


def _env(tmp_path: Path) -> dict[str, str]:
    # Jupyter's per-user and runtime directories in tmp_path: --user must not touch $HOME.
    env = dict(os.environ)
    env["JUPYTER_DATA_DIR"] = str(tmp_path / "user-data")
    env["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "runtime")
    env.pop("JUPYTER_PATH", None)
    return env


def _run(argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, env=_env(tmp_path), capture_output=True, text=True, timeout=60, check=False
    )


def _spec(directory: Path) -> dict[str, object]:
    return json.loads((directory / "kernel.json").read_text())


def _is_this_python(path: object) -> bool:
    """``path`` is absolute and is this venv's interpreter (``python`` or ``python3``)."""
    assert isinstance(path, str) and os.path.isabs(path)
    return os.path.dirname(path) == os.path.dirname(PYTHON) and os.path.samefile(path, PYTHON)


def test_cli_install_writes_an_absolute_interpreter_and_the_lemon_kernel(tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"
    done = _run(
        [*_cli(), "kernelspec", "install", "--prefix", str(prefix), "--name", "lemon-t",
         "--display-name", "Lemon (test)"],
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    installed = prefix / "share" / "jupyter" / "kernels" / "lemon-t"
    assert str(installed) in done.stdout
    spec = _spec(installed)
    assert isinstance(spec["argv"], list)
    assert _is_this_python(spec["argv"][0])
    assert spec["argv"][1:] == ARGV_TAIL
    assert spec["display_name"] == "Lemon (test)"
    assert spec["language"] == "python"
    assert spec["interrupt_mode"] == "signal"
    assert (installed / "logo-64x64.png").exists()


def test_module_install_writes_the_same_spec(tmp_path: Path) -> None:
    # It used to be ipykernel's installer: a plain ipykernel spec, without text().
    prefix = tmp_path / "prefix"
    done = _run([PYTHON, "-m", "lemon_exec.kernel", "install", "--prefix", str(prefix)], tmp_path)
    assert done.returncode == 0, done.stderr
    spec = _spec(prefix / "share" / "jupyter" / "kernels" / "lemon-python")
    assert spec == kernel_json(PYTHON)
    assert spec["display_name"] == "Python 3 (lemon_exec)"


def test_user_install_goes_to_the_jupyter_data_dir(tmp_path: Path) -> None:
    done = _run([*_cli(), "kernelspec", "install", "--user"], tmp_path)
    assert done.returncode == 0, done.stderr
    argv = _spec(tmp_path / "user-data" / "kernels" / "lemon-python")["argv"]
    assert isinstance(argv, list)
    assert _is_this_python(argv[0])
    assert argv[1:] == ARGV_TAIL


def test_bad_name_and_conflicting_places_are_usage_errors(tmp_path: Path) -> None:
    bad = _run([*_cli(), "kernelspec", "install", "--user", "--name", "no spaces"], tmp_path)
    assert bad.returncode == 2
    assert "Invalid kernel name 'no spaces'" in bad.stderr
    both = _run([*_cli(), "kernelspec", "install", "--user", "--prefix", "/x"], tmp_path)
    assert both.returncode == 2
    assert "not allowed with argument" in both.stderr
    assert not (tmp_path / "user-data").exists()


def test_unwritable_destination_names_the_fix(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        done = _run([*_cli(), "kernelspec", "install", "--prefix", str(locked)], tmp_path)
    finally:
        locked.chmod(0o700)
    if os.geteuid() == 0:  # root writes anyway: then it simply succeeded
        assert done.returncode == 0, done.stderr
        return
    assert done.returncode == 1
    assert "--user" in done.stderr


def test_shipped_kernel_json_is_the_generated_one_for_python() -> None:
    # The wheel's share/jupyter/kernels/lemon-python: "python" is replaced by jupyter_client
    # with its own interpreter, so it serves a Jupyter in this environment only.
    shipped = json.loads((REPO / "kernelspec" / "lemon-python" / "kernel.json").read_text())
    assert shipped == kernel_json("python")


# --- a Jupyter from another environment --------------------------------------------------------

#: Run by the other environment's Python: start the kernel by name, ask whether text() exists.
CLIENT = """
import sys
from jupyter_client.manager import start_new_kernel

km, kc = start_new_kernel(kernel_name=sys.argv[1], startup_timeout=60)
try:
    out = []
    reply = kc.execute_interactive(
        "print(callable(text), callable(notify))",
        timeout=60,
        output_hook=lambda m: out.append(m["content"].get("text", "")),
    )
    print("STATUS", reply["content"]["status"])
    print("OUTPUT", "".join(out).strip())
finally:
    kc.stop_channels()
    km.shutdown_kernel(now=True)
"""


@pytest.fixture(scope="module")
def other_jupyter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The Python of a second venv holding jupyter_client only (no lemon_exec, no ipykernel)."""
    root = tmp_path_factory.mktemp("other-jupyter")
    subprocess.run([PYTHON, "-m", "venv", "--without-pip", str(root)], check=True, timeout=60)
    python = root / "bin" / "python"
    subprocess.run(
        [PYTHON, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--disable-pip-version-check", "jupyter_client"],
        check=True, timeout=110, capture_output=True,
    )  # fmt: skip
    for module, present in (("jupyter_client", True), ("lemon_exec", False), ("ipykernel", False)):
        # cwd=root: run from the checkout, `-c` would find lemon_exec in the current directory.
        probe = subprocess.run(
            [str(python), "-c", f"import {module}"], capture_output=True, cwd=root, check=False
        )
        assert (probe.returncode == 0) is present, f"{module} in the other venv: {probe}"
    yield python
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.kernel
def test_jupyter_from_another_environment_runs_the_installed_kernel(
    tmp_path: Path, other_jupyter: Path
) -> None:
    prefix = tmp_path / "prefix"
    done = _run([*_cli(), "kernelspec", "install", "--prefix", str(prefix)], tmp_path)
    assert done.returncode == 0, done.stderr
    env = _env(tmp_path)
    env["JUPYTER_PATH"] = str(prefix / "share" / "jupyter")
    # No trace of this environment: not on PATH, not activated.
    env["PATH"] = "/usr/bin:/bin"
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)
    ran = subprocess.run(
        [str(other_jupyter), "-c", CLIENT, "lemon-python"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert "STATUS ok" in ran.stdout, ran.stdout + ran.stderr
    assert "OUTPUT True True" in ran.stdout, ran.stdout + ran.stderr


def test_for_gateway_writes_a_local_process_proxy_spec(tmp_path: Path) -> None:
    kernels = tmp_path / "eg-kernels"
    done = _run([*_cli(), "kernelspec", "install", "--for-gateway", str(kernels)], tmp_path)
    assert done.returncode == 0, done.stderr
    spec = _spec(kernels / "lemon-python")
    argv = spec["argv"]
    assert isinstance(argv, list) and _is_this_python(argv[0]) and argv[1:] == ARGV_TAIL
    metadata = spec["metadata"]
    assert isinstance(metadata, dict)
    assert metadata["process_proxy"] == {
        "class_name": "enterprise_gateway.services.processproxies.processproxy.LocalProcessProxy"
    }


def test_for_gateway_kubernetes_spec_runs_pods_of_the_image(tmp_path: Path) -> None:
    kernels = tmp_path / "eg-kernels"
    argv = [*_cli(), "kernelspec", "install", "--for-gateway", str(kernels)]
    done = _run([*argv, "--kubernetes-image", "registry/lemon:1", "--name", "lemon-k8s"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "registry/lemon:1" in done.stdout
    spec = _spec(kernels / "lemon-k8s")
    metadata = spec["metadata"]
    assert isinstance(metadata, dict)
    proxy = metadata["process_proxy"]
    assert proxy["class_name"].endswith("k8s.KubernetesProcessProxy")
    assert proxy["config"] == {"image_name": "registry/lemon:1"}
    words = spec["argv"]
    assert isinstance(words, list) and words[1].endswith("/launch_kubernetes.py")
    for placeholder in ("{kernel_id}", "{port_range}", "{response_address}", "{public_key}"):
        assert placeholder in words


def test_kubernetes_image_without_for_gateway_is_a_usage_error(tmp_path: Path) -> None:
    done = _run([*_cli(), "kernelspec", "install", "--kubernetes-image", "x"], tmp_path)
    assert done.returncode == 2 and "--for-gateway" in done.stderr
    bad = _run(
        [*_cli(), "kernelspec", "install", "--for-gateway", str(tmp_path), "--name", "a b"],
        tmp_path,
    )
    assert bad.returncode == 2 and "invalid kernelspec name" in bad.stderr
