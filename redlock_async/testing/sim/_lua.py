"""Lua scripting for simulated nodes: EVAL / EVALSHA / SCRIPT run the shipped scripts through ``lupa``
(Lua 5.1, as Valkey's), with ``redis.call``, ``redis.pcall``, ``redis.sha1hex``, ``redis.error_reply`` and
``redis.status_reply``, and Valkey's conversions between Lua and RESP.

One Lua runtime serves every node of a process (a script's globals are only ``KEYS`` and ``ARGV``); the
node whose script runs answers its ``redis.call``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from redlock_async.testing.sim._store import Error, Reply, Status

try:
    from lupa import lua51
except ImportError as exc:  # pragma: no cover - said to the user
    raise ImportError(
        "redlock_async.testing.sim runs the lock scripts through lupa: pip install 'redlock-async[test]' (or lupa)"
    ) from exc

_PRELUDE = b"""
local dispatch, sha1 = ...
redis = {}
redis.pcall = function(...) return dispatch(...) end
redis.call = function(...)
    local reply = dispatch(...)
    if type(reply) == 'table' and reply.err then
        error(reply, 2)
    end
    return reply
end
redis.sha1hex = function(text) return sha1(text) end
redis.error_reply = function(text) return {err = text} end
redis.status_reply = function(text) return {ok = text} end
redis.log = function() end
redis.LOG_DEBUG, redis.LOG_VERBOSE, redis.LOG_NOTICE, redis.LOG_WARNING = 0, 1, 2, 3
function __run(fn, nkeys, ...)
    local keys, argv = {...}, {}
    for i = nkeys + 1, #keys do
        argv[i - nkeys] = keys[i]
        keys[i] = nil
    end
    KEYS, ARGV = keys, argv
    return pcall(fn)
end
function __compile(source)
    local fn, err = loadstring(source, '@user_script')
    return fn or false, err or ''
end
"""

Command = Callable[[list[bytes]], Reply]

_BYTES = {bytes}


class Lua:
    """The Lua runtime and its compiled scripts (by SHA1), shared by the nodes of a process."""

    def __init__(self) -> None:
        self.runtime = lua51.LuaRuntime(encoding=None, unpack_returned_tuples=True)
        self._command: Command | None = None
        self.runtime.execute(_PRELUDE, self._dispatch, _sha1hex)
        self._run = self.runtime.globals()[b"__run"]
        self._compile = self.runtime.globals()[b"__compile"]
        self._compiled: dict[bytes, Any] = {}
        self._table = self.runtime.table_from
        self._err = b"err"
        self._ok = b"ok"

    def compile(self, source: bytes) -> tuple[bytes, Error | None]:
        """(the SHA1 of *source*, an Error when it does not compile)."""
        sha = hashlib.sha1(source).hexdigest().encode()
        if sha not in self._compiled:
            fn, message = self._compile(source)
            if fn is False:
                return sha, Error(f"ERR Error compiling script (new function): {_text(message)}")
            self._compiled[sha] = fn
        return sha, None

    def run(self, sha: bytes, keys: list[bytes], argv: list[bytes], command: Command) -> Reply:
        """Run the compiled script *sha*, its ``redis.call`` answered by *command*."""
        previous, self._command = self._command, command
        try:
            ok, result = self._run(self._compiled[sha], len(keys), *keys, *argv)  # (tables made in Lua)
        finally:
            self._command = previous
        if ok:
            return self._to_reply(result)
        if _is_table(result):
            err = result[self._err]
            if err is not None:
                return Error(_text(err))
        return Error(f"ERR user_script: {_text(result)}")

    def _dispatch(self, *args: Any) -> Any:
        if set(map(type, args)) == _BYTES:  # (nearly always: a script passes strings; no frame per word)
            words = list(args)
        else:
            words = []
            for arg in args:
                if isinstance(arg, bytes):
                    words.append(arg)
                elif isinstance(arg, bool) or not isinstance(arg, int | float):
                    return self._table({self._err: b"ERR Lua redis lib command arguments must be strings or integers"})
                elif isinstance(arg, float) and arg != int(arg):
                    words.append(repr(arg).encode())
                else:
                    words.append(b"%d" % int(arg))
        if not words:
            return self._table({self._err: b"ERR Please specify at least one argument for this redis lib call"})
        assert self._command is not None
        reply = self._command(words)
        kind = type(reply)
        if kind is bytes or kind is int:
            return reply
        return self._to_lua(reply)

    def _to_lua(self, reply: Reply) -> Any:
        if isinstance(reply, Error):
            return self._table({self._err: reply.encode()})
        if isinstance(reply, Status):
            return self._table({self._ok: bytes(reply)})
        if reply is None:
            return False
        if isinstance(reply, list):
            return self._table([self._to_lua(item) for item in reply])
        return reply

    def _to_reply(self, value: Any) -> Reply:
        if value is None or value is False:
            return None
        if value is True:
            return 1
        if isinstance(value, bytes):
            return value
        if isinstance(value, int | float):
            return int(value)
        if _is_table(value):
            err = value[self._err]
            if err is not None:
                return Error(_text(err))
            ok = value[self._ok]
            if ok is not None:
                return Status(ok if isinstance(ok, bytes) else str(ok).encode())
            items = []
            i = 1
            while (item := value[i]) is not None:
                items.append(self._to_reply(item))
                i += 1
            return items
        return None


def _is_table(value: Any) -> bool:
    return bool(lua51.lua_type(value) == "table")


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _sha1hex(text: Any) -> bytes:
    data = text if isinstance(text, bytes) else str(text).encode()
    return hashlib.sha1(data).hexdigest().encode()


_shared: Lua | None = None


def shared() -> Lua:
    """The process's Lua runtime (made on first use)."""
    global _shared
    if _shared is None:
        _shared = Lua()
    return _shared
