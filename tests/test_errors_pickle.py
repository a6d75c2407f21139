"""Every public error survives pickle and copy (process pools, Celery's pickle serializer, multiprocessing).

The classes are found, not listed: every exception class in the ``__all__`` of a public module of the
package (and every public subclass of ``RedlockError``), so a new one is covered as it is added. Each is
made with a sample value for every parameter of its ``__init__``, picked by the parameter's type; a
parameter of a type without a sample fails the test, naming it (add a sample to ``SAMPLES``).
"""

from __future__ import annotations

import asyncio
import copy
import importlib
import inspect
import multiprocessing
import pickle
import pkgutil
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor

import pytest

import redlock_async
from redlock_async import LockNotAcquired, NodeOutcome, Redlock, RedlockError, Vote

from .conftest import Cluster, MakeRedlock

OUTCOMES = (NodeOutcome("127.0.0.1:7001", Vote.NO, "held"), NodeOutcome("127.0.0.1:7002", Vote.TIMEOUT))

SAMPLES: dict[str, object] = {
    "str": "sample text",
    "str | None": "orders:42",
    "int": 7,
    "float": 1.5,
    "float | None": 2.5,
    "Sequence[NodeOutcome]": OUTCOMES,
}
"""A value for a parameter of each type (as written in the annotation), other than its default."""

DEPRECATED = {"resource"}
"""Parameters kept for one release (they warn): their new spelling is given instead."""


def public_errors() -> list[type[BaseException]]:
    found: set[type[BaseException]] = set()
    for module in pkgutil.walk_packages(redlock_async.__path__, "redlock_async."):
        if any(part.startswith("_") for part in module.name.split(".")):
            continue
        loaded = importlib.import_module(module.name)
        for name in getattr(loaded, "__all__", ()):
            obj = getattr(loaded, name)
            if isinstance(obj, type) and issubclass(obj, BaseException):
                found.add(obj)

    def subclasses(cls: type[BaseException]) -> Iterator[type[BaseException]]:
        for sub in cls.__subclasses__():
            if sub.__module__.startswith("redlock_async") and not sub.__name__.startswith("_"):
                yield sub
                yield from subclasses(sub)

    found.update(subclasses(RedlockError))
    return sorted(found, key=lambda cls: cls.__name__)


def sample(cls: type[BaseException]) -> tuple[BaseException, dict[str, object]]:
    """An instance of *cls*, every parameter given a sample; and what was given by keyword."""
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    hints = {name: str(hint) for name, hint in inspect.get_annotations(cls.__init__).items()}
    positional: list[object] = []
    keywords: dict[str, object] = {}
    for parameter in parameters:
        if parameter.name in DEPRECATED or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        hint = hints.get(parameter.name, "")
        assert hint in SAMPLES, f"{cls.__name__}({parameter.name}: {hint}): add a sample of {hint!r} to SAMPLES"
        if parameter.kind is parameter.KEYWORD_ONLY:
            keywords[parameter.name] = SAMPLES[hint]
        else:
            positional.append(SAMPLES[hint] if positional else f"{cls.__name__} sample message")
    return cls(*positional, **keywords), keywords


ERRORS = public_errors()

COPIES: dict[str, Callable[[BaseException], BaseException]] = {
    **{
        f"pickle-{protocol}": (lambda e, p=protocol: pickle.loads(pickle.dumps(e, protocol=p)))  # type: ignore[misc]
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1)
    },
    "copy": copy.copy,
    "deepcopy": copy.deepcopy,
}


def test_the_walk_finds_every_error_class() -> None:
    names = {cls.__name__ for cls in ERRORS}
    assert {"RedlockError", "LockNotAcquired", "NodesUnavailable", "LockLost", "NestedAcquire"} <= names
    assert "StaleFencingToken" in names  # (from redlock_async.fencing's __all__ too)


@pytest.mark.parametrize("how", COPIES)
@pytest.mark.parametrize("cls", ERRORS, ids=lambda cls: cls.__name__)
def test_every_public_error_survives(cls: type[BaseException], how: str) -> None:
    error, given = sample(cls)
    error.add_note("a note the user added")
    copied = COPIES[how](error)
    assert type(copied) is cls
    assert copied is not error
    assert str(copied) == str(error)
    assert copied.args == error.args
    assert vars(copied) == vars(error)
    for name, value in given.items():
        assert getattr(copied, name) == (tuple(value) if isinstance(value, list | tuple) else value), name
    assert copied.__notes__ == ["a note the user added"]


def test_a_users_subclass_survives_too() -> None:
    class Busy(LockNotAcquired):
        def __init__(self, message: str, *, name: str, queue: str) -> None:
            super().__init__(message, name=name, outcomes=OUTCOMES)
            self.queue = queue

    copied = copy.deepcopy(Busy("busy", name="n", queue="emails"))
    assert (copied.queue, copied.name, copied.outcomes, str(copied)) == ("emails", "n", OUTCOMES, str(copied))


def contend(urls: list[str], name: str) -> None:
    """In a child process: wait 0.2 s for *name*, held by the parent (raises LockNotAcquired)."""

    async def main() -> None:
        async with Redlock(urls) as redlock, redlock.lock(name, acquire_timeout=0.2):
            raise AssertionError("acquired a lock the parent holds")

    asyncio.run(main())


async def test_lock_not_acquired_crosses_a_process_pool(cluster: Cluster, make_redlock: MakeRedlock) -> None:
    redlock = await make_redlock()
    urls = cluster.urls
    async with redlock.lock("pickled", ttl=30.0):
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            future = pool.submit(contend, urls, "pickled")
            with pytest.raises(LockNotAcquired) as raised:
                await asyncio.wrap_future(future)
    error = raised.value
    assert type(error) is LockNotAcquired
    assert error.name == "pickled"
    assert "could not acquire lock" in str(error)
    assert "within 0.2 s" in str(error)
    assert len(error.outcomes) == len(urls)
    assert all(outcome.vote is Vote.NO for outcome in error.outcomes), error.outcomes
    assert {outcome.node for outcome in error.outcomes} == {url.removeprefix("redis://") for url in urls}
