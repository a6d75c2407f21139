"""The package's shape (issues 27 and 37): no import cycle (type-only imports included), no module over
500 lines, no class over 350, no private name of one library module used by another, the private
modules in wings entered through their doors and never importing a wing above them, and no
``obj._x`` read of another module's private attribute, in the tests too. Read with ``ast``: nothing is
imported or run. docs/architecture.md draws the same wings."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "redlock_async"
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


# The floors, lowest first: a module may import from its own floor or one below, never from one above.
# The wings (private subpackages) each have a floor of their own; the public data modules stand just
# above ``_core`` (they name its values); the fronts and faces (lock, client, sync, cli, ...) stand on top.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("_scripts",),
    ("_core",),
    ("errors", "events", "inspection", "statistics", "fencing"),
    ("_nodes",),
    ("_health",),
    ("_rounds",),
    ("_queue",),
    ("_shared",),
    ("_lock",),
    ("_rw",),
)
WINGS = ("_core", "_nodes", "_health", "_rounds", "_queue", "_shared", "_lock", "_rw")
TOP = len(FLOORS)


def group(module: str) -> str:
    """The first part below ``redlock_async`` (a wing, a public module, a face), or "" for the package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def floor(module: str) -> int:
    found = [i for i, names in enumerate(FLOORS) if group(module) in names]
    return found[0] if found else TOP


def library_imports() -> Iterator[tuple[str, str, str]]:
    """(importer, module imported, name imported or "") for each import of the package in the package."""
    known = modules()
    for name, path in known.items():
        for target, imported in imports(name, path, known):
            yield name, target, imported


def test_every_wing_is_entered_through_its_door() -> None:
    """A module outside a wing imports the wing's ``__init__`` (its door), never a module inside it."""
    through_the_wall = [
        f"{importer} imports {target}"
        for importer, target, _ in library_imports()
        if group(target) in WINGS and group(importer) != group(target) and target != f"redlock_async.{group(target)}"
    ]
    assert through_the_wall == []


def test_no_module_imports_a_floor_above_its_own() -> None:
    upward = [
        f"{importer} (floor {floor(importer)}) imports {target} (floor {floor(target)})"
        for importer, target, _ in library_imports()
        if floor(target) > floor(importer)
    ]
    assert upward == []


def test_the_wings_are_the_ones_drawn() -> None:
    """Every private subpackage of the top floor is a wing with its floor (or _scripts), so the two rules above
    see every one of them."""
    private = {path.name for path in PACKAGE.iterdir() if path.is_dir() and path.name.startswith("_")}
    assert private - {"__pycache__"} == {"_scripts", *WINGS}
    assert set(WINGS) | {"_scripts"} <= {name for names in FLOORS for name in names}


# Reads of another module's private attribute that stay, each with its reason (at most 5).
ALLOWED_PRIVATE_READS = {
    "os._exit": "the standard library's documented exit without cleanup: a child process that must die at once",
}


def own_private_names(tree: ast.Module) -> set[str]:
    """Private names a module defines itself: functions, classes, assigned names and attributes, arguments,
    ``__slots__`` entries."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__slots__" for t in node.targets):
            names.update(
                c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)
            )
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


def private_reads(path: Path) -> Iterator[tuple[int, str]]:
    """(line, expression) for each ``obj._x`` (or ``getattr(obj, "_x")``) in *path* where ``_x`` is no name
    of that module's own and ``obj`` is not ``self`` or ``cls``: a read of another module's private."""
    tree = ast.parse(path.read_text())
    own = own_private_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            name, shown = node.attr, ast.unparse(node)
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            name, shown = node.args[1].value, ast.unparse(node)
        else:
            continue
        if name.startswith("_") and not name.startswith("__") and name not in own:
            yield node.lineno, shown


def test_no_private_attribute_of_another_module_is_read() -> None:
    """In the package, the tests, the benchmarks and the examples: tests reach the parts behind a public object
    through ``redlock_async.testing._inside``, the library through public names."""
    found = []
    for folder in ("redlock_async", "tests", "benchmarks", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            found += [
                f"{path.relative_to(ROOT)}:{line}: {shown}"
                for line, shown in private_reads(path)
                if shown not in ALLOWED_PRIVATE_READS
            ]
    assert found == []
    assert len(ALLOWED_PRIVATE_READS) <= 5


TENURE_OWNERS = {"tenure", "_tenure"}
"""How a lock's parts name its ``Tenure`` (a local, or a field of a keeper or front)."""


def _tenure_writes(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Each assignment to a field of a ``Tenure``: ``tenure.x = ``, ``keeper.tenure.x += ``, ..."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        for target in targets:
            for sub in ast.walk(target):
                if not isinstance(sub, ast.Attribute) or not isinstance(sub.ctx, ast.Store):
                    continue
                owner = sub.value
                name = (
                    owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
                )
                if name in TENURE_OWNERS:
                    yield node.lineno, ast.unparse(sub)


def test_the_tenure_s_fields_change_only_through_its_methods() -> None:
    """``Tenure``'s fields change only in ``_rounds/_lease.py`` (its methods, as its phase through ``to``)."""
    lease = PACKAGE / "_rounds" / "_lease.py"
    writes = [
        f"{path.relative_to(ROOT)}:{line}: {target}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != lease
        for line, target in _tenure_writes(ast.parse(path.read_text(), str(path)))
    ]
    assert not writes, "a Tenure field written outside _rounds/_lease.py (add a method to Tenure):\n" + "\n".join(
        writes
    )


def test_the_tenure_check_sees_a_write() -> None:
    source = "def f(tenure, keeper):\n    tenure.votes, tenure.details = 1, 2\n    keeper.tenure.attempts += 1\n"
    assert [target for _, target in _tenure_writes(ast.parse(source))] == [
        "tenure.votes",
        "tenure.details",
        "keeper.tenure.attempts",
    ]
