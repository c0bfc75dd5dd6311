"""The package's floors, checked from its own source: which folder may import which.

Every ``import`` and ``from ... import`` in every module is read with :mod:`ast` (nothing is
imported or run), wherever it stands: at the top, inside a function (a lazy import is still an
import), under ``TYPE_CHECKING``. ``importlib.import_module("lemon_exec....")`` and
``__import__`` with a literal name count too. ``from pkg import name`` is an import of the
module ``pkg.name`` when that module exists, else of ``pkg``. The architecture these rules
describe is drawn in docs/architecture.md.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "lemon_exec"
SOURCE_ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 450


@dataclass(frozen=True)
class Floor:
    name: str
    modules: tuple[str, ...]  # a module, or a folder with everything under it
    may_import: tuple[str, ...]  # other floors; a floor may always import itself
    job: str


def floor(name: str, modules: str, may_import: str, job: str) -> Floor:
    """``modules``: names under lemon_exec (``.`` is the package itself); ``may_import``:
    the floors this one stands on (it may always import itself)."""
    dotted = tuple(PACKAGE if m == "." else f"{PACKAGE}.{m}" for m in modules.split())
    return Floor(name, dotted, tuple(may_import.split()), job)


_BASE = "package ground"
_HOST_BASE = f"{_BASE} template services"
_HOST_CELL = "host.disk host.kernels host.cell"  # what stands under percall and sessions
_HOST_BELOW_RUN = f"{_HOST_CELL} host.percall host.sessions"

#: The floors, bottom up (docs/architecture.md draws them). A module is on the floor that
#: names it or its closest folder.
FLOORS = (
    # lemon_exec/__init__.py imports nothing at run time, so any floor may import it;
    # ``from lemon_exec import Name`` counts as an import of the module that defines Name.
    floor("package", ".", "", "the public names, loaded lazily"),
    floor(
        "ground",
        "_constants _sizes errors details envelope result images scope interpreter wire proc",
        "package",
        "what both sides share: the protocol, process and private-disk primitives, errors",
    ),
    floor("kernel", "kernel", _BASE, "the lemon-python kernel: never the host side"),
    floor("template", "template", f"{_BASE} kernel", "the fork server and its host client"),
    floor("services", "tools config telemetry schema", _BASE, "helpers, settings, telemetry"),
    floor("host", "host", "", "host/__init__.py: the folder's docstring only"),
    floor("host.disk", "host.disk", _HOST_BASE, "staging, runtime dirs, reaper, index"),
    floor("host.kernels", "host.kernels", f"{_HOST_BASE} host.disk", "the backend seam"),
    floor("host.cell", "host.cell", f"{_HOST_BASE} host.disk host.kernels", "one cell"),
    floor("host.percall", "host.percall", f"{_HOST_BASE} {_HOST_CELL}", "admission, spares"),
    floor("host.sessions", "host.sessions", f"{_HOST_BASE} {_HOST_CELL}", "sessions, queues"),
    floor(
        "host.playground",
        "host.playground",
        f"{_HOST_BASE} {_HOST_CELL}",
        "the host a kernel starts for itself when no host started it",
    ),
    floor(
        "host.run",
        "host.run",
        f"{_HOST_BASE} {_HOST_BELOW_RUN}",
        "the runner both entry points call: per-call and session runs, validation, results",
    ),
    floor(
        "entry",
        "facade session jobs shell",
        f"{_HOST_BASE} {_HOST_BELOW_RUN} host.run",
        "the public ways in: ExecuteCode, SessionOwner, Job, the shell tool",
    ),
    floor(
        "front",
        "mcp notebooks viewer cli __main__",
        f"{_HOST_BASE} kernel {_HOST_BELOW_RUN} host.run entry",
        "what users run: the MCP server, notebooks, the Jupyter Server viewer, the CLI",
    ),
)


@dataclass(frozen=True)
class Allowed:
    importer: str
    kind: str
    reason: str


#: The only imports that break a floor rule, and why.
ALLOWED = (
    Allowed(
        "lemon_exec",
        "TYPE_CHECKING",
        "the public names for type checkers and IDEs; at run time they load lazily through "
        "__getattr__ (tests/test_public_api.py checks that importing lemon_exec imports none)",
    ),
)


@dataclass(frozen=True)
class Import:
    importer: str
    path: Path
    line: int
    statement: str
    target: str
    kind: str  # "top", "lazy" (inside a function), "TYPE_CHECKING", "dynamic"

    def where(self) -> str:
        return f"{self.path.relative_to(SOURCE_ROOT)}:{self.line}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SOURCE_ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((SOURCE_ROOT / PACKAGE).rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _literal_prefix(node: ast.expr) -> str | None:
    """The module name a dynamic import names, or the package its literal prefix names."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    head: ast.expr | None = None
    if isinstance(node, ast.JoinedStr) and node.values:
        head = node.values[0]
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        head = node.left
    if isinstance(head, ast.Constant) and isinstance(head.value, str):
        return head.value.rpartition(".")[0] or head.value
    return None


