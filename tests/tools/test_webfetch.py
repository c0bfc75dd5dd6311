"""The webfetch tool, against a real ThreadingHTTPServer on 127.0.0.1."""

from __future__ import annotations

import pathlib
import socket

import pytest

from lemon_exec.errors import ToolFailure
from lemon_exec.tools import ToolHost, _webfetch, default_registry

from .conftest import Invoke, run_call

pytestmark = pytest.mark.timeout(10)


def test_html_to_markdown(http_base: str, invoke: Invoke) -> None:
    out = invoke("webfetch", url=f"{http_base}/page.html")
    assert "# Hello Lemon" in out
    assert "_emphasised_" in out
    assert f"[a link]({http_base}/docs)" in out  # links made absolute against the page URL
    assert "do-not-show" not in out and "color: red" not in out


def test_html_to_text(http_base: str, invoke: Invoke) -> None:
    out = invoke("webfetch", url=f"{http_base}/page.html", extract_mode="text")
    assert "Hello Lemon" in out
    assert "Some emphasised text with a link." in out
    assert "/docs" not in out and "logo" not in out and "_" not in out


def test_plain_text_uses_the_response_charset(http_base: str, invoke: Invoke) -> None:
    assert invoke("webfetch", url=f"{http_base}/plain.txt") == "caf\u00e9 au lait\n"


def test_json_is_text(http_base: str, invoke: Invoke) -> None:
    assert invoke("webfetch", url=f"{http_base}/data.json") == '{"ok": true}'


def test_gzip_body_is_decoded(http_base: str, invoke: Invoke) -> None:
    assert invoke("webfetch", url=f"{http_base}/gzip.txt") == "zipped text\n"


def test_redirect_is_followed(http_base: str, invoke: Invoke) -> None:
    assert invoke("webfetch", url=f"{http_base}/redirect") == "caf\u00e9 au lait\n"


def test_redirect_loop_is_bounded(http_base: str, invoke: Invoke) -> None:
    with pytest.raises(ToolFailure, match=r"webfetch: too many redirects \(more than 5\)"):
        invoke("webfetch", url=f"{http_base}/loop")


def test_redirect_to_file_scheme_is_refused(http_base: str, invoke: Invoke) -> None:
    with pytest.raises(ToolFailure, match="refusing to follow a redirect to file:///etc/passwd"):
        invoke("webfetch", url=f"{http_base}/to-file")


def test_http_404(http_base: str, invoke: Invoke) -> None:
    url = f"{http_base}/missing"
    with pytest.raises(ToolFailure) as info:
        invoke("webfetch", url=url)
    assert str(info.value) == f"webfetch: HTTP 404 Not Found for {url}"


def test_oversized_body_is_cut(http_base: str, invoke: Invoke) -> None:
    out = invoke("webfetch", url=f"{http_base}/big.txt", max_chars=10_000_000)
    body, notes = out.split("\n\n", 1)
    assert len(body) == _webfetch.MAX_RESPONSE_BYTES
    assert notes == "[truncated: the response is larger than 5 MiB; only its beginning was read]"


def test_max_chars(http_base: str, invoke: Invoke) -> None:
    out = invoke("webfetch", url=f"{http_base}/long.txt")
    body, note = out.split("\n\n", 1)
    assert len(body) == _webfetch.DEFAULT_MAX_CHARS
    assert note.startswith("[truncated: showing 50000 of 100000 characters")
    out = invoke("webfetch", url=f"{http_base}/long.txt", max_chars=10)
    assert out.startswith("abcdefghij\n\n[truncated: showing 10 of 100000")


def test_binary_content_is_refused(http_base: str, invoke: Invoke) -> None:
    with pytest.raises(ToolFailure, match=r"returned binary content \(image/png\)"):
        invoke("webfetch", url=f"{http_base}/image.png")


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "ftp://127.0.0.1/x", "data:text/plain,hi", "127.0.0.1/x"]
)
def test_non_http_schemes_are_rejected(url: str, invoke: Invoke) -> None:
    with pytest.raises(ToolFailure, match="only http and https URLs are supported"):
        invoke("webfetch", url=url)


def test_connection_refused(invoke: Invoke) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound but not listening: nothing will accept
        with pytest.raises(ToolFailure, match=f"webfetch: cannot fetch http://127.0.0.1:{port}/"):
            invoke("webfetch", url=f"http://127.0.0.1:{port}/")


def test_timeout(tmp_path: pathlib.Path) -> None:
    host = ToolHost(default_registry(), time_limits={"webfetch": 0.3})
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)  # accepts the connection, never answers
        port = s.getsockname()[1]
        with pytest.raises(ToolFailure, match=r"webfetch: timed out after 0.3 s"):
            run_call(host, "webfetch", tmp_path, url=f"http://127.0.0.1:{port}/slow")
    host.close()


def test_bad_params(http_base: str, invoke: Invoke) -> None:
    with pytest.raises(ToolFailure, match="extract_mode must be 'markdown' or 'text'"):
        invoke("webfetch", url=f"{http_base}/plain.txt", extract_mode="html")
    with pytest.raises(ToolFailure, match="max_chars must be >= 1"):
        invoke("webfetch", url=f"{http_base}/plain.txt", max_chars=0)
