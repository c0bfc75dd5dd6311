"""``webfetch(url, extract_mode='markdown', max_chars=None)``: an HTTP(S) page as text.

Uses the stdlib :mod:`urllib.request` on a thread lane of its own and :mod:`markdownify`
(MIT, on BeautifulSoup) for HTML. Proxies come from the usual environment variables only.

The deadline is total (connect, headers and body), not per socket read: a server that drips
one byte a second cannot stretch a fetch. When the deadline passes, or the call is cancelled,
the fetch's socket is shut down, which unblocks its thread at once, so the thread is free for
the next fetch.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import http.client
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from email.message import Message
from typing import Any

from lemon_exec.errors import ToolFailure

from ._html import html_to_text
from ._lanes import ThreadLane
from ._paths import is_binary_bytes
from ._types import ToolCall, ToolSpec

__all__ = [
    "DEFAULT_MAX_CHARS",
    "LANE_THREADS",
    "MAX_REDIRECTS",
    "MAX_RESPONSE_BYTES",
    "TIMEOUT_S",
    "spec",
    "webfetch",
]

#: Seconds for the whole fetch (connect, headers and body): the tool's default time limit.
#: Lower it per host with ``ToolHost(time_limits={"webfetch": 5})``.
TIMEOUT_S = 20.0
#: Fetches that run at once (across hosts); more wait, within their deadline.
LANE_THREADS = 16
#: Most bytes of response body read (5 MiB); the rest is never downloaded.
MAX_RESPONSE_BYTES = 5 * 1024 * 1024
#: Redirects followed before giving up.
MAX_REDIRECTS = 5
#: Characters returned when ``max_chars`` is not given.
DEFAULT_MAX_CHARS = 50_000
EXTRACT_MODES = ("markdown", "text")
USER_AGENT = "lemon_exec-webfetch/0.1 (+https://pypi.org/project/lemon_exec/)"

DESCRIPTION = f"""\
Fetch an http(s) URL with GET and return it as text. HTML is converted to Markdown
(`extract_mode='markdown'`, the default) or to plain text without links, images or emphasis
(`extract_mode='text'`); other text types are returned as-is, decoded with the response's
charset; binary content raises ToolError. Follows up to {MAX_REDIRECTS} redirects, times out
after {TIMEOUT_S:g} s, reads at most {MAX_RESPONSE_BYTES // 2**20} MiB, and returns at most
`max_chars` characters (default {DEFAULT_MAX_CHARS}), ending with a `[truncated: ...]` note when
cut. HTTP errors raise ToolError("webfetch: HTTP 404 Not Found for <url>")."""

_TEXT_TYPES = frozenset(
    {
        "application/json",
        "application/xml",
        "application/javascript",
        "application/x-javascript",
        "application/ecmascript",
        "application/yaml",
        "application/x-yaml",
        "application/toml",
        "application/x-sh",
        "application/sql",
        "application/graphql",
    }
)
_BINARY_TYPES = frozenset(
    {"application/pdf", "application/zip", "application/gzip", "application/octet-stream"}
)
_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?([A-Za-z0-9._:-]+)""", re.I)


def spec() -> ToolSpec:
    """The registry entry for ``webfetch``."""
    return ToolSpec(
        name="webfetch",
        func=webfetch,
        description=DESCRIPTION,
        parameters=("url", "extract_mode", "max_chars"),
        required=("url",),
        param_types={"url": str, "extract_mode": str, "max_chars": int},
        defaults={"extract_mode": "markdown", "max_chars": None},
        time_limit_s=TIMEOUT_S,
    )


_lane: ThreadLane | None = None
_lane_lock = threading.Lock()


def _fetch_lane() -> ThreadLane:
    global _lane
    with _lane_lock:
        if _lane is None:
            _lane = ThreadLane("lemon-webfetch", LANE_THREADS)
        return _lane


async def webfetch(params: dict[str, Any], call: ToolCall) -> str:
    """Fetch and convert on the fetch lane, within ``call.deadline`` (default: TIMEOUT_S)."""
    started = time.monotonic()
    deadline = call.deadline if call.deadline is not None else started + TIMEOUT_S
    url = _check_url(params["url"])
    mode = params.get("extract_mode") or "markdown"
    if mode not in EXTRACT_MODES:
        raise ToolFailure(f"webfetch: extract_mode must be 'markdown' or 'text', got {mode!r}")
    max_chars = DEFAULT_MAX_CHARS if params.get("max_chars") is None else params["max_chars"]
    if max_chars < 1:
        raise ToolFailure(f"webfetch: max_chars must be >= 1, got {max_chars}")

    fetch = _Fetch(deadline)
    work = asyncio.wrap_future(_fetch_lane().submit(_fetch_text, fetch, url, mode, max_chars))
    try:
        done, _ = await asyncio.wait({work}, timeout=max(0.0, deadline - time.monotonic()))
    except asyncio.CancelledError:
        fetch.abort()  # frees the lane thread; its late answer is dropped
        work.cancel()
        raise
    if not done:
        fetch.abort()
        work.cancel()
        raise ToolFailure(f"webfetch: timed out after {fetch.budget:g} s fetching {url}")
    return work.result()


