"""The package's shape (issue 27): no import cycle (type-only imports included), no module over 500
lines, no class over 350, and no private name of one library module used by another. Read with ``ast``:
nothing is imported or run."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "redlock_async"
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 350


def modules() -> dict[str, Path]:
    """Dotted module name -> its file, for every module of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts).removesuffix(".__init__")
        found[name] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, str]]:
    """(module imported, name imported from it) for each import of the package in *path*."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([package.rsplit(".", node.level - 1)[0]] + ([base] if base else []))
            if not base.startswith("redlock_async"):
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield (sub, "") if sub in known else (base, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("redlock_async"):
                    yield alias.name, ""


def test_no_import_cycle() -> None:
    known = modules()
    graph = {name: {target for target, _ in imports(name, path, known) if target in known and target != name}
             for name, path in known.items()}  # fmt: skip
    # A package's __init__ re-exports its modules: an edge into a package from inside it is no cycle.
    for name in graph:
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    seen: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(name: str, path: list[str]) -> None:
        seen[name] = 1
        for target in sorted(graph[name]):
            if seen.get(target) == 1:
                pytest.fail("import cycle: " + " -> ".join([*path[path.index(target) :], target]))
            if target not in seen:
                visit(target, [*path, target])
        seen[name] = 2

    for name in sorted(graph):
        if name not in seen:
            visit(name, [name])


def test_no_module_or_class_too_long() -> None:
    long = []
    for name, path in modules().items():
        source = path.read_text()
        if (lines := source.count("\n")) > MAX_MODULE_LINES:
            long.append(f"module {name}: {lines} lines")
        for node in ast.walk(ast.parse(source)):
            span = (node.end_lineno or node.lineno) - node.lineno + 1 if isinstance(node, ast.ClassDef) else 0
            if span > MAX_CLASS_LINES:
                long.append(f"class {name}.{getattr(node, 'name', '?')}: {span} lines")
    assert long == []


def test_no_private_name_of_another_library_module_is_imported() -> None:
    known = modules()
    used = []
    for name, path in known.items():
        for target, imported in imports(name, path, known):
            if imported.startswith("_") and not imported.startswith("__") and target != name:
                used.append(f"{name} imports {target}.{imported}")
    assert used == []
