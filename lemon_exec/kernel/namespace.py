"""Registered tools as script functions, and the ``tools`` namespace (code mode).

The host describes each registered tool beyond the five (``lemon_exec/tools/_toolset.py``);
this module turns a description into a real function, with an ``inspect.Signature`` and a
docstring, so ``inspect.signature(f)`` and ``help(f)`` work, and builds the ``tools`` object:
``tools.search(query)`` lists matching tools, ``tools.<server>.<tool>(...)`` calls a server's
tool and ``help(tools.<server>)`` lists that server's tools. Standard library only.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from lemon_exec.kernel.protocol import first_line

#: ``caller(registered_name, params) -> str``: sends one helper call to the host.
Caller = Callable[[str, dict[str, Any]], str]

_TYPES: dict[str, type] = {
    t.__name__: t for t in (str, int, float, bool, list, dict, tuple, type(None))
}
_EMPTY = inspect.Parameter.empty


class _Label:
    """An annotation or default shown as the host wrote it (``int | None``, ``Path('.')``)."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def build_function(spec: Mapping[str, Any], caller: Caller) -> Callable[..., str]:
    """A function calling tool ``spec["name"]`` with the spec's signature and docstring.

    Raises ``ValueError`` or ``KeyError`` for a spec no signature can be built from.
    """
    name = str(spec["name"])
    parameters = []
    for param in spec.get("params", ()):
        label = param.get("type")
        annotation: Any = _TYPES.get(label, _Label(label)) if label else _EMPTY
        if param.get("required"):
            default: Any = _EMPTY
        elif "default_repr" in param:
            default = _Label(str(param["default_repr"]))
        else:
            default = param.get("default")
        parameters.append(
            inspect.Parameter(
                str(param["name"]),
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=default,
                annotation=annotation,
            )
        )
    signature = inspect.Signature(parameters, return_annotation=str)

    def tool(*args: Any, **kwargs: Any) -> str:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:  # Python's own wording, with the tool's name
            raise TypeError(f"{name}() {exc}") from None
        bound.apply_defaults()
        # None means "the tool's default", as for the five; a repr-only default is the host's.
        params = {
            key: value
            for key, value in bound.arguments.items()
            if value is not None and not isinstance(value, _Label)
        }
        result = caller(name, params)
        # A tool with structured results (an MCP server's) answers JSON: the script gets objects.
        return json.loads(result) if spec.get("result") == "json" else result

    short = name.rsplit(".", 1)[-1]
    tool.__name__ = short
    tool.__qualname__ = name
    tool.__module__ = "tools"
    tool.__signature__ = signature  # type: ignore[attr-defined]
    doc = str(spec.get("doc") or "").strip()
    tool.__doc__ = (doc + "\n\n" if doc else "") + (
        f"Runs the host tool {name!r}; raises ToolError on denial, failure or a budget limit."
    )
    return tool


def listing_line(name: str, func: Callable[..., Any]) -> str:
    """``name(params) — first line of the docstring``: one entry of search() and help()."""
    signature = inspect.signature(func)
    # The five helpers' annotations are strings (postponed evaluation): show them unquoted.
    params = [
        p.replace(annotation=_Label(p.annotation)) if isinstance(p.annotation, str) else p
        for p in signature.parameters.values()
    ]
    signature = signature.replace(parameters=params, return_annotation=_EMPTY)
    summary = first_line(func.__doc__)
    return f"{name}{signature}" + (f" — {summary}" if summary else "")


class SearchResults(list[str]):
    """tools.search()'s matches: a list of lines that prints one entry per line."""

    def __str__(self) -> str:
        return "\n".join(self) if self else "(no matching tools)"


class _ServerBase:
    """A tool server's tools, as attributes."""

    __slots__ = ()  # keeps help() to the tools (no __dict__ / __weakref__ entries)
    _tools = {}  # type: ignore[var-annotated]  # (set per server; unannotated for help())

    def __repr__(self) -> str:
        return f"<tools.{type(self).__name__}: {len(self._tools)} tools; help() lists them>"


class _ToolsBase:
    """Every tool this script can call; ``tools.search(query)`` finds them by keyword."""

    __slots__ = ()
    _entries = []  # type: ignore[var-annotated]  # (name, listing line, lower-cased haystack)

    def search(self, query: str = "") -> SearchResults:
        """Tools whose name or description contains every word of ``query`` (any case).

        Each match is ``name(signature) — first line of its description``; an empty query
        lists every tool. Call a match by that name (``tools.gh.search_issues(...)``).
        """
        words = str(query).lower().split()
        return SearchResults(
            line for _name, line, haystack in self._entries if all(w in haystack for w in words)
        )

    def __repr__(self) -> str:
        return f"<tools: {len(self._entries)} tools; tools.search(query) finds them>"


def build_namespace(functions: Mapping[str, Callable[..., str]]) -> Any:
    """The ``tools`` object over ``functions`` (registered name -> function), in that order."""
    top: dict[str, Callable[..., str]] = {}
    servers: dict[str, dict[str, Callable[..., str]]] = {}
    entries: list[tuple[str, str, str]] = []
    for name, func in functions.items():
        line = listing_line(name, func)
        entries.append((name, line, f"{name} {func.__doc__ or ''}".lower()))
        if "." in name:
            server, tool = name.split(".", 1)
            servers.setdefault(server, {})[tool] = func
        else:
            top[name] = func
    # A tool named like the namespace's own attributes (search) stays a top-level name only.
    attrs: dict[str, Any] = {
        name: staticmethod(func) for name, func in top.items() if not hasattr(_ToolsBase, name)
    }
    for server, tools in servers.items():
        attrs[server] = _server(server, tools)
    lines = [
        "Every tool this script can call. tools.search('keyword') lists matching tools;",
        "help(tools.<server>) lists a server's tools.",
        "",
        *(listing_line(name, func) for name, func in top.items()),
        *(f"tools.{server}: {len(tools)} tools" for server, tools in servers.items()),
    ]
    doc = "\n".join(lines)
    cls = type(
        "tools", (_ToolsBase,), {**attrs, "__doc__": doc, "_entries": entries, "__slots__": ()}
    )
    cls.__module__ = "tools"
    return cls()


def _server(server: str, tools: dict[str, Callable[..., str]]) -> Any:
    lines = [f"The {len(tools)} tools of server {server!r}; call tools.{server}.<tool>(...).", ""]
    lines += [listing_line(f"{server}.{name}", func) for name, func in tools.items()]
    attrs: dict[str, Any] = {
        name: staticmethod(func) for name, func in tools.items() if not hasattr(_ServerBase, name)
    }
    doc = "\n".join(lines)
    cls = type(server, (_ServerBase,), {**attrs, "__doc__": doc, "_tools": tools, "__slots__": ()})
    cls.__module__ = "tools"
    return cls()


def build_functions(
    specs: Iterable[Mapping[str, Any]], caller: Caller
) -> dict[str, Callable[..., str]]:
    """Registered name -> function for each spec; a spec that cannot be built is left out."""
    functions: dict[str, Callable[..., str]] = {}
    for spec in specs:
        try:
            functions[str(spec["name"])] = build_function(spec, caller)
        except (KeyError, TypeError, ValueError):
            continue  # a malformed spec from the host: that tool is simply absent
    return functions