def public_names(root: ast.Module) -> dict[str, str]:
    """Each public name and the module that defines it: the TYPE_CHECKING block of
    lemon_exec/__init__.py (the one list of public names)."""
    names: dict[str, str] = {}
    for node in root.body:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for statement in node.body:
                if isinstance(statement, ast.ImportFrom) and statement.module:
                    for alias in statement.names:
                        names[alias.asname or alias.name] = statement.module
    return names


class _Collector:
    """The lemon_exec imports of one module, walking its statements (fast: expressions are
    searched only in a module whose text mentions a dynamic import or a public name)."""

    def __init__(
        self, module: str, path: Path, known: dict[str, Path], public: dict[str, str], text: str
    ) -> None:
        self.module, self.path, self.known, self.public = module, path, known, public
        self.is_package = path.name == "__init__.py"
        self.found: list[Import] = []
        words = ("import_module", "__import__", *(f"{PACKAGE}.{name}" for name in public))
        self.scan_expressions = any(word in text for word in words)

    def visit(self, node: ast.AST, kind: str = "top") -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                self._add(node, alias.name, kind)
        elif isinstance(node, ast.ImportFrom):
            for target in self._from_targets(node):
                self._add(node, target, kind)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                self.visit(child, "TYPE_CHECKING")
            for child in node.orelse:
                self.visit(child, kind)
        elif isinstance(node, ast.expr):
            if self.scan_expressions:
                self._expression(node, kind)
        else:
            is_function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            body_kind = "lazy" if is_function and kind == "top" else kind
            for field, value in ast.iter_fields(node):
                for child in value if isinstance(value, list) else [value]:
                    if isinstance(child, ast.AST):
                        self.visit(child, body_kind if field == "body" else kind)

    def _from_targets(self, node: ast.ImportFrom) -> Iterator[str]:
        base = node.module or ""
        if node.level:
            package = self.module if self.is_package else self.module.rpartition(".")[0]
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            base = f"{package}.{base}" if base else package
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            if base == PACKAGE and alias.name == "*":
                yield from sorted(set(self.public.values()))
            elif submodule in self.known:
                yield submodule
            elif base == PACKAGE and alias.name in self.public:
                yield self.public[alias.name]
            else:
                yield base

    def _expression(self, expression: ast.expr, kind: str) -> None:
        for node in ast.walk(expression):
            if isinstance(node, ast.Call) and node.args:
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                target = _literal_prefix(node.args[0])
                if name in ("import_module", "__import__") and target is not None:
                    self._add(node, target, "dynamic")
            elif (
                # ``import lemon_exec`` then ``lemon_exec.Name``: an import of Name's module.
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == PACKAGE
                and node.attr in self.public
            ):
                self._add(node, self.public[node.attr], kind)

    def _add(self, node: ast.AST, target: str, kind: str) -> None:
        if target == PACKAGE or target.startswith(PACKAGE + "."):
            line = getattr(node, "lineno", 0)
            text = ast.unparse(node).splitlines()[0]
            self.found.append(Import(self.module, self.path, line, text, target, kind))


