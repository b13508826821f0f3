"""The import graph of the comm2perfetto package, read from its sources (nothing is imported): which of its
modules each module imports, at module level or inside a function, and which only for the type checker."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

PACKAGE = "comm2perfetto"
ROOT = Path(importlib.util.find_spec(PACKAGE).origin).parent


def package_modules(package: str = PACKAGE) -> dict[str, Path]:
    """``package``'s modules by dotted name (``comm2perfetto.record.recorder``; a package by its own name)."""
    base = ROOT.joinpath(*package.split(".")[1:])
    modules = {}
    for path in sorted(base.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join((PACKAGE, *parts))] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(path: Path, name: str, modules: set[str]) -> list[tuple[str, bool]]:
    """(imported module of ``modules``, imported only for the type checker) for every import in ``path`` (the
    module ``name``). ``from a import b`` counts ``a.b`` where that is a module, else ``a``."""
    is_package = path.name == "__init__.py"
    found: list[tuple[str, bool]] = []

    def targets(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [alias.name for alias in node.names]
        base = node.module or ""
        if node.level:  # relative: from .sink import ... / from . import x
            anchor = name.split(".")
            anchor = anchor if is_package else anchor[:-1]
            anchor = anchor[:len(anchor) - node.level + 1]
            base = ".".join(anchor + ([base] if base else []))
        return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]

    def visit(node: ast.AST, typing_only: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.extend((target, typing_only) for target in targets(node) if target in modules and target != name)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, typing_only)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, typing_only)

    visit(ast.parse(path.read_text()), False)
    return found


def graph(package: str = PACKAGE, with_typing: bool = True) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports (with or without the type checker's imports)."""
    return graphs(package)[with_typing]


def graphs(package: str = PACKAGE) -> dict[bool, dict[str, set[str]]]:
    """Both graphs from one reading of the sources: ``[False]`` what runs, ``[True]`` with the imports made only
    for the type checker."""
    modules = package_modules(package)
    found = {name: imports(path, name, set(modules)) for name, path in modules.items()}
    return {with_typing: {name: {target for target, typing_only in targets if with_typing or not typing_only}
                          for name, targets in found.items()}
            for with_typing in (False, True)}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``edges``, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(name: str) -> list[str] | None:
        state[name] = 1
        path.append(name)
        for target in sorted(edges.get(name, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state:
                found = walk(target)
                if found:
                    return found
        path.pop()
        state[name] = 2
        return None

    for name in sorted(edges):
        if name not in state:
            found = walk(name)
            if found:
                return found
    return None
