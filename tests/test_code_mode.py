"""Issue 14 items 1 and 3: registered tools are helpers, and the ``tools`` namespace.

Real kernels: one shared session-mode facade whose registry holds a host-defined tool
(``search_issues``) and a server tool (``gh.search_issues``), plus a per-call facade for the
narrowing and budget rules. Registry checks and the once-per-kernel spec cache are pure logic.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from lemon_exec import ExecuteCode, ExecuteCodeConfig, SessionScope
from lemon_exec.tools import (
    ApprovalOutcome,
    PolicyDecision,
    ToolCall,
    ToolRegistry,
    default_registry,
)
from lemon_exec.tools._toolset import toolset

pytestmark = [pytest.mark.timeout(90), pytest.mark.kernel]

DOCS = Path(__file__).resolve().parents[1] / "docs" / "tools.md"


def search_issues(params: dict[str, Any], call: ToolCall) -> str:
    return f"{params['query']}:{params.get('limit')}"


async def gh_search(params: dict[str, Any], call: ToolCall) -> str:
    return f"gh:{params['query']}"


def make_registry() -> ToolRegistry:
    registry = default_registry()
    registry.register_function(
        "search_issues",
        search_issues,
        parameters=("query", "limit"),
        required=("query",),
        param_types={"query": str, "limit": int},
        defaults={"limit": 5},
        description="Search the issue tracker.\nReturns one issue per line.",
    )
    registry.register_function(
        "gh.search_issues",
        gh_search,
        parameters=("query",),
        required=("query",),
        param_types={"query": str},
        description="Search GitHub issues by keyword.",
    )
    return registry


approvals: list[str] = []


def policy(call: ToolCall) -> PolicyDecision:
    if call.params.get("query") == "forbidden":
        return PolicyDecision.deny("no forbidden queries")
    return PolicyDecision.allow()


async def approval(call: ToolCall) -> ApprovalOutcome:
    approvals.append(f"{call.tool}:{call.params.get('query')}")
    return ApprovalOutcome.DENIED if call.params["query"] == "reject" else ApprovalOutcome.APPROVED


def needs_approval(call: ToolCall) -> bool:
    return call.params.get("query") in ("reject", "ask")


@pytest.fixture(scope="module")
def registry() -> ToolRegistry:
    return make_registry()


@pytest.fixture(scope="module")
def ec(registry: ToolRegistry) -> Iterator[ExecuteCode]:
    facade = ExecuteCode(
        ExecuteCodeConfig(enabled=True, warm_kernels=0, kernel_mode="session"),
        tools=registry,
        policy=policy,
        approval=approval,
        approval_required=needs_approval,
    )
    yield facade
    facade.close()


@pytest.fixture(scope="module")
def scope(tmp_path_factory: pytest.TempPathFactory) -> SessionScope:
    return SessionScope("code-mode", "agent", cwd=str(tmp_path_factory.mktemp("code-mode")))


def last_json(content: str) -> Any:
    return json.loads(content.strip().splitlines()[-1])


def run_json(ec: ExecuteCode, scope: SessionScope, script: str) -> Any:
    result = ec.run_sync(script + "\nprint(json.dumps(out))", scope=scope)
    assert "Traceback" not in result.content, result.content
    return last_json(result.content)


def test_registered_tool_is_a_helper_by_name_and_in_batch(
    ec: ExecuteCode, scope: SessionScope
) -> None:
    out = run_json(
        ec,
        scope,
        "import json\n"
        "out = [search_issues('bug'), search_issues('bug', limit=2),\n"
        "       search_issues(query='q', limit=None),\n"
        "       tools.search_issues('t'), tools.gh.search_issues(query='x'),\n"
        "       batch([('search_issues', {'query': 'b1'}),\n"
        "              ('gh.search_issues', {'query': 'b2'})])]",
    )
    # The signature's default (limit=5) is sent; None means the tool's own default.
    assert out == ["bug:5", "bug:2", "q:None", "t:5", "gh:x", ["b1:5", "gh:b2"]]


def test_signature_help_and_wrong_arguments(ec: ExecuteCode, scope: SessionScope) -> None:
    out = run_json(
        ec,
        scope,
        "import inspect, json, pydoc\n"
        "out = [str(inspect.signature(search_issues)),\n"
        "       str(inspect.signature(tools.gh.search_issues)),\n"
        "       pydoc.render_doc(search_issues, renderer=pydoc.plaintext),\n"
        "       pydoc.render_doc(tools.gh, renderer=pydoc.plaintext)]\n"
        "for bad in (lambda: search_issues(), lambda: search_issues('a', nope=1),\n"
        "            lambda: batch([('search_issues', {'limit': 1})])):\n"
        "    try:\n"
        "        bad()\n"
        "    except (TypeError, ToolError) as e:\n"
        "        out.append(f'{type(e).__name__}: {e}')\n"
        "help(search_issues)",
    )
    assert out[0] == "(query: str, limit: int = 5) -> str"
    assert out[1] == "(query: str) -> str"
    assert "Search the issue tracker." in out[2] and "Returns one issue per line." in out[2]
    assert "gh.search_issues(query: str) — Search GitHub issues by keyword." in out[3]
    assert out[4] == "TypeError: search_issues() missing a required argument: 'query'"
    assert out[5] == "TypeError: search_issues() got an unexpected keyword argument 'nope'"
    assert (
        out[6] == "ToolError: batch() item 0: search_issues() missing a required argument: 'query'"
    )


def test_help_prints_the_description(ec: ExecuteCode, scope: SessionScope) -> None:
    result = ec.run_sync("help(search_issues)\nhelp(tools.gh)", scope=scope)
    assert "Search the issue tracker." in result.content
    assert "search_issues(query: str, limit: int = 5) -> str" in result.content
    assert "gh.search_issues(query: str)" in result.content


def test_policy_and_approval_apply(ec: ExecuteCode, scope: SessionScope) -> None:
    approvals.clear()
    out = run_json(
        ec,
        scope,
        "import json\n"
        "out = []\n"
        "for call in (lambda: search_issues('forbidden'), lambda: search_issues('reject'),\n"
        "             lambda: tools.gh.search_issues('reject'), lambda: search_issues('ask'),\n"
        "             lambda: batch([('gh.search_issues', {'query': 'forbidden'})])):\n"
        "    try:\n"
        "        out.append(call())\n"
        "    except ToolError as e:\n"
        "        out.append(str(e))",
    )
    assert out == [
        "search_issues denied by policy: no forbidden queries",
        "search_issues call was denied by the user",
        "gh.search_issues call was denied by the user",
        "ask:5",
        "gh.search_issues denied by policy: no forbidden queries",
    ]
    assert approvals == ["search_issues:reject", "gh.search_issues:reject", "search_issues:ask"]


def test_calls_are_counted(ec: ExecuteCode, scope: SessionScope) -> None:
    result = ec.run_sync(
        "search_issues('a'); tools.gh.search_issues('b')\n"
        "batch([('search_issues', {'query': 'c'})])",
        scope=scope,
    )
    assert result.details["rpc_calls"] == 3
    assert result.details["rpc_tools"] == ["gh.search_issues", "search_issues"]


def test_search_finds_tools_and_help_lists_a_server(ec: ExecuteCode, scope: SessionScope) -> None:
    out = run_json(
        ec,
        scope,
        "import json, pydoc\n"
        "out = [list(tools.search('issue')), list(tools.search('GITHUB keyword')),\n"
        "       str(tools.search('no-such-thing')), 'gh' in dir(tools), repr(tools.gh),\n"
        "       pydoc.render_doc(tools, renderer=pydoc.plaintext)]",
    )
    assert out[0] == [
        "search_issues(query: str, limit: int = 5) — Search the issue tracker.",
        "gh.search_issues(query: str) — Search GitHub issues by keyword.",
    ]
    assert out[1] == ["gh.search_issues(query: str) — Search GitHub issues by keyword."]
    assert out[2] == "(no matching tools)"
    assert out[3] is True
    assert out[4] == "<tools.gh: 1 tools; help() lists them>"
    assert "tools.gh: 1 tools" in out[5] and "read(path: str" in out[5]


def test_schema_names_tools_and_servers(ec: ExecuteCode) -> None:
    description = ec.schema()["description"]
    assert "- search_issues(query: str, limit: int = 5) -> str: Search the issue tracker." in (
        description
    )
    assert "tools.gh: 1 tools of server 'gh'; help(tools.gh) lists them" in description
    assert "tools.search(query)" in description
    assert "Search GitHub issues" not in description  # a server's tools cost nothing up front
    assert ec.schema() == ec.schema()


def test_a_tool_registered_later_reaches_the_same_kernel(
    ec: ExecuteCode, scope: SessionScope, registry: ToolRegistry
) -> None:
    pid = ec.run_sync("import os; print(os.getpid())", scope=scope).content
    registry.register_function(
        "gh.close_issue",
        gh_search,
        parameters=("query",),
        required=("query",),
        description="Close an issue.",
    )
    out = run_json(
        ec,
        scope,
        "import json, os\n"
        "out = [tools.gh.close_issue('7'), str(os.getpid()), len(tools.search(''))]",
    )
    assert out[:2] == ["gh:7", pid.strip().splitlines()[-1]]
    assert out[2] == 5 + 3  # the five, search_issues, gh.search_issues, gh.close_issue


def test_config_narrows_extra_tools_and_budget_counts(tmp_path: Path) -> None:
    config = ExecuteCodeConfig(
        enabled=True, warm_kernels=0, fork_server=False, tools=["read", "gh"], max_rpc_calls=2
    )
    with ExecuteCode(config, tools=make_registry()) as facade:
        assert "search_issues(query" not in facade.schema()["description"].split("tools.gh")[0]
        result = facade.run_sync(
            "import json\n"
            "out = ['search_issues' in globals(), [n.split('(')[0] for n in tools.search('')]]\n"
            "for call in (lambda: tools.gh.search_issues('a'), lambda: read('.'),\n"
            "             lambda: tools.gh.search_issues('b'),\n"
            "             lambda: batch([('search_issues', {'query': 'c'})])):\n"
            "    try:\n"
            "        out.append(call())\n"
            "    except ToolError as e:\n"
            "        out.append(str(e))\n"
            "print(json.dumps(out))"
        )
    out = last_json(result.content)
    assert out[0] is False
    assert out[1] == ["read", "gh.search_issues"]
    assert out[2] == "gh:a"
    assert out[3].startswith("read: ")  # a directory: the tool's own error, but a call
    assert out[4] == "rpc call limit exceeded (max 2 calls per script)"
    assert out[5] == "batch() item 0: unknown or disabled helper 'search_issues'"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("print", "would shadow a Python builtin"),
        ("text", "would shadow a Python builtin or a name scripts rely on"),
        ("tools", "would shadow"),
        ("open.x", "would shadow"),
        ("read.x", "server name 'read' is taken"),
        ("search.x", "server name 'search' is taken"),
        ("a.b.c", "two identifiers joined by one dot"),
        ("gh.class", "two identifiers joined by one dot"),
        ("gh-x.y", "two identifiers joined by one dot"),
        ("", "two identifiers joined by one dot"),
    ],
)
def test_registry_refuses_names_that_cannot_be_helpers(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        ToolRegistry().register_function(name, search_issues, parameters=())


def test_registry_refuses_a_name_both_tool_and_server() -> None:
    registry = ToolRegistry()
    registry.register_function("gh", search_issues, parameters=())
    with pytest.raises(ValueError, match="already a top-level tool name"):
        registry.register_function("gh.x", search_issues, parameters=())
    registry.register_function("jira.x", search_issues, parameters=())
    with pytest.raises(ValueError, match="already a server of registered tools"):
        registry.register_function("jira", search_issues, parameters=())


def test_specs_are_sent_once_per_kernel_and_again_after_a_change() -> None:
    registry = make_registry()

    class Kernel:  # a stand-in handle: only its identity matters here
        pass

    first, second = Kernel(), Kernel()
    tools = toolset(registry, None)
    assert tools.names == ("search_issues", "gh.search_issues")
    digest, specs = tools.setup_for(first)
    assert digest and specs is not None and [s["name"] for s in specs] == list(tools.names)
    assert toolset(registry, None).setup_for(first) == (digest, None)
    assert toolset(registry, None).setup_for(second) == (digest, specs)
    registry.register_function("jira.x", search_issues, parameters=())
    changed = toolset(registry, None)
    new_digest, new_specs = changed.setup_for(first)
    assert new_digest != digest and new_specs is not None and len(new_specs) == 3
    assert toolset(registry, ["gh"]).names == ("gh.search_issues",)
    assert toolset(registry, ["read"]).names == ()
    assert toolset(default_registry(), None).setup_for(first) == (None, None)


def test_docs_example_runs_as_written() -> None:
    """docs/tools.md's code-mode example: its registry, script and the output it shows."""
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)
    example = next(b for b in blocks if "ExecuteCode(" in b and "search_issues" in b)
    stdout = io.StringIO()
    with redirect_stdout(stdout):
        exec(compile(example, str(DOCS), "exec"), {"__name__": "docs_example"})
    shown = re.search(r"It prints:\n\n```text\n(.*?)```", DOCS.read_text(), re.S)
    assert shown is not None
    for line in shown.group(1).strip().splitlines():
        assert line in stdout.getvalue(), (line, stdout.getvalue())


