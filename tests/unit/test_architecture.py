"""The shape of the package, read from the source (nothing imported): engine and runner names are
compared only where they are defined, and every import points one way.

An import inside a function counts: it runs as soon as the function does, and a cycle hidden
that way is still a cycle. Only imports under `if TYPE_CHECKING:` (never executed) do not.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "launcher"
DEVELOPMENT = ROOT / "docs" / "development.md"
ORDER_MARK = "<!-- package order: highest first -->"

NAME_TEST = re.compile(
    r'(==|!=|is|in) *"(ddp|fsdp|deepspeed|torchrun|slurm|local)"|(==|!=|is) *EngineName\.'
)
"""The grep of issue 21: a name compared to an engine's or a runner's."""
NAME_OWNERS = ("engines", "runners", "config")
"""The packages that define the engines, the runners and their names: they may compare them."""


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _executed(node: ast.AST) -> Iterator[ast.AST]:
    """Every node below `node` that can run, at import or in a function: all but the bodies of
    `if TYPE_CHECKING:`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield other
                yield from _executed(other)
            continue
        yield child
        yield from _executed(child)


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules `name` imports: `from a.b import c` is a.b.c when c is a module,
    else a.b (a package's __init__ is an edge only when named itself)."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in _executed(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package, up level - 1 more
                anchor = name.split(".")[: len(name.split(".")) - node.level + is_package]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {module for module in found if module in known and module != name}


def import_graph() -> dict[str, set[str]]:
    known = modules()
    names = set(known)
    return {name: imported(name, path, names) for name, path in known.items()}


def _cycle_through(graph: dict[str, set[str]], start: str, within: set[str]) -> list[str]:
    """The shortest import path from `start` back to itself inside one strongly connected set."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for target in sorted(graph[module] & within):
                if target == start:
                    return [*paths[module], start]
                if target not in paths:
                    paths[target] = [*paths[module], target]
                    following.append(target)
        frontier = following
    raise AssertionError(f"{start} is in a cycle without a path back")


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected set of modules (Tarjan), as an import path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(module: str) -> None:  # the package is a few hundred modules: recursion is fine
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == module:
                    break
            if len(group) > 1:
                groups.append(group)

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return [_cycle_through(graph, min(group), group) for group in groups]


def test_engine_and_runner_names_are_compared_only_where_they_are_defined() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] not in NAME_OWNERS
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if NAME_TEST.search(line)
    ]
    assert not found, (
        "a difference between engines (or runners) is a method on the engine (or runner) in "
        "launcher/engines/ (launcher/runners/), not a name compared here:\n" + "\n".join(found)
    )


MAX_MODULE_LINES = 300
"""A module past this has more than one job: split it along its jobs (docs/development.md)."""


def test_no_module_is_over_the_line_limit() -> None:
    long = [
        f"{path.relative_to(ROOT)}: {n} lines"
        for path in sorted(PACKAGE.rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    ]
    assert not long, f"over {MAX_MODULE_LINES} lines; split along its jobs:\n" + "\n".join(long)


def test_no_module_imports_a_module_that_imports_it_back() -> None:
    cycles = import_cycles(import_graph())
    assert not cycles, (
        "imports run both ways (an import inside a function counts; move what both sides need "
        "down into a module of its own):\n" + "\n".join(" -> ".join(c) for c in cycles)
    )


def package_order() -> list[list[str]]:
    """The floors written once in docs/development.md, lowest first: each a list of packages
    (launcher/NAME/) or top-level modules (launcher/NAME.py; `launcher` is the package's own
    __init__)."""
    text = DEVELOPMENT.read_text(encoding="utf-8")
    block = text[text.index(ORDER_MARK) :].split("```")[1]
    lines = [line.split() for line in block.splitlines()[1:] if line.strip()]
    return lines[::-1]


def unit_of(module: str) -> str:
    """The package or top-level module a module belongs to (launcher.data.hf: data)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def upward_imports(graph: dict[str, set[str]], floors: list[list[str]]) -> list[str]:
    """Every import of a unit on the same floor or above (the lowest floor's modules may import
    each other), as 'module -> module (floor -> floor)'."""
    floor = {unit: number for number, names in enumerate(floors) for unit in names}
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = unit_of(module), unit_of(target)
            if a != b and (floor[b] > floor[a] or (floor[b] == floor[a] and floor[a] > 0)):
                found.append(f"{module} -> {target} ({a} imports {b}, listed above or beside it)")
    return found


def test_every_import_points_down_the_package_order() -> None:
    graph = import_graph()
    floors = package_order()
    listed = [unit for names in floors for unit in names]
    units = {unit_of(module) for module in graph}
    assert len(listed) == len(set(listed)), f"a name is listed twice in {DEVELOPMENT}"
    assert not units - set(listed), (
        f"not in the package order of {DEVELOPMENT.relative_to(ROOT)}: "
        f"{sorted(units - set(listed))}; give each its line there"
    )
    assert not set(listed) - units, f"listed but not in launcher/: {sorted(set(listed) - units)}"
    upward = upward_imports(graph, floors)
    assert not upward, (
        "imports against the package order (docs/development.md#the-package-order); move what "
        "both need to the lower floor:\n" + "\n".join(upward)
    )


def test_the_checks_see_what_they_guard() -> None:
    """The graph has the package's real edges, lazy ones included, none under TYPE_CHECKING, and
    `from package import module` is that module; a cycle is found through three modules."""
    graph = import_graph()
    assert "launcher.runners.slurm" in graph["launcher.runners"]  # inside runner_for
    assert "launcher.plan" not in graph["launcher.runners.base"]  # under TYPE_CHECKING only
    assert "launcher.commands" in graph["launcher.cli"]  # from launcher import commands
    cycle = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert import_cycles(cycle) == [["a", "b", "c", "a"]]
    assert NAME_TEST.search('if runner.name == "slurm":')
    assert NAME_TEST.search("cfg.engine.name != EngineName.fsdp")
    floors = [["launcher", "errors"], ["config"], ["data"]]
    assert upward_imports({"launcher.config.root": {"launcher.errors"}}, floors) == []
    assert upward_imports({"launcher.errors": {"launcher"}}, floors) == []
    assert upward_imports({"launcher.config.root": {"launcher.data.x"}}, floors)  # upward
    assert upward_imports({"launcher.config.a": {"launcher.config.b"}}, floors) == []
    assert len(package_order()) > 10 and package_order()[-1] == ["cli"]
