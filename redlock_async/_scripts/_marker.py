"""Lua of the restart quarantine's marker: the watch on a node found without one."""

from __future__ import annotations

WATCH = b"""
-- The restart quarantine's watch (_quarantine.py): a node found without marker, while the cluster
-- is in service, has lost its data at some moment before now. Unless a marker is there by now,
-- write one that says which server process and since when (this node's time, microseconds): a
-- later loss takes it away, so it is the whole of what any client needs to know when the node
-- may vote again, whoever reads it (once a period has passed since then, on this clock).
-- KEYS[1]  the marker key
-- returns  {the marker the node holds now, the node's time in microseconds}
local t = redis.call('TIME')
local now = t[1] .. string.format('%06d', tonumber(t[2]))
local marker = redis.call('GET', KEYS[1])
if not marker then
    local id = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
    marker = id .. '/since/' .. now
    redis.call('SET', KEYS[1], marker)
end
return {marker, now}
"""
