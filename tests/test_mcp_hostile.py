"""A hostile upstream MCP server (issue 25, items 3 and 7): tests/mcp_upstream/hostile.py.

Item 3: its tool names attack the ``tools`` namespace (``__set_name__``, ``__get__``, helper
names, names that collide after mangling, unicode, empty, over-long). Each maps to a safe
attribute or is skipped with a note tools.search() lists; scripts still finish.

Item 7: its ``big`` tool answers as many MiB as asked. Against a 1 MiB result budget a
64 MiB answer fails the call quickly, the host's peak memory stays within the budget plus
a margin, and the connection serves the next call (stdio, HTTP with JSON and SSE bodies).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp_upstream import serving_http

from lemon_exec import ExecuteCode, ExecuteCodeConfig
from lemon_exec.errors import ToolFailure
from lemon_exec.tools import ToolCall, ToolHost, ToolRegistry, default_registry
from lemon_exec.tools._mcp_source import LIST_TIMEOUT_S
from lemon_exec.tools._mcp_tools import tool_attribute

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]

HOSTILE = str(Path(__file__).parent / "mcp_upstream" / "hostile.py")
MIB = 1024 * 1024


#: Upstream name -> the attribute it is offered as (docs/mcp.md, "Tool names").
MAPPED = {
    "__set_name__": "set_name__",
    "__get__": "get__",
    "__init_subclass__": "init_subclass__",
    "__class_getitem__": "class_getitem__",
    "__getattr__": "getattr__",
    "__init__": "init__",
    "__repr__": "repr__",
    "__class__": "class__",
    "__dict__": "dict__",
    "__slots__": "slots__",
    "_repr_html_": "repr_html_",
    "__wrapped__": "wrapped__",
    "_members": "members",
    "mro": "mro",
    "search": "search",
    "text": "text",
    "batch": "batch",
    "tools": "tools",
    "print": "print",
    "class": "class_",
    "get-weather": "get_weather",
    "get_weather": "get_weather_",  # collides with get-weather's attribute, listed later
    "9lives": "tool_9lives",
    "météo": "m_t_o",
}
SKIPPED = [
    "h: upstream tool '日本語': its name has no ASCII letter or digit",
    f"h: upstream tool {('x' * 200)!r:.57}...: its name is longer than 128 characters",
    "h: upstream tool '---': its name has no ASCII letter or digit",
    "h: upstream tool '': its name is empty",
]


def _stdio_registry(registry: ToolRegistry | None = None, *, plain: bool = False) -> ToolRegistry:
    """The hostile server over stdio as ``h``; ``plain``: only its echo and big tools."""
    registry = registry if registry is not None else ToolRegistry()
    args = [HOSTILE, "--plain"] if plain else [HOSTILE]
    registry.add_mcp_server("h", command=sys.executable, args=args)
    return registry


def _call(tool: str, result_limit: int | None = None, **params: object) -> ToolCall:
    return ToolCall(
        tool=tool, params=dict(params), cwd=Path.cwd(), call_id=1, result_limit=result_limit
    )


@pytest.fixture(params=["json", "sse"])
def http_big(request: pytest.FixtureRequest) -> Iterator[str]:
    extra = ["--json"] if request.param == "json" else []
    with serving_http(HOSTILE, "--plain", *extra) as url:
        yield url


# -- item 3: names ------------------------------------------------------------------------------


def test_a_server_name_must_become_an_attribute() -> None:
    registry = ToolRegistry()
    with pytest.raises(ValueError, match="starts with '_'"):
        registry.add_mcp_server("9x", command="cat")  # would be _9x: never an attribute
    with pytest.raises(ValueError, match="starts with '_'"):
        registry.add_mcp_server("__get__", command="cat")
    registry.add_mcp_server("x9", command="cat")


def test_tool_attribute_rules() -> None:
    # The collision of get-weather and get_weather is resolved by tool_specs, not here.
    expected = dict(MAPPED, get_weather="get_weather")
    assert {name: tool_attribute(name) for name in MAPPED} == expected
    for bad in ("", "---", "日本語", "x" * 129, None, 5):
        assert tool_attribute(bad) is None
    assert tool_attribute("x" * 128) == "x" * 128
    # Nothing it returns starts with "_" (Python's names) or is a keyword.
    assert tool_attribute("__import__") == "import__" and tool_attribute("_") is None


async def test_hostile_names_are_mapped_or_skipped_with_notes() -> None:
    registry = _stdio_registry()
    host = ToolHost(registry)
    try:
        await host.prepare_tools()
        names = host.names()
        assert names == [f"h.{attr}" for attr in MAPPED.values()] + ["h.echo", "h.big", "h.flood"]
        assert list(registry.notes("h")) == SKIPPED
        spec = registry.get("h.set_name__")
        assert spec is not None and spec.mcp is not None and spec.mcp.tool == "__set_name__"
        assert "Upstream name: '__set_name__'." in spec.description
        assert await host.invoke(_call("h.get__")) == "called __get__"
        assert await host.invoke(_call("h.get_weather_")) == "called get_weather"
    finally:
        await host.aclose()


_NAMES_SCRIPT = """
import json, pydoc
ns = tools.h
out = {}
out["class_attrs"] = sorted(
    n for c in type(ns).__mro__ for n in vars(c) if n.lstrip("_") and not n.startswith("__")
)
out["calls"] = [getattr(ns, attr)() for attr in ATTRS]
out["echo"] = ns.echo(text="sane")
out["batch"] = batch([("h.get__", {}), ("h.echo", {"text": "b"})])
out["skipped"] = [line for line in tools.search("") if line.startswith("skipped:")]
out["found"] = list(tools.search("__set_name__"))
out["protocol"] = [hasattr(ns, "__get__"), hasattr(ns, "__set_name__"), repr(ns), repr(tools)]
out["help"] = pydoc.render_doc(ns, renderer=pydoc.plaintext)
out["help_tools"] = pydoc.render_doc(tools, renderer=pydoc.plaintext)
text(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.kernel
async def test_hostile_names_in_the_kernel_runs_still_finish() -> None:
    registry = _stdio_registry(default_registry())
    config = ExecuteCodeConfig(enabled=True, warm_kernels=0)
    script = f"ATTRS = {list(MAPPED.values())!r}\n" + _NAMES_SCRIPT
    async with ExecuteCode(config, tools=registry) as tool:
        result = await tool.run(script, timeout_ms=30_000)
        assert result.details["exit_code"] == 0, result.content
        out = json.loads(result.content.splitlines()[-1])
        # Only the namespace's own fixed attributes; nothing from upstream data.
        assert out["class_attrs"] == ["_members", "_server"], out["class_attrs"]
        assert out["calls"] == [f"called {name}" for name in MAPPED]
        assert out["echo"] == "sane"
        assert out["batch"] == ["called __get__", "b"]
        assert out["skipped"] == [f"skipped: {note}" for note in SKIPPED]
        assert out["found"][0].startswith("h.set_name__() — The tool '__set_name__'.")
        assert out["protocol"] == [
            False,
            False,
            f"<tools.h: {len(MAPPED) + 3} tools; help() lists them>",
            f"<tools: {5 + len(MAPPED) + 3} tools; tools.search(query) finds them>",
        ]
        assert "h.set_name__() — The tool '__set_name__'." in out["help"]
        assert "4 upstream tools not offered: tools.search('skipped')" in out["help_tools"]
        # A run that only calls text() finishes too (a hostile name once hung every run).
        plain = await tool.run("text('only text')", timeout_ms=30_000)
        assert plain.content.splitlines()[-1] == "only text" and plain.details["exit_code"] == 0


# -- item 7: answers bounded as they arrive ------------------------------------------------------


def _reset_peak_rss() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def _peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


async def _big_answer_is_stopped(registry: ToolRegistry, server: str) -> None:
    host = ToolHost(registry)
    try:
        await host.prepare_tools()
        assert await host.invoke(_call(f"{server}.echo", text="warm")) == "warm"
        baseline = _rss()
        _reset_peak_rss()
        started = time.monotonic()
        with pytest.raises(ToolFailure, match=r"\.big failed: its answer passed \d+ bytes"):
            await host.invoke(_call(f"{server}.big", MIB, mib=64))
        elapsed = time.monotonic() - started
        growth = _peak_rss() - baseline
        # The server needs a moment to build 64 MiB; the old host took 30 s and +117 MiB.
        assert elapsed < 15, elapsed
        assert growth < MIB + 32 * MIB, growth / MIB
        # The connection serves the next calls, a result within its limit included.
        assert await host.invoke(_call(f"{server}.echo", text="still here")) == "still here"
        assert await host.invoke(_call(f"{server}.big", 2 * MIB, mib=1)) == "x" * MIB
    finally:
        await host.aclose()


@pytest.mark.slow
async def test_a_64_mib_stdio_answer_fails_fast_in_bounded_memory() -> None:
    await _big_answer_is_stopped(_stdio_registry(plain=True), "h")


@pytest.mark.slow
async def test_a_64_mib_http_answer_fails_fast_in_bounded_memory(http_big: str) -> None:
    registry = ToolRegistry()
    registry.add_mcp_server("hh", url=http_big)
    await _big_answer_is_stopped(registry, "hh")


@pytest.mark.slow
async def test_a_stdio_server_that_floods_is_cut_off_and_restarted() -> None:
    """Bytes without end (no newline): the call fails at the cap, the host drains a bounded
    amount more, then stops reading; the next calls get a restarted server."""
    host = ToolHost(_stdio_registry(plain=True))
    try:
        await host.prepare_tools()
        baseline = _rss()
        _reset_peak_rss()
        started = time.monotonic()
        with pytest.raises(ToolFailure, match=r"h\.flood failed: its answer passed \d+ bytes"):
            await host.invoke(_call("h.flood", MIB))
        assert time.monotonic() - started < 15
        answers = []
        for _ in range(3):  # a call made while the flood is still drained may fail with it
            try:
                answers.append(await host.invoke(_call("h.echo", text="back")))
                break
            except ToolFailure as exc:
                assert "closed the connection" in str(exc), exc
        assert answers == ["back"]
        assert _peak_rss() - baseline < MIB + 32 * MIB
    finally:
        await host.aclose()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["--slow-listing", "--endless-listing"])
