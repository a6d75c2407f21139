"""``@redlock.synchronized("report:{customer_id}")``: run a function under a lock named from its arguments.

The same decorator for both faces: the async ``Redlock`` decorates ``async def`` functions, the
blocking ``redlock_async.sync.Redlock`` plain ones. The name is a ``str.format`` template filled with
the call's arguments by parameter name (defaults included), checked against the function's
signature when it is decorated.
"""

from __future__ import annotations

import functools
import inspect
import string
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, Literal, ParamSpec, TypeVar

from redlock_async.errors import LockNotAcquired, NestedAcquire, NodesUnavailable

P = ParamSpec("P")
R = TypeVar("R")

OnBusy = Literal["raise", "skip"]


def check_on_busy(on_busy: object) -> OnBusy:
    if on_busy == "raise":
        return "raise"
    if on_busy == "skip":
        return "skip"
    raise ValueError(
        f"on_busy must be 'raise' (LockNotAcquired when the lock is held elsewhere) or 'skip' "
        f"(return None without running), got {on_busy!r}"
    )


def check_call(on_busy: object, blocking: object, timeout: float | None) -> tuple[OnBusy, float | None]:
    """*on_busy* checked, and the acquire timeout that *blocking* and *timeout* mean (None: the lock's own)."""
    if not isinstance(blocking, bool):
        raise TypeError(f"blocking must be True or False, got {type(blocking).__name__}")
    if not blocking and timeout is not None:
        raise ValueError("blocking=False makes one attempt: a timeout means nothing there; drop one")
    return check_on_busy(on_busy), 0.0 if not blocking else timeout


class Namer:
    """Fills a name template with a call's arguments (by parameter name)."""

    __slots__ = ("_fields", "_signature", "_template")

    def __init__(self, template: object, fn: Callable[..., object]) -> None:
        if not isinstance(template, str):
            raise TypeError(f"the lock name must be a str template (e.g. 'report:{{customer_id}}'), got {template!r}")
        signature = inspect.signature(fn)
        fields = set()
        for _, field, _, _ in string.Formatter().parse(template):
            if field is None:
                continue
            root = field.split(".", 1)[0].split("[", 1)[0]
            if not root or root.isdigit():
                raise ValueError(f"lock name {template!r}: name each field after a parameter, e.g. {{customer_id}}")
            fields.add(root)
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
        unknown = sorted(fields - signature.parameters.keys())
        if unknown and not takes_any:
            raise ValueError(
                f"lock name {template!r} names {', '.join(unknown)}, which {fn.__qualname__}() does not take: "
                f"use its parameters ({', '.join(signature.parameters) or 'none'})"
            )
        self._template, self._signature, self._fields = template, signature, fields

    def name(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        if not self._fields:
            return self._template
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        for parameter in self._signature.parameters.values():
            if parameter.kind is inspect.Parameter.VAR_KEYWORD:
                values.update(values.pop(parameter.name, {}))
        return self._template.format(**values)


def decorate_sync(
    template: str, on_busy: OnBusy, make: Callable[[str], AbstractContextManager[object]]
) -> Callable[[Callable[P, R]], Callable[P, R | None]]:
    """The decorator for plain functions: ``with make(name):`` around each call."""

    def decorator(fn: Callable[P, R]) -> Callable[P, R | None]:
        if inspect.iscoroutinefunction(fn):
            raise TypeError(
                f"{fn.__qualname__} is an async function: decorate it with the async Redlock's synchronized "
                "(from redlock_async import Redlock), which awaits it on its own loop"
            )
        namer = Namer(template, fn)

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | None:
            entered = False
            try:
                with make(namer.name(args, kwargs)):
                    entered = True
                    return fn(*args, **kwargs)
            except NodesUnavailable:
                raise  # not busy: too few nodes could vote, and "skip" would drop the call unseen
            except (LockNotAcquired, NestedAcquire):
                # NestedAcquire: a call nested in one of the same name in this thread (recursion); the lock
                # is held (by the caller), so "skip" skips it at once, and "raise" says so.
                if entered or on_busy == "raise":
                    raise
                return None

        return wrapper

    return decorator


def decorate_async(
    template: str, on_busy: OnBusy, make: Callable[[str], AbstractAsyncContextManager[object]]
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R | None]]]:
    """The decorator for ``async def`` functions: ``async with make(name):`` around each call."""

    def decorator(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R | None]]:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(
                f"{getattr(fn, '__qualname__', fn)} is not an async function: decorate plain functions with the "
                "blocking Redlock's synchronized (from redlock_async.sync import Redlock)"
            )
        namer = Namer(template, fn)

        @functools.wraps(fn)
        async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | None:
            entered = False
            try:
                async with make(namer.name(args, kwargs)):
                    entered = True
                    return await fn(*args, **kwargs)
            except NodesUnavailable:
                raise  # not busy: too few nodes could vote, and "skip" would drop the call unseen
            except (LockNotAcquired, NestedAcquire):
                # NestedAcquire: a call nested in one of the same name in this task (recursion); the lock
                # is held (by the caller), so "skip" skips it at once, and "raise" says so.
                if entered or on_busy == "raise":
                    raise
                return None

        return wrapper

    return decorator
