"""Lua of the permissions probe: every command the lock scripts call (and the fence repair's MGET and SCAN),
on probe keys, so that a connect proves what the user may run (an ACL applies to each command a script
calls, not to the script)."""

from __future__ import annotations

PERMISSIONS = b"""
-- Run every command the library's scripts call, on keys and a channel of the
-- library's own (under its prefixes), and leave nothing behind: what an ACL
-- user may not run answers with an error here, at connect, not a ttl later.
-- KEYS[1]  a string key under key_prefix (and the channel, as a lock key's)
-- KEYS[2]  a hash key, KEYS[3] a set key, KEYS[4] a sorted-set key, under key_prefix
-- KEYS[5]  a string key under fence_prefix
-- returns  the refused commands, one "command: error" each (empty: everything may run)
local errors = {}
local function try(command, ...)
    local reply = redis.pcall(command, ...)
    if type(reply) == 'table' and reply.err then
        errors[#errors + 1] = string.lower(command) .. ': ' .. reply.err
    end
end
try('TIME')
try('SET', KEYS[1], '1', 'PX', 1000)
try('GET', KEYS[1])
try('EXISTS', KEYS[1])
try('TYPE', KEYS[1])
try('PTTL', KEYS[1])
try('PEXPIRE', KEYS[1], 1000)
try('PUBLISH', KEYS[1], 'probe')
try('DEL', KEYS[1])
try('HSET', KEYS[2], 'probe', '1')
try('HGET', KEYS[2], 'probe')
try('HGETALL', KEYS[2])
try('HRANDFIELD', KEYS[2], 2)
try('HDEL', KEYS[2], 'probe')
try('SADD', KEYS[3], 'probe')
try('SCARD', KEYS[3])
try('SMEMBERS', KEYS[3])
try('SRANDMEMBER', KEYS[3])
try('SREM', KEYS[3], 'probe')
try('ZADD', KEYS[4], 0, 'probe')
try('ZCARD', KEYS[4])
try('ZRANGE', KEYS[4], 0, 0)
try('ZSCORE', KEYS[4], 'probe')
try('ZREMRANGEBYSCORE', KEYS[4], 1, 1)
try('ZPOPMIN', KEYS[4])
try('ZREM', KEYS[4], 'probe')
try('SET', KEYS[5], '1', 'PX', 1000)
try('GET', KEYS[5])
-- Not called by a script, but by the fence repair (a restarted node's counters, read from the
-- others) and inspection: without them a restarted node would sit out for ever.
try('MGET', KEYS[5])
try('SCAN', '0', 'MATCH', KEYS[5], 'COUNT', 1)
try('PEXPIRE', KEYS[5], 1000)
try('DEL', KEYS[5])
redis.pcall('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
redis.pcall('DEL', KEYS[5])
return errors
"""


NATIVE = b"""
-- The handshake's question (once per connection): may this user run the server's native
-- compare-and-delete, DELIFEQ (Valkey 9), on the library's keys, from a script? Asked of the ACL
-- (redis.acl_check_cmd, Redis and Valkey 7+: nothing runs, nothing lands in ACL LOG); a server
-- that does not know the command (or the check) answers 0 as one that refuses it.
-- KEYS[1]  a string key under key_prefix (the probe's)
-- ARGV[1]  any value
-- returns  1 the user may run DELIFEQ there; 0 not (the scripts without it run)
local ok, allowed = pcall(redis.acl_check_cmd, 'DELIFEQ', KEYS[1], ARGV[1])
if ok and allowed then
    return 1
end
return 0
"""
