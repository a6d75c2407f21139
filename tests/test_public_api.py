"""The public surface: a sorted __all__, every name importable, public classes named redlock_async.X."""

from __future__ import annotations

import redlock_async


def test_all_is_sorted_and_complete() -> None:
    assert redlock_async.__all__ == sorted(redlock_async.__all__)
    for name in redlock_async.__all__:
        assert hasattr(redlock_async, name)


def test_public_classes_show_as_package_names() -> None:
    for name in redlock_async.__all__:
        obj = getattr(redlock_async, name)
        if isinstance(obj, type):
            assert obj.__module__ == "redlock_async", name


def test_error_tree() -> None:
    for name in ("LockLost", "LockNotAcquired", "StaleFencingToken"):
        assert issubclass(getattr(redlock_async, name), redlock_async.RedlockError)


def _redis_private_names() -> set[str]:
    """Every private name of redis-py's modules and classes (``_writer``, ``_reader``, ``_buffer``, ...)."""
    import importlib
    import inspect
    import pkgutil

    import redis

    names: set[str] = set()
    for info in pkgutil.walk_packages(redis.__path__, "redis."):
        try:
            module = importlib.import_module(info.name)
        except ImportError:
            continue  # optional parts (e.g. OCSP without cryptography)
        for name, obj in vars(module).items():
            if name.startswith("_") and not name.startswith("__"):
                names.add(name)
            if inspect.isclass(obj) and obj.__module__.startswith("redis"):
                names.update(n for n in vars(obj) if n.startswith("_") and not n.startswith("__"))
                init = vars(obj).get("__init__")
                code = getattr(init, "__code__", None)
                if code is not None:  # attributes set in __init__: self._x = ...
                    names.update(n for n in code.co_names if n.startswith("_") and not n.startswith("__"))
    return names


def test_no_private_attribute_of_redis_py_is_used() -> None:
    """redlock_async uses redis-py's public API only, so a redis-py release cannot break it from behind.

    Flagged: ``obj._name`` on anything but ``self``/``cls``, and ``getattr(obj, "_name")``, where
    ``_name`` is a private name of redis-py.
    """
    import ast
    from pathlib import Path

    private = _redis_private_names()
    assert {"_writer", "_reader", "_buffer"} <= private  # the check would have caught the old take-over
    trees = {path: ast.parse(path.read_text(), str(path)) for path in Path(redlock_async.__file__).parent.rglob("*.py")}
    # Our own Redlock's attributes that share a name with redis-py's (read by Lock, the CLI and the
    # watchdog on a Redlock, never on a redis-py object).
    theirs = private - {"_nodes", "_listener"}
    found = []
    for path, tree in trees.items():
        slots = {
            id(c)
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__slots__" for t in node.targets)
            for c in ast.walk(node.value)
        }
        for node in ast.walk(tree):
            if id(node) in slots:
                continue  # our own attributes' names
            if (
                isinstance(node, ast.Attribute)
                and node.attr in theirs
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                found.append(f"{path.name}:{node.lineno}: .{node.attr}")
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in theirs:
                found.append(f"{path.name}:{node.lineno}: {node.value!r}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("redis"):
                found += [f"{path.name}:{node.lineno}: import {a.name}" for a in node.names if a.name.startswith("_")]
    assert found == [], "private redis-py names used in redlock_async: " + ", ".join(found)


def test_version_is_the_installed_one_and_the_cli_says_it() -> None:
    import subprocess
    import sys
    from importlib.metadata import version

    assert redlock_async.__version__ == version("redlock_async")
    done = subprocess.run([sys.executable, "-m", "redlock_async", "--version"], capture_output=True, text=True)
    assert (done.returncode, done.stdout.strip()) == (0, f"redlock {redlock_async.__version__}")


def test_the_majority_is_spelled_once() -> None:
    """Every module asks _algorithm.quorum for the majority; no second spelling of it can drift."""
    import ast
    from pathlib import Path

    package = Path(redlock_async.__file__).parent
    spelled: list[str] = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "_algorithm.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            # n // 2 + 1, in any form
            if (
                isinstance(node, ast.BinOp)
                and isinstance(node.op, ast.Add)
                and isinstance(node.left, ast.BinOp)
                and isinstance(node.left.op, ast.FloorDiv)
                and isinstance(node.left.right, ast.Constant)
                and node.left.right.value == 2
            ):
                spelled.append(f"{path.relative_to(package)}:{node.lineno}")
    assert not spelled, f"the majority spelled by hand (use _algorithm.quorum): {spelled}"


def test_redlock_takes_exactly_the_settings_with_their_defaults() -> None:
    """Settings is the one list: Redlock(...)'s keywords and defaults, and Redlock.lock's overrides, agree with it."""
    import dataclasses
    import inspect

    fields = {field.name: field.default for field in dataclasses.fields(redlock_async.Settings)}
    init = inspect.signature(redlock_async.Redlock.__init__).parameters
    keywords = {name: p.default for name, p in init.items() if p.kind is p.KEYWORD_ONLY and name != "on_event"}
    assert keywords == fields
    lock = inspect.signature(redlock_async.Redlock.lock).parameters
    overrides = {name for name, p in lock.items() if p.kind is p.KEYWORD_ONLY and name != "on_lost"}
    assert overrides <= set(fields), overrides - set(fields)
    assert all(lock[name].default is None for name in overrides)  # None: the Redlock's setting


def test_no_module_of_the_library_imports_itself_back_at_run_time() -> None:
    """No runtime import cycle among redlock_async's modules (imports under TYPE_CHECKING are types only)."""
    import ast
    from pathlib import Path

    package = Path(redlock_async.__file__).parent
    graph: dict[str, set[str]] = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        deps: set[str] = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("redlock_async."):
                deps.add(node.module)
        graph[module] = deps - {module}

    def cycle_from(start: str, path: list[str]) -> list[str] | None:
        for dep in sorted(graph.get(path[-1], ())):
            if dep == start:
                return [*path, dep]
            if dep not in path and (found := cycle_from(start, [*path, dep])):
                return found
        return None

    cycles = [found for module in sorted(graph) if (found := cycle_from(module, [module]))]
    assert not cycles, f"import cycles: {cycles[0]}"
