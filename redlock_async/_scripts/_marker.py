"""Lua of the restart quarantine's marker: the watch on a node found without one, and on a Cluster voter's
shard judged replaced or found without one."""

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

WATCH_SHARD = b"""
-- The watch of a Cluster voter's shard (_shards.py): a shard primary judged replaced (a replica promoted,
-- a new owner of its slots) or found without marker, while the deployment is in service. A shard is its
-- server process *and* its replication id: a primary demoted and promoted back has a new one. Unless the
-- marker already names this very shard (another client's watch, or its mark in service), write one that
-- says which shard and since when (this node's time, microseconds): every client ends its quarantine a
-- period after then. A failover, a restart or a loss takes the watch away or leaves one of another shard.
-- KEYS[1]  the shard's marker key (hash-tagged into a slot the shard serves)
-- returns  {the marker the shard holds now, the node's time in microseconds}
local t = redis.call('TIME')
local now = t[1] .. string.format('%06d', tonumber(t[2]))
local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%w+)')
local replid = string.match(redis.call('INFO', 'replication'), 'master_replid:(%w+)') or '?'
local id = run_id .. '.' .. replid
local marker = redis.call('GET', KEYS[1])
if not marker or string.sub(marker, 1, #id + 1) ~= id .. '/' then
    marker = id .. '/since/' .. now
    redis.call('SET', KEYS[1], marker)
end
return {marker, now}
"""