def test_tool_failure_message_reaches_the_script(ec: ExecuteCode, scope: SessionScope) -> None:
    out = run_json(
        ec,
        scope,
        "import json\ntry:\n    search_issues('x', limit='many')\nexcept ToolError as e:\n"
        "    out = [str(e)]",
    )
    assert out == ["search_issues() argument 'limit' must be int, not str"]


def test_kernel_install_refuses_an_unknown_digest_and_removes_gone_tools() -> None:
    """Kernel-side logic, in process: specs come once per digest; gone tools leave."""
    from lemon_exec.kernel import helpers

    spec = {"name": "lookup", "doc": "Look up.", "params": [{"name": "key", "required": True}]}
    namespace: dict[str, Any] = {"mine": 1}
    try:
        helpers.install(namespace, None, "d1", [spec])
        assert "lookup" in namespace and "lookup" in dir(namespace["tools"])
        helpers.install(namespace, None, "d1", None)  # the same digest: no specs needed
        assert "lookup" in namespace
        with pytest.raises(helpers.ToolSetupError, match="never received"):
            helpers.install(namespace, None, "d2", None)
        helpers.install(namespace, ("read",), None, None)
        assert "lookup" not in namespace and "grep" not in namespace
        assert namespace["mine"] == 1 and namespace["tools"].search("") == [
            "read(path: str, offset: int | None = None, limit: int | None = None) — "
            "Return the text of a file; ``offset`` is a 1-based start line, ``limit`` a line "
            "count."
        ]
    finally:
        helpers.install({}, None)  # leave the module as a fresh kernel has it
