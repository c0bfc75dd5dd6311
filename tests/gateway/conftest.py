"""One real Jupyter Enterprise Gateway on loopback, shared by every gateway test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .eg import EnterpriseGateway, running_gateway


@pytest.fixture(scope="session")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EnterpriseGateway]:
    """The gateway (started on first use; its kernels are this interpreter's lemon-python)."""
    with running_gateway(tmp_path_factory.mktemp("eg")) as eg:
        yield eg
