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
