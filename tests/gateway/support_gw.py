"""Shared helpers of the gateway tests: facades whose kernels run behind the test gateway."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from support import enabled_config

from lemon_exec import ExecuteCode

from .eg import EnterpriseGateway

T = TypeVar("T")


def gateway_facade(gateway: EnterpriseGateway, **settings: Any) -> ExecuteCode:
    """A facade whose kernels the test gateway runs (30 s timeout, no spares by default)."""
    values: dict[str, Any] = {"gateway_url": gateway.url, "gateway_auth_token": gateway.token}
    values.update(settings)
    return ExecuteCode(enabled_config(**values))


async def with_facade(
    gateway: EnterpriseGateway,
    body: Callable[[ExecuteCode], Awaitable[T]],
    **settings: Any,
) -> T:
    """Run ``body`` with a fresh gateway facade, closed afterwards."""
    async with gateway_facade(gateway, **settings) as ec:
        return await body(ec)