@functools.cache
def collect() -> tuple[dict[str, Path], list[Import]]:
    known = _modules()
    texts = {module: path.read_text(encoding="utf-8") for module, path in known.items()}
    trees = {module: ast.parse(text, str(known[module])) for module, text in texts.items()}
    public = public_names(trees[PACKAGE])
    imports: list[Import] = []
    for module, path in known.items():
        collector = _Collector(module, path, known, public, texts[module])
        collector.visit(trees[module])
        imports.extend(collector.found)
    return known, imports


def floor_of(module: str) -> Floor:
    best: tuple[int, Floor] | None = None
    for floor in FLOORS:
        for entry in floor.modules:
            inside = module.startswith(entry + ".") and entry != PACKAGE  # "." is one module
            if (module == entry or inside) and (best is None or len(entry) > best[0]):
                best = (len(entry), floor)
    assert best is not None, f"{module} is on no floor: add it to FLOORS"
    return best[1]


def layer_violations(imports: list[Import]) -> list[str]:
    problems: list[str] = []
    for imp in imports:
        source, target = floor_of(imp.importer), floor_of(imp.target)
        if source is target or target.name in source.may_import:
            continue
        if any(a.importer == imp.importer and a.kind == imp.kind for a in ALLOWED):
            continue
        allowed = ", ".join((source.name, *source.may_import)) if source.may_import else "nothing"
        problems.append(
            f"{imp.where()}: `{imp.statement}` ({imp.kind} import of {imp.target}): "
            f"floor {source.name!r} may import only {allowed}; {imp.target} is on floor "
            f"{target.name!r}"
        )
    return problems


