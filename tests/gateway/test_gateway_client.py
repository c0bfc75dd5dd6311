"""The gateway client's pure logic: URLs, the websocket's message framing, the settings."""

from __future__ import annotations

import json
import logging

import pytest

from lemon_exec import ExecuteCodeConfig
from lemon_exec.host.kernels.gateway.client import Gateway, decode, encode, peek_channel


def test_urls_keep_the_base_path_and_switch_to_websocket_schemes() -> None:
    gateway = Gateway("https://eg.example/base", "t0k")
    assert (
        gateway.kernel_url("k 1", "interrupt")
        == "https://eg.example/base/api/kernels/k%201/interrupt"
    )
    assert gateway.channels_url("k1", "s1") == (
        "wss://eg.example/base/api/kernels/k1/channels?session_id=s1"
    )
    assert gateway.headers()["Authorization"] == "token t0k"
    assert "Authorization" not in Gateway("http://eg").headers()


def test_text_and_binary_messages_decode_and_junk_is_refused() -> None:
    msg = {"channel": "iopub", "header": {"msg_type": "stream"}, "parent_header": {}}
    assert decode(encode(msg)) == msg
    # jupyter_server's binary framing: count, offsets, the JSON, then the buffers.
    body = json.dumps(msg).encode()
    offsets = [12, 12 + len(body)]
    raw = (2).to_bytes(4, "big") + b"".join(o.to_bytes(4, "big") for o in offsets) + body + b"BUF"
    assert decode(raw) == {**msg, "buffers": [b"BUF"]}
    for junk in (
        "not json",
        "[1, 2]",
        '{"header": 3}',
        b"\x00\x00",
        b"\x00\x00\x00\x09" + b"x" * 8,
    ):
        with pytest.raises(ValueError):
            decode(junk)


def test_an_oversized_message_is_attributed_to_its_channel_from_its_tail() -> None:
    assert peek_channel('{"content": "...", "channel": "shell"}') == "shell"
    assert peek_channel(b'{"content": "...", "channel": "iopub"}') == "IOPub"


def test_gateway_url_must_be_http(caplog: pytest.LogCaptureFixture) -> None:
    assert ExecuteCodeConfig(gateway_url=" http://eg:8888/ ").gateway_url == "http://eg:8888"
    with caplog.at_level(logging.WARNING):
        assert ExecuteCodeConfig(gateway_url="eg:8888").gateway_url == ""
    assert "gateway_url" in caplog.text
