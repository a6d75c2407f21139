"""The public surface: a sorted __all__, every name importable, public classes named redlock_async.X."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import pytest

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
    errors = ("LockLost", "LockNotAcquired", "NestedAcquire", "NodesUnavailable", "ReleaseFailed", "StaleFencingToken")
    for name in errors:
        assert issubclass(getattr(redlock_async, name), redlock_async.RedlockError)
    # Handlers of LockNotAcquired written before it existed still catch it.
    assert issubclass(redlock_async.NodesUnavailable, redlock_async.LockNotAcquired)
    assert "NodesUnavailable" in redlock_async.__all__
    assert redlock_async.NodesUnavailable.__module__ == "redlock_async"
    from redlock_async import sync

    assert sync.NodesUnavailable is redlock_async.NodesUnavailable  # the blocking API's too
    assert "NodesUnavailable" in sync.__all__
    assert sync.ReleaseFailed is redlock_async.ReleaseFailed
    # A nested acquire is misuse (RuntimeError, as documented), not contention: "busy" handlers miss it.
    assert issubclass(redlock_async.NestedAcquire, RuntimeError)
    assert not issubclass(redlock_async.NestedAcquire, redlock_async.LockNotAcquired)


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
    # (_connections: read by client.cluster_of, for redlock_async.testing, on our own Redlock.)
    theirs = private - {"_nodes", "_listener", "_connections"}
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

    # (Fields not passed to __init__, like ttl_ms, are worked out from the settings, not settings.)
    fields = {field.name: field.default for field in dataclasses.fields(redlock_async.Settings) if field.init}
    init = inspect.signature(redlock_async.Redlock.__init__).parameters
    deprecated = {"max_queued"}  # old spellings, kept for one release (tests/test_deprecated.py)
    keywords = {
        name: p.default
        for name, p in init.items()
        if p.kind is p.KEYWORD_ONLY and name != "on_event" and name not in deprecated
    }
    assert keywords == fields
    # The makers' keywords are settings (None: the Redlock's), besides what is not a setting:
    # the loss callback, the owner label, the semaphore's limit, a lock's cooldown and reentrancy.
    not_settings = {"on_lost", "owner", "limit", "cooldown", "reentrant"}
    for maker in (
        redlock_async.Redlock.lock,
        redlock_async.Redlock.lock_many,
        redlock_async.Redlock.semaphore,
        redlock_async.Redlock.election,
        redlock_async.Redlock.rw_lock,
    ):
        params = inspect.signature(maker).parameters
        overrides = {name for name, p in params.items() if p.kind is p.KEYWORD_ONLY and name not in not_settings}
        assert overrides <= set(fields), (maker.__name__, overrides - set(fields))
        assert all(params[name].default is None for name in overrides), maker.__name__


def test_every_maker_takes_the_one_declared_option_set() -> None:
    """The per-lock options are declared once (``_core/_options.py``) and every maker, async and blocking,
    takes them as ``**options: Unpack[...]``: no maker spells the list out again, users' type checkers see
    every keyword, an unknown one is a TypeError that names those taken, and each option is a setting
    (None: the Redlock's) or the owner label."""
    import dataclasses
    import inspect
    import typing

    from redlock_async import sync
    from redlock_async._core._options import ElectionOptions, LeaseOptions, LockOptions

    fields = {field.name for field in dataclasses.fields(redlock_async.Settings)}
    for declared in (LeaseOptions, LockOptions, ElectionOptions):
        assert declared.__optional_keys__ <= fields | {"owner"}, declared
    assert LockOptions.__optional_keys__ == LeaseOptions.__optional_keys__ | {"fencing"}
    expected = {
        "lock": LockOptions,
        "lock_many": LockOptions,
        "rw_lock": LockOptions,
        "semaphore": LeaseOptions,
        "election": ElectionOptions,
    }
    for face in (redlock_async.Redlock, sync.Redlock):
        for maker, declared in expected.items():
            method = getattr(face, maker)
            params = inspect.signature(method).parameters
            (options,) = [p for p in params.values() if p.kind is p.VAR_KEYWORD]
            hint = typing.get_type_hints(method)[options.name]
            assert typing.get_origin(hint) is typing.Unpack, (face, maker, hint)
            assert typing.get_args(hint) == (declared,), (face, maker, hint)
            spelled = set(params) & declared.__optional_keys__
            assert not spelled, f"{face.__qualname__}.{maker} spells out {spelled} again"
    redlock = redlock_async.Redlock(["redis://127.0.0.1:1"])
    for maker, kwargs in (("lock", {"fencing": True, "ttl": 5.0}), ("semaphore", {"limit": 2, "ttl": 5.0})):
        getattr(redlock, maker)("a", **kwargs)  # taken
    with pytest.raises(TypeError, match=r"semaphore\(\) got an unexpected keyword argument 'fencing' \(it takes: "):
        redlock.semaphore("a", limit=2, fencing=True)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"lock\(\) got an unexpected keyword argument 'tll'"):
        redlock.lock("a", tll=5.0)  # type: ignore[call-overload]