def _strongly_connected(graph: dict[str, set[str]]) -> Iterator[list[str]]:
    """Tarjan's algorithm, iterative; yields each component of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    yield sorted(component)


def cycles(known: dict[str, Path], imports: list[Import]) -> list[str]:
    """Import cycles between modules; lazy imports count, TYPE_CHECKING ones cannot run."""
    graph: dict[str, set[str]] = {module: set() for module in known}
    edges: dict[tuple[str, str], Import] = {}
    for imp in imports:
        if imp.kind != "TYPE_CHECKING" and imp.target in graph and imp.target != imp.importer:
            graph[imp.importer].add(imp.target)
            edges.setdefault((imp.importer, imp.target), imp)
    problems = []
    for component in _strongly_connected(graph):
        members = set(component)
        links = [
            f"    {imp.where()}: `{imp.statement}` ({imp.kind})"
            for (source, target), imp in sorted(edges.items(), key=lambda e: (e[1].path, e[1].line))
            if source in members and target in members
        ]
        problems.append(f"import cycle between {', '.join(component)}:\n" + "\n".join(links))
    return problems


def test_every_import_stays_on_its_floor_or_goes_down() -> None:
    _, imports = collect()
    problems = layer_violations(imports)
    assert not problems, "imports that break the floor rules:\n" + "\n".join(problems)


def test_no_import_cycles() -> None:
    known, imports = collect()
    problems = cycles(known, imports)
    assert not problems, "\n".join(problems)


def test_no_module_is_too_long() -> None:
    too_long = []
    for path in _modules().values():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_MODULE_LINES:
            too_long.append(
                f"{path.relative_to(SOURCE_ROOT)}: {lines} lines, over {MAX_MODULE_LINES}: "
                "split it, one job per module"
            )
    assert not too_long, "\n".join(too_long)


def test_every_module_is_on_a_floor_and_the_floors_are_consistent() -> None:
    names = [floor.name for floor in FLOORS]
    assert len(names) == len(set(names))
    for floor in FLOORS:
        unknown = set(floor.may_import) - set(names)
        assert not unknown, f"floor {floor.name!r} names unknown floors {sorted(unknown)}"
    for module in _modules():
        floor_of(module)
    _, imports = collect()
    for allowed in ALLOWED:  # an exception nothing needs any more goes
        assert any(i.importer == allowed.importer and i.kind == allowed.kind for i in imports)


# --- the checker itself, on small made-up modules ----------------------------------------------


def _imports_of(source: str, module: str = "lemon_exec.kernel.example") -> list[Import]:
    known = {
        module: SOURCE_ROOT / "lemon_exec/kernel/example.py",
        "lemon_exec.host.disk.hygiene": SOURCE_ROOT / "lemon_exec/host/disk/hygiene.py",
        "lemon_exec.host.disk": SOURCE_ROOT / "lemon_exec/host/disk/__init__.py",
        "lemon_exec.wire.protocol": SOURCE_ROOT / "lemon_exec/wire/protocol.py",
    }
    public = {"ExecuteCode": "lemon_exec.facade"}
    collector = _Collector(module, known[module], known, public, source)
    collector.visit(ast.parse(source))
    return collector.found


def test_the_checker_sees_lazy_type_checking_relative_and_dynamic_imports() -> None:
    found = _imports_of(
        "from typing import TYPE_CHECKING\n"
        "import os\n"
        "from ..wire import protocol\n"
        "if TYPE_CHECKING:\n"
        "    from lemon_exec.host.disk import hygiene\n"
        "def later():\n"
        "    import lemon_exec.host.disk.hygiene\n"
        "    importlib.import_module('lemon_exec.config')\n"
        "    __import__(f'lemon_exec.cli.{name}')\n"
        "    import lemon_exec\n"
        "    return lemon_exec.__file__, lemon_exec.ExecuteCode\n"
        "from lemon_exec import ExecuteCode\n"
        "from lemon_exec import *\n"
    )
    assert [(i.line, i.target, i.kind) for i in found] == [
        (3, "lemon_exec.wire.protocol", "top"),
        (5, "lemon_exec.host.disk.hygiene", "TYPE_CHECKING"),
        (7, "lemon_exec.host.disk.hygiene", "lazy"),
        (8, "lemon_exec.config", "dynamic"),
        (9, "lemon_exec.cli", "dynamic"),
        (10, "lemon_exec", "lazy"),
        (11, "lemon_exec.facade", "lazy"),
        (12, "lemon_exec.facade", "top"),
        (13, "lemon_exec.facade", "top"),
    ]
    problems = layer_violations(found)
    assert len(problems) == 7  # all but the ground import and the bare package
    assert problems[0].startswith("lemon_exec/kernel/example.py:5: `from lemon_exec.host.disk")
    assert "floor 'kernel' may import only kernel, package, ground;" in problems[0]
    assert "on floor 'host.disk'" in problems[0]


def test_the_checker_finds_a_cycle_through_a_lazy_import_but_not_type_checking() -> None:
    paths = {name: SOURCE_ROOT / f"{name.replace('.', '/')}.py" for name in ("a.x", "a.y", "a.z")}
    imports = [
        Import("a.x", paths["a.x"], 1, "import a.y", "a.y", "top"),
        Import("a.y", paths["a.y"], 9, "import a.x", "a.x", "lazy"),
        Import("a.y", paths["a.y"], 2, "import a.z", "a.z", "top"),
        Import("a.z", paths["a.z"], 3, "import a.y", "a.y", "TYPE_CHECKING"),
    ]
    found = cycles(paths, imports)
    assert len(found) == 1
    assert found[0].startswith("import cycle between a.x, a.y:")
    assert "a/y.py:9: `import a.x` (lazy)" in found[0]