async def test_a_listing_that_does_not_end_costs_one_bounded_wait(mode: str) -> None:
    registry = ToolRegistry()
    registry.add_mcp_server("h", command=sys.executable, args=[HOSTILE, "--plain", mode])
    host = ToolHost(registry)
    try:
        started = time.monotonic()
        await host.prepare_tools()  # connects, then gives up on the listing
        assert time.monotonic() - started < LIST_TIMEOUT_S + 30  # + the server's start
        assert host.names() == []
        started = time.monotonic()
        await host.prepare_tools()  # the same connection: not waited on again
        assert time.monotonic() - started < LIST_TIMEOUT_S / 2
    finally:
        await host.aclose()


_BIG_SCRIPT = """
import json, time
started = time.monotonic()
try:
    tools.{server}.big(mib=64)
    out = ["no error"]
except ToolError as exc:
    out = [str(exc)]
out.append(time.monotonic() - started)
out.append(len(tools.{server}.big(mib=1)))
out.append(tools.{server}.echo(text="usable"))
text(json.dumps(out))
"""


async def _through_the_kernel(registry: ToolRegistry, server: str) -> None:
    config = ExecuteCodeConfig(enabled=True, warm_kernels=0, max_rpc_result_bytes=MIB + 4096)
    async with ExecuteCode(config, tools=registry) as tool:
        warm = await tool.run(f"text(tools.{server}.echo(text='warm'))", timeout_ms=60_000)
        assert warm.content.splitlines()[-1] == "warm", warm.content
        baseline = _rss()
        _reset_peak_rss()
        result = await tool.run(_BIG_SCRIPT.format(server=server), timeout_ms=30_000)
        growth = _peak_rss() - baseline
    assert result.details["exit_code"] == 0, result.content
    error, elapsed, size, usable = json.loads(result.content.splitlines()[-1])
    # The host holds at most about one capped message (and the 1 MiB result it sent on).
    assert growth < MIB + 32 * MIB, (growth / MIB, error)
    assert elapsed < 15, (elapsed, error)
    assert error.startswith(f"{server}.big failed: its answer passed "), error
    assert "max_rpc_result_bytes" in error
    assert size == MIB and usable == "usable"


@pytest.mark.slow
@pytest.mark.kernel
async def test_a_64_mib_answer_through_the_kernel_stdio() -> None:
    await _through_the_kernel(_stdio_registry(default_registry(), plain=True), "h")


@pytest.mark.slow
@pytest.mark.kernel
async def test_a_64_mib_answer_through_the_kernel_http(http_big: str) -> None:
    registry = default_registry()
    registry.add_mcp_server("hh", url=http_big)
    await _through_the_kernel(registry, "hh")