# -- import cycles ---------------------------------------------------------------------------------


def _is_type_checking(test: ast.expr) -> bool:
    """``if TYPE_CHECKING:`` or ``if typing.TYPE_CHECKING:``."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_time_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of *body* that run when the module is imported: not those in functions
    (they run when called) nor those under ``if TYPE_CHECKING:`` (they never run)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _import_time_imports(node.orelse)
        else:  # if, try, with, for, class bodies...: they run at import
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ExceptHandler | ast.match_case):
                    yield from _import_time_imports(child.body)
            for _, value in ast.iter_fields(node):
                if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                    yield from _import_time_imports(value)


def import_graph(package: Path) -> dict[str, set[str]]:
    """Each module of *package* (a directory) -> the modules of *package* it imports when imported.

    ``from P.X import name`` and ``import P.X`` are edges to P.X; ``from P import X`` is an edge to
    P.X when X is a module (a file P/X.py or a package P/X/), else to P (a name of P's __init__);
    relative imports likewise. A submodule's import of its parent package, which Python does first
    anyway, is not an edge of its own.
    """
    modules: dict[str, Path] = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        here = module if path.name == "__init__.py" else module.rpartition(".")[0]  # its package
        deps: set[str] = set()
        for node in _import_time_imports(ast.parse(path.read_text(), str(path)).body):
            if isinstance(node, ast.Import):
                deps.update(alias.name for alias in node.names)
                continue
            source = node.module or ""
            if node.level:  # from . import x, from ..y import z
                base = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                source = f"{base}.{node.module}" if node.module else base
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                deps.add(submodule if submodule in modules else source)
        graph[module] = {dep for dep in deps if dep in modules} - {module}
    return graph


def find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """One cycle of *graph*, as the path from a module back to itself; None when there is none."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        path.append(module)
        for dep in sorted(graph.get(module, ())):
            if dep in path:
                return [*path[path.index(dep) :], dep]
            if dep not in done and (found := visit(dep)):
                return found
        path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        if module not in done and (found := visit(module)):
            return found
    return None


FAKE_PACKAGE = {
    "__init__.py": "from pkg.a import A\n",
    "a.py": "from pkg import b, c\n\nA = 1\n",
    "b.py": "import pkg.d\n",
    "c.py": (
        "from typing import TYPE_CHECKING\n\n"
        "if TYPE_CHECKING:\n    from pkg.a import A\n    import pkg.b\nelse:\n    from pkg import e\n\n\n"
        "def later():\n    from pkg import a\n"
    ),
    "d.py": "try:\n    from . import e\nexcept ImportError:\n    e = None\n",
    "e.py": "",
    "sub/__init__.py": "from .x import X\n",
    "sub/x.py": "from .. import A\n\nX = A\n",
}


def fake_package(root: Path, e_py: str = "") -> Path:
    """FAKE_PACKAGE written under *root* as ``pkg``, its e.py made of *e_py*."""
    for name, text in (FAKE_PACKAGE | {"e.py": e_py}).items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_the_import_graph_maps_every_run_time_import_form(tmp_path: Path) -> None:
    assert import_graph(fake_package(tmp_path)) == {
        "pkg": {"pkg.a"},  # from pkg.a import A
        "pkg.a": {"pkg.b", "pkg.c"},  # from pkg import b, c: modules
        "pkg.b": {"pkg.d"},  # import pkg.d
        "pkg.c": {"pkg.e"},  # not what TYPE_CHECKING guards, nor a function's import; its else branch
        "pkg.d": {"pkg.e"},  # from . import e, inside try
        "pkg.e": set(),
        "pkg.sub": {"pkg.sub.x"},  # from .x import X
        "pkg.sub.x": {"pkg"},  # from .. import A: a name of pkg's __init__
    }
    assert find_cycle(import_graph(fake_package(tmp_path))) is None


@pytest.mark.parametrize(
    ("e_py", "cycle"),
    [
        ("from pkg import a\n", ["pkg.a", "pkg.b", "pkg.d", "pkg.e", "pkg.a"]),
        ("import pkg.a\n", ["pkg.a", "pkg.b", "pkg.d", "pkg.e", "pkg.a"]),
        ("from pkg.a import A\n", ["pkg.a", "pkg.b", "pkg.d", "pkg.e", "pkg.a"]),
        ("from . import a\n", ["pkg.a", "pkg.b", "pkg.d", "pkg.e", "pkg.a"]),
        ("from pkg import A\n", ["pkg", "pkg.a", "pkg.b", "pkg.d", "pkg.e", "pkg"]),
        ("import typing\n\nif typing.TYPE_CHECKING:\n    from pkg import a\n", None),
        ("def later():\n    import pkg.a\n", None),
    ],
    ids=["from-package-import-module", "import-dotted", "from-module-import-name", "relative", "init-name",
         "type-checking", "in-a-function"],
)  # fmt: skip
def test_a_cycle_is_found_whatever_the_import_form(tmp_path: Path, e_py: str, cycle: list[str] | None) -> None:
    assert find_cycle(import_graph(fake_package(tmp_path, e_py=e_py))) == cycle


def test_no_module_of_the_library_imports_itself_back_at_run_time() -> None:
    """No run-time import cycle among redlock_async's modules (imports under TYPE_CHECKING are types only)."""
    cycle = find_cycle(import_graph(Path(redlock_async.__file__).parent))
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_the_locked_thing_is_called_name_and_resource_is_only_a_deprecated_alias() -> None:
    """One word on the public face: ``name``. ``resource`` survives (for 0.2.0) only as a property that
    warns and as a keyword-only ``resource=None`` of a constructor (tests/test_deprecated.py checks both warn)."""
    import dataclasses
    import inspect

    from redlock_async import sync

    checked = 0
    for module in (redlock_async, sync):
        for public in module.__all__:
            cls = getattr(module, public)
            if not isinstance(cls, type):
                continue
            fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
            slots = {slot for klass in cls.__mro__ for slot in getattr(klass, "__slots__", ())}
            assert not {n for n in fields | slots if "resource" in n}, public
            for attribute in dir(cls):
                if "resource" in attribute:
                    alias = inspect.getattr_static(cls, attribute)
                    assert isinstance(alias, property), (public, attribute)
                    assert (alias.__doc__ or "").startswith("Deprecated spelling of :attr:`name`"), public
                    checked += 1
            try:
                parameters = inspect.signature(cls).parameters
            except ValueError:
                continue
            for parameter in parameters.values():
                if "resource" in parameter.name:
                    assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, public
                    assert parameter.default is None, public
                    assert "name" in parameters, public
    assert checked >= 8  # Lock, Semaphore, LockEvent, LockStatistics and the errors keep the alias
