"""The deployment files of docs/scale-out.md agree with the package they deploy.

They are run by Docker, Helm and kubectl, none of which CI has; what can drift silently is
checked here: the kernel image's command, the extra it installs, the kernelspec name the
gateway image copies and the Helm values allow.
"""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

import yaml  # type: ignore[import-untyped]  # no stubs installed; the test only reads dicts

import lemon_exec
from lemon_exec.host.kernels.kernelspec import KERNEL_NAME

REPO = Path(lemon_exec.__file__).resolve().parents[1]


def test_kernel_image_runs_the_gateway_launcher_with_its_extra() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    cmd = re.search(r'^CMD \["python", "-m", "([\w.]+)"\]$', dockerfile, re.M)
    assert cmd is not None, "the image's command is not `python -m MODULE`"
    assert importlib.util.find_spec(cmd.group(1)) is not None
    extra = re.search(r"lemon_exec\[([\w-]+)\]", dockerfile)
    assert extra is not None
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert any(d.startswith("pycryptodomex") for d in extras[extra.group(1)])
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".git", ".venv", ".ci-eg-venv"} <= set(ignored)


def test_gateway_image_and_helm_values_name_the_kernelspec() -> None:
    deploy = REPO / "deploy" / "kubernetes"
    assert f"COPY kernels/{KERNEL_NAME} " in (deploy / "gateway.Dockerfile").read_text()
    values = yaml.safe_load((deploy / "values.yaml").read_text())
    assert values["kernel"]["allowedKernels"] == [KERNEL_NAME]
    assert values["kernel"]["defaultKernelName"] == KERNEL_NAME
    assert values["service"]["type"] == "ClusterIP"
    policy = yaml.safe_load((deploy / "networkpolicy.yaml").read_text())
    assert policy["kind"] == "NetworkPolicy"
    assert policy["spec"]["podSelector"]["matchLabels"]["component"] == "kernel"
