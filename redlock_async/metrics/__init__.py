"""Metrics and traces for ``Redlock(on_event=...)``: OpenTelemetry and Prometheus.

::

    from redlock_async.metrics import Prometheus
    redlock = Redlock(NODES, on_event=Prometheus())          # pip install 'redlock_async[prometheus]'

    from redlock_async.metrics import OpenTelemetry
    redlock = Redlock(NODES, on_event=OpenTelemetry())       # pip install 'redlock_async[otel]'

Each adapter is a callable taking a :class:`~redlock_async.events.LockEvent`; pass several
as a list (``on_event=[Prometheus(), my_hook]``). The instruments and their names are in
docs/metrics.md. Lock names are not attributes (one series per name would explode the
series count); ``name_attribute=`` maps a name to a low-cardinality group when you want one.

Each adapter is imported on first use, so this module imports without either package;
naming one whose package is missing raises an ImportError that says which extra to install.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redlock_async.metrics._otel import OpenTelemetry
    from redlock_async.metrics._prometheus import Prometheus

__all__ = ["OpenTelemetry", "Prometheus"]

# name -> (its module, the package it needs, the extra that installs that package)
_ADAPTERS = {
    "OpenTelemetry": ("redlock_async.metrics._otel", "opentelemetry", "otel"),
    "Prometheus": ("redlock_async.metrics._prometheus", "prometheus_client", "prometheus"),
}


def __getattr__(name: str) -> Any:
    if name not in _ADAPTERS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, package, extra = _ADAPTERS[name]
    try:
        loaded = importlib.import_module(module)
    except ImportError as exc:
        if exc.name is None or exc.name.split(".")[0] != package:
            raise
        raise ImportError(
            f"redlock_async.metrics.{name} needs the {package} package: pip install 'redlock_async[{extra}]'",
            name=exc.name,
        ) from exc
    adapter = getattr(loaded, name)
    globals()[name] = adapter
    return adapter


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
