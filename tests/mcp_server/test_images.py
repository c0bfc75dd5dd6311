"""execute_code results with images, in their MCP form: ``ImageContent`` after the text.

The end-to-end tests (real ``image()`` calls through real clients) are in
``test_images_clients.py``; these check the shapes on results built by hand.
"""

from __future__ import annotations

import base64

import jsonschema  # type: ignore[import-untyped]  # (nbformat and mcp depend on it)
import pytest
from mcp_types import ImageContent, TextContent
from support_images import result_with_images

from lemon_exec import ExecuteCodeResult
from lemon_exec.details import Details
from lemon_exec.mcp._calls import code_result
from lemon_exec.mcp._tool_texts import EXECUTE_CODE_OUTPUT_SCHEMA

pytestmark = pytest.mark.timeout(30)


def test_image_blocks_follow_the_unchanged_text() -> None:
    result = result_with_images()
    mcp = code_result(result)

    text, *images = mcp.content
    assert isinstance(text, TextContent)
    assert text.text == result.content
    assert [type(block) for block in images] == [ImageContent, ImageContent]
    for block, image in zip(images, result.images, strict=True):
        assert isinstance(block, ImageContent)
        assert block.mime_type == image.mime_type
        assert base64.b64decode(block.data, validate=True) == image.data
    wire = mcp.model_dump(by_alias=True, mode="json", exclude_none=True)
    assert wire["content"][1] == {
        "type": "image",
        "data": base64.b64encode(result.images[0].data).decode(),
        "mimeType": "image/png",
    }
    assert mcp.is_error is False


def test_structured_content_has_the_metadata_not_the_bytes() -> None:
    result = result_with_images()
    structured = code_result(result).structured_content
    assert structured is not None
    assert structured["content"] == result.content
    assert structured["images"] == [
        {"mime_type": "image/png", "width": 3, "height": 2, "alt": "a red patch",
         "bytes": len(result.images[0].data), "after_text_blocks": 1},
        {"mime_type": "image/svg+xml", "width": 4, "height": 3, "alt": None,
         "bytes": len(result.images[1].data), "after_text_blocks": 2},
    ]  # fmt: skip
    encoded = base64.b64encode(result.images[0].data).decode()
    assert encoded not in str(structured)
    jsonschema.validate(structured, EXECUTE_CODE_OUTPUT_SCHEMA)


def test_without_images_the_result_is_as_before() -> None:
    result = ExecuteCodeResult("Script result (text()):\nhi", Details(exit_code=0))
    mcp = code_result(result)
    assert len(mcp.content) == 1
    assert mcp.structured_content is not None
    assert set(mcp.structured_content) == {"content", "details", "trust"}
    jsonschema.validate(mcp.structured_content, EXECUTE_CODE_OUTPUT_SCHEMA)


def test_the_schema_rejects_metadata_without_its_size() -> None:
    # The schema is a real check: a metadata entry without its size does not validate.
    structured = code_result(result_with_images()).structured_content
    assert structured is not None
    del structured["images"][0]["bytes"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(structured, EXECUTE_CODE_OUTPUT_SCHEMA)
