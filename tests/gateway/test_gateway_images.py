"""Images from kernels behind a real Enterprise Gateway: the image bytes cross the websocket
as a binary buffer of the comm message (no host link there), and the reply comes back on
control, as every bridge reply does for a gateway kernel."""

from __future__ import annotations

import asyncio
import io

import pytest
from PIL import Image

from lemon_exec import ExecuteCode, ExecuteCodeResult

from .eg import EnterpriseGateway
from .support_gw import with_facade

pytestmark = [pytest.mark.timeout(90), pytest.mark.kernel]


def test_an_image_crosses_the_websocket_as_a_buffer(gateway: EnterpriseGateway) -> None:
    buffer = io.BytesIO()
    Image.new("RGB", (300, 200), "red").save(buffer, format="PNG")
    png = buffer.getvalue()
    script = (
        f"image({png!r}, alt='red')\ntext('after')\n"
        "try:\n    image(b'not an image', format='png')\n"
        "except ToolError as exc:\n    print('refused:', exc)\n"
    )

    async def body(ec: ExecuteCode) -> ExecuteCodeResult:
        return await ec.run(script)

    result = asyncio.run(with_facade(gateway, body))
    assert result.ok, result.content
    [shown] = result.images
    assert (shown.data, shown.width, shown.height, shown.alt) == (png, 300, 200, "red")
    assert "refused: image() data is not a PNG" in result.content
