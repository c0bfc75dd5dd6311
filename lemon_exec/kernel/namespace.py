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
import keyword
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from lemon_exec.wire.cell_setup import first_line

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


def attribute_name(name: str) -> bool:
    """Whether ``name`` may be looked up as an attribute of the namespace objects.

    Names with a leading underscore are Python's and its tools' (``__get__``,
    ``_repr_html_``, ``__wrapped__``: pydoc, IPython and copy probe instances for them), so
    no tool answers to one; hosts map upstream names to names without one (docs/tools.md).
    """
    return name.isidentifier() and not name.startswith("_") and not keyword.iskeyword(name)


class _Lookup:
    """Tools as attributes, by explicit lookup in an instance dict.

    The class never gets an attribute from tool data: Python consults class attributes
    implicitly (``__set_name__``, ``__get__``, ``__init_subclass__``, ...), so tool names
    live in ``_members`` and are found by :meth:`__getattr__`, which Python calls only for
    names the class itself does not have.
    """

    __slots__ = ("_members",)
    _members: dict[str, Any]

    def __init__(self, members: Mapping[str, Any]) -> None:
        members = {k: v for k, v in members.items() if attribute_name(k)}
        object.__setattr__(self, "_members", members)

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("_"):  # never answers for Python's own names (or its slots)
            members = object.__getattribute__(self, "_members")
            if name in members:
                return members[name]
        raise AttributeError(f"no tool {name!r} here; tools.search() lists the tools")

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *self._members})

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("the tools namespace is read-only")


class _Server(_Lookup):
    """A tool server's tools, as attributes."""

    __slots__ = ("_server",)
    _server: str

    def __init__(self, server: str, tools: Mapping[str, Callable[..., str]]) -> None:
        object.__setattr__(self, "_server", server)
        super().__init__(tools)

    def __repr__(self) -> str:
        return f"<tools.{self._server}: {len(self._members)} tools; help() lists them>"


class _Tools(_Lookup):
    """Every tool this script can call; ``tools.search(query)`` finds them by keyword."""

    __slots__ = ("_entries",)
    #: (name, listing line, lower-cased haystack); a note has no name.
    _entries: list[tuple[str | None, str, str]]

    def __init__(
        self, members: Mapping[str, Any], entries: list[tuple[str | None, str, str]]
    ) -> None:
        object.__setattr__(self, "_entries", entries)
        super().__init__(members)

    def search(self, query: str = "") -> SearchResults:
        """Tools whose name or description contains every word of ``query`` (any case).

        Each match is ``name(signature) — first line of its description``; an empty query
        lists every tool. Call a match by that name (``tools.gh.search_issues(...)``).
        Upstream tools that could not be offered are listed as notes (``skipped: ...``).
        """
        words = str(query).lower().split()
        return SearchResults(
            line for _name, line, haystack in self._entries if all(w in haystack for w in words)
        )

    def __repr__(self) -> str:
        count = sum(1 for name, _line, _hay in self._entries if name is not None)
        return f"<tools: {count} tools; tools.search(query) finds them>"


def build_namespace(functions: Mapping[str, Callable[..., str]], notes: Iterable[str] = ()) -> Any:
    """The ``tools`` object over ``functions`` (registered name -> function), in that order.

    ``notes`` (upstream tools the host could not offer, and why) are listed by search().
    """
    top: dict[str, Callable[..., str]] = {}
    servers: dict[str, dict[str, Callable[..., str]]] = {}
    entries: list[tuple[str | None, str, str]] = []
    for name, func in functions.items():
        line = listing_line(name, func)
        entries.append((name, line, f"{name} {func.__doc__ or ''}".lower()))
        if "." in name:
            server, tool = name.split(".", 1)
            servers.setdefault(server, {})[tool] = func
        else:
            top[name] = func
    for note in notes:
        line = f"skipped: {note}"
        entries.append((None, line, line.lower()))
    # A tool named like the namespace's own attributes (search) stays a top-level name only.
    members: dict[str, Any] = {name: func for name, func in top.items() if name != "search"}
    for server, tools in servers.items():
        if server not in members:
            members[server] = _server(server, tools)
    lines = [
        "Every tool this script can call. tools.search('keyword') lists matching tools;",
        "help(tools.<server>) lists a server's tools.",
        "",
        *(listing_line(name, func) for name, func in top.items()),
        *(f"tools.{server}: {len(tools)} tools" for server, tools in servers.items()),
    ]
    skipped = len(entries) - len(functions)
    if skipped:
        lines.append(f"{skipped} upstream tools not offered: tools.search('skipped') lists them")
    # A class per object only for help(): its docstring; its attributes are fixed.
    cls = type("tools", (_Tools,), {"__doc__": "\n".join(lines), "__slots__": ()})
    cls.__module__ = "tools"
    return cls(members, entries)


def _server(server: str, tools: dict[str, Callable[..., str]]) -> Any:
    lines = [f"The {len(tools)} tools of server {server!r}; call tools.{server}.<tool>(...).", ""]
    lines += [listing_line(f"{server}.{name}", func) for name, func in tools.items()]
    cls = type("server", (_Server,), {"__doc__": "\n".join(lines), "__slots__": ()})
    cls.__qualname__ = f"tools.{server}"
    cls.__module__ = "tools"
    return cls(server, tools)


def build_functions(
    specs: Iterable[Mapping[str, Any]], caller: Caller
) -> dict[str, Callable[..., str]]:
    """Registered name -> function for each spec; a spec that cannot be built is left out."""
    functions: dict[str, Callable[..., str]] = {}
    for spec in specs:
        if "note" in spec:
            continue
        try:
            functions[str(spec["name"])] = build_function(spec, caller)
        except (KeyError, TypeError, ValueError):
            continue  # a malformed spec from the host: that tool is simply absent
    return functions


def spec_notes(specs: Iterable[Mapping[str, Any]]) -> list[str]:
    """The notes among the specs: upstream tools the host could not offer, and why."""
    return [str(spec["note"]) for spec in specs if "note" in spec]
