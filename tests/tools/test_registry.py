"""ToolRegistry, ToolSpec/ToolCall basics and ToolHost.describe()."""

from __future__ import annotations

import pathlib

import pytest

from lemon_exec.tools import ToolCall, ToolHost, ToolRegistry, ToolSpec, default_registry

pytestmark = pytest.mark.timeout(10)


def _echo(params: dict, call: ToolCall) -> str:
    return repr(params)


def test_default_registry_has_the_five_tools_in_order() -> None:
    registry = default_registry()
    assert registry.names() == ["read", "grep", "find", "ls", "webfetch"]
    for name in registry.names():
        assert name in registry
        spec = registry.get(name)
        assert spec is not None and spec.description


def test_default_registry_is_new_each_time() -> None:
    a, b = default_registry(), default_registry()
    a.register_function("extra", _echo, parameters=("x",))
    assert "extra" in a and "extra" not in b


def test_register_get_contains() -> None:
    registry = ToolRegistry()
    spec = registry.register(ToolSpec("echo", _echo, "Echo.", ("a", "b"), ("a",)))
    assert registry.get("echo") is spec
    assert registry.get("missing") is None
    assert "echo" in registry and "missing" not in registry
    assert len(registry) == 1


def test_register_function_builds_a_spec() -> None:
    registry = ToolRegistry()
    spec = registry.register_function(
        "echo",
        _echo,
        parameters=["a", "b"],
        required=["a"],
        description="Echo.",
        param_types={"a": str},
        defaults={"b": 3},
    )
    assert spec == registry.get("echo")
    assert spec.parameters == ("a", "b") and spec.required == ("a",)
    assert spec.param_types == {"a": str} and spec.defaults == {"b": 3}


def test_duplicate_name_needs_replace() -> None:
    registry = default_registry()
    with pytest.raises(ValueError, match="already registered"):
        registry.register_function("read", _echo, parameters=("path",))
    registry.register_function("read", _echo, parameters=("path",), replace=True)
    spec = registry.get("read")
    assert spec is not None and spec.func is _echo


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "not valid", "parameters": ()}, "identifier"),
        ({"name": "class", "parameters": ()}, "identifier"),
        ({"name": "_t", "parameters": ()}, "starts with '_'"),
        ({"name": "gh.__get__", "parameters": ()}, "starts with '_'"),
        ({"name": "t", "parameters": ("a-b",)}, "not a Python identifier"),
        ({"name": "t", "parameters": ("a", "a")}, "duplicate"),
        ({"name": "t", "parameters": ("a", "b"), "required": ("b",)}, "first parameters"),
        ({"name": "t", "parameters": ("a",), "param_types": {"z": int}}, "not one of"),
        ({"name": "t", "parameters": ("a",), "required": ("a",), "defaults": {"a": 1}}, "default"),
    ],
)
def test_malformed_specs_are_rejected(kwargs: dict, message: str) -> None:
    registry = ToolRegistry()
    with pytest.raises(ValueError, match=message):
        registry.register_function(func=_echo, **kwargs)
    assert registry.names() == []


def test_non_callable_func_is_rejected() -> None:
    with pytest.raises(ValueError, match="not callable"):
        ToolRegistry().register(ToolSpec("t", "nope", parameters=()))  # type: ignore[arg-type]


def test_toolcall_is_frozen_and_coerces_cwd() -> None:
    call = ToolCall("read", {"path": "x"}, "/tmp", 7)  # type: ignore[arg-type]
    assert call.cwd == pathlib.Path("/tmp")
    with pytest.raises(AttributeError):
        call.tool = "grep"  # type: ignore[misc]


def test_host_names_and_describe() -> None:
    host = ToolHost(default_registry())
    assert host.names() == ["read", "grep", "find", "ls", "webfetch"]
    d = host.describe("grep")
    assert (
        d["signature"] == "grep(pattern, path='.', glob=None, ignore_case=False, max_results=None)"
    )
    assert d["parameters"] == ["pattern", "path", "glob", "ignore_case", "max_results"]
    assert d["required"] == ["pattern"]
    assert d["types"]["ignore_case"] == "bool"
    assert "200" in d["description"]
    assert host.describe("read")["signature"] == "read(path, offset=None, limit=None)"
    with pytest.raises(KeyError):
        host.describe("nope")