def _fetch_text(fetch: _Fetch, url: str, mode: str, max_chars: int) -> str:
    """The fetch and the conversion, on a lane thread."""
    final_url, headers, body, body_cut = fetch.get(url)
    text = _to_text(final_url, headers, body, mode)

    notes = []
    if body_cut:
        notes.append(
            f"[truncated: the response is larger than {MAX_RESPONSE_BYTES // 2**20} MiB; "
            "only its beginning was read]"
        )
    if len(text) > max_chars:
        notes.append(
            f"[truncated: showing {max_chars} of {len(text)} characters; "
            "pass a larger max_chars to see more]"
        )
        text = text[:max_chars]
    if notes:
        text = text.rstrip("\n") + "\n\n" + "\n".join(notes)
    return text


# -- request -----------------------------------------------------------------------------------


def _check_url(url: str) -> str:
    url = url.strip()
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        shown = f"{scheme}:" if scheme else "no scheme"
        raise ToolFailure(f"webfetch: only http and https URLs are supported, got {shown} ({url})")
    if not parts.hostname:
        raise ToolFailure(f"webfetch: URL has no host: {url}")
    # Percent-encode stray non-ASCII/space characters; http.client refuses them.
    return urllib.parse.quote(url, safe=":/?#[]@!$&'()*+,;=%~")


class _RedirectRefused(Exception):
    """A redirect pointed at a non-HTTP(S) URL."""


class _RedirectHandler(urllib.request.HTTPRedirectHandler):
    """The stdlib handler, with a lower limit and http/https-only targets."""

    max_redirections = MAX_REDIRECTS

    def http_error_302(self, req, fp, code, msg, headers):  # type: ignore[no-untyped-def]
        location = headers.get("location") or headers.get("uri")
        if location:
            target = urllib.parse.urljoin(req.full_url, location)
            if urllib.parse.urlsplit(target).scheme.lower() not in ("http", "https"):
                fp.close()
                raise _RedirectRefused(target)
        return super().http_error_302(req, fp, code, msg, headers)

    http_error_301 = http_error_303 = http_error_307 = http_error_308 = http_error_302


class _Fetch:
    """One fetch, abortable from another thread: it remembers every connection it opens."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.budget = round(deadline - time.monotonic(), 1)  # seconds, for messages
        self._lock = threading.Lock()
        self._connections: list[http.client.HTTPConnection] = []
        self._aborted = False

    def abort(self) -> None:
        """Shut down the sockets: a read blocked in the fetch thread returns at once."""
        with self._lock:
            self._aborted = True
            connections = list(self._connections)
        for conn in connections:
            _shutdown(conn.sock)

    def _connection(self, cls: type[http.client.HTTPConnection]) -> Any:
        def make(host: str, **kwargs: Any) -> http.client.HTTPConnection:
            conn = cls(host, **kwargs)
            with self._lock:
                if self._aborted:
                    raise TimeoutError
                self._connections.append(conn)
            _patch_connect(conn, self)
            return conn

        return make

    def remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0 or self._aborted:
            raise TimeoutError
        return left

    def opener(self) -> urllib.request.OpenerDirector:
        # Built by hand so no file:, ftp: or data: handler is ever reachable.
        fetch = self

        class HTTPHandler(urllib.request.HTTPHandler):
            def do_open(self, http_class: Any, req: Any, **kwargs: Any) -> Any:
                return super().do_open(fetch._connection(http_class), req, **kwargs)

        class HTTPSHandler(urllib.request.HTTPSHandler):
            def do_open(self, http_class: Any, req: Any, **kwargs: Any) -> Any:
                return super().do_open(fetch._connection(http_class), req, **kwargs)

        opener = urllib.request.OpenerDirector()
        for handler in (
            urllib.request.ProxyHandler(),  # environment proxies only
            urllib.request.UnknownHandler(),
            HTTPHandler(),
            HTTPSHandler(),
            urllib.request.HTTPDefaultErrorHandler(),
            _RedirectHandler(),
            urllib.request.HTTPErrorProcessor(),
        ):
            opener.add_handler(handler)
        return opener

    def get(self, url: str) -> tuple[str, Message, bytes, bool]:
        """GET ``url``; return (final URL, headers, body, whether the body was cut)."""
        request = urllib.request.Request(
            url,
            method="GET",
            headers={
                "User-Agent": USER_AGENT,
                "Accept": "text/html,application/xhtml+xml,text/plain;q=0.9,*/*;q=0.5",
            },
        )
        budget = self.budget
        try:
            with self.opener().open(request, timeout=self.remaining()) as response:
                body, cut = _read_body(response, self, url)
                return response.geturl(), response.headers, body, cut
        except urllib.error.HTTPError as e:
            e.close()
            failed_url = e.geturl() or url
            if e.code in (301, 302, 303, 307, 308) and e.headers.get("location"):
                raise ToolFailure(
                    f"webfetch: too many redirects (more than {MAX_REDIRECTS}) for {url}"
                ) from None
            raise ToolFailure(f"webfetch: HTTP {e.code} {e.reason} for {failed_url}") from None
        except _RedirectRefused as e:
            raise ToolFailure(
                f"webfetch: refusing to follow a redirect to {e} (from {url})"
            ) from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, TimeoutError) or self._aborted:
                raise ToolFailure(
                    f"webfetch: timed out after {budget:g} s fetching {url}"
                ) from None
            raise ToolFailure(f"webfetch: cannot fetch {url}: {e.reason}") from None
        except TimeoutError:
            raise ToolFailure(f"webfetch: timed out after {budget:g} s fetching {url}") from None
        except (http.client.HTTPException, OSError, ValueError) as e:
            if self._aborted:
                raise ToolFailure(
                    f"webfetch: timed out after {budget:g} s fetching {url}"
                ) from None
            raise ToolFailure(f"webfetch: cannot fetch {url}: {type(e).__name__}: {e}") from None


def _patch_connect(conn: http.client.HTTPConnection, fetch: _Fetch) -> None:
    """After connecting, re-check the abort flag (abort() may have run during connect)."""
    connect = conn.connect

    def connect_then_check() -> None:
        conn.timeout = fetch.remaining()
        connect()
        if fetch._aborted:
            _shutdown(conn.sock)
            raise TimeoutError

    conn.connect = connect_then_check  # type: ignore[method-assign]


def _shutdown(sock: socket.socket | None) -> None:
    if sock is None:
        return
    # The plain socket's shutdown, also for TLS: SSLSocket.shutdown would also drop its SSL
    # object under the reading thread's feet. OSError: already closed or never connected.
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _read_body(response: Any, fetch: _Fetch, url: str) -> tuple[bytes, bool]:
    """Read at most :data:`MAX_RESPONSE_BYTES` (decompressed), within the deadline."""
    chunks: list[bytes] = []
    total = 0
    while total <= MAX_RESPONSE_BYTES:
        fetch.remaining()  # raises TimeoutError once the deadline has passed
        # read1: whatever has arrived (at most one recv), so the loop re-checks the deadline.
        chunk = response.read1(min(64 * 1024, MAX_RESPONSE_BYTES + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    body = b"".join(chunks)
    cut = total > MAX_RESPONSE_BYTES
    # We never ask for compression, but some servers send it anyway.
    encoding = (response.headers.get("Content-Encoding") or "").strip().lower()
    if encoding in ("gzip", "x-gzip", "deflate"):
        body, more = _decompress(body, encoding)
        cut = cut or more
    return body[:MAX_RESPONSE_BYTES], cut or len(body) > MAX_RESPONSE_BYTES


def _decompress(body: bytes, encoding: str) -> tuple[bytes, bool]:
    wbits = 16 + zlib.MAX_WBITS if encoding != "deflate" else zlib.MAX_WBITS
    try:
        d = zlib.decompressobj(wbits)
        out = d.decompress(body, MAX_RESPONSE_BYTES + 1)
    except zlib.error:
        if encoding != "deflate":
            raise ToolFailure("webfetch: the response is not valid gzip") from None
        d = zlib.decompressobj(-zlib.MAX_WBITS)  # "deflate" is often sent without a header
        out = d.decompress(body, MAX_RESPONSE_BYTES + 1)
    return out, bool(d.unconsumed_tail) or len(out) > MAX_RESPONSE_BYTES


# -- conversion --------------------------------------------------------------------------------


def _to_text(url: str, headers: Message, body: bytes, mode: str) -> str:
    declared = headers.get("Content-Type") is not None
    ctype = headers.get_content_type() if declared else ""
    is_html = ctype in _HTML_TYPES or (not declared and _looks_like_html(body))
    if not is_html and not _is_texty(ctype, body):
        raise ToolFailure(
            f"webfetch: {url} returned binary content ({ctype or 'unknown type'}); "
            "webfetch only returns text"
        )
    text = body.decode(_charset(headers, body, is_html), errors="replace")
    return html_to_text(text, url, mode) if is_html else text


def _is_texty(ctype: str, body: bytes) -> bool:
    major = ctype.split("/", 1)[0]
    if major in ("image", "audio", "video", "font") or ctype in _BINARY_TYPES:
        return False
    if major == "text" or ctype in _TEXT_TYPES or ctype.endswith(("+json", "+xml")):
        return True
    return not is_binary_bytes(body)


def _looks_like_html(body: bytes) -> bool:
    head = body[:1024].lstrip().lower()
    return head.startswith((b"<!doctype html", b"<html"))


def _charset(headers: Message, body: bytes, is_html: bool) -> str:
    charset = headers.get_content_charset()
    if not charset and is_html:
        m = _META_CHARSET.search(body[:4096])
        charset = m.group(1).decode("ascii") if m else None
    try:
        return codecs.lookup(charset or "utf-8").name
    except LookupError:
        return "utf-8"
