"""The Lua scripts, one constant each, with the SHA1 that EVALSHA names them by.

Every script checks the token before it touches the key, so a client can
only ever delete or extend its own lease, never another holder's.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Script:
    """A Lua source and its SHA1 digest (what EVALSHA sends instead of the source)."""

    source: bytes
    creates: bool = False
    """It can give its own token something (a lock key, a place in a line). Sent again as EVAL
    after the server lost it, a script runs after the commands sent later; for such a script, one
    of those may be its own release or leave, which it would undo for a client that has gone (a
    key or an entry held for no one). So it is not sent again when a command on the wire names
    one of its keys, and fails instead (nothing ran). Every other script only takes away what is
    its token's (a release, a leave, an extension, which is sent again asking to take no free
    node): run late, it does no harm, and it is always sent again, since not running can (a leave
    that never ran leaves its waiter in line)."""
    sha: bytes = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source).hexdigest().encode())


RELEASE = Script(
    b"""
-- Compare-and-delete, then tell the waiters (pushed hand-off): a digest of
-- the released token (listeners only match words from several nodes; the
-- token itself would let a listener extend or release a lease), on the
-- channel named like the key (or KEYS[2]), only when a key was deleted.
-- KEYS[1]  the lock key (and the channel)
-- KEYS[2]  optional: the channel instead (a semaphore's permits share one)
-- ARGV[1]  the token of the acquisition being released
-- returns  1 deleted; 0 the key is gone or holds another token (left alone)
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('DEL', KEYS[1])
    redis.call('PUBLISH', KEYS[2] or KEYS[1], redis.sha1hex(ARGV[1]))
    return 1
end
return 0
"""
)

HANDED_RELEASE = Script(
    b"""
-- Compare-and-delete, telling no one: the release of a hand-over, whose next
-- holder's SET follows it on this connection (a word would only wake waiters
-- elsewhere to find the key taken again).
-- KEYS[1]  the lock key
-- ARGV[1]  the token of the acquisition being released
-- returns  1 deleted; 0 the key is gone or holds another token (left alone)
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('DEL', KEYS[1])
    return 1
end
return 0
"""
)

_FLOOR = b"""
-- The counter read for a new token: the node's, or with a floor (fence_ttl: counters expire) at
-- least the node's time in microseconds, so that a counter that expired never restarts below a
-- token already given (see docs/fencing.md).
local function counter_of(key, floor)
    local counter = tonumber(redis.call('GET', key) or '0')
    if floor then
        local clock = redis.call('TIME')
        local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
        if now > counter then
            counter = now
        end
    end
    return counter
end
"""

_RAISE = b"""
-- Raise a fencing counter to a token: with a ttl (fence_ttl) the counter expires that long after its
-- last raise; without, it never expires (and a counter another client gave a ttl loses it).
local function raise_counter(key, token, ttl)
    if tonumber(redis.call('GET', key) or '0') < tonumber(token) then
        if ttl then
            redis.call('SET', key, token, 'PX', ttl)
        else
            redis.call('SET', key, token)
        end
    elseif ttl then
        local left = redis.call('PTTL', key)
        if left >= 0 and left < tonumber(ttl) then
            redis.call('PEXPIRE', key, ttl)
        end
    end
end

-- Name the acquisition whose fence ran here (SHA1 of its token) beside the counter, with the
-- counter's life: inspection shows a holder's counter only where this names the holder.
local function name_fencer(key, token, ttl)
    if ttl then
        redis.call('SET', key, redis.sha1hex(token), 'PX', ttl)
    else
        redis.call('SET', key, redis.sha1hex(token))
    end
end
"""

ACQUIRE_FENCED = Script(
    b"""
-- SET NX PX, and read the resource's fencing counter in the same step.
-- KEYS[1]  the lock key
-- KEYS[2]  the resource's fencing counter
-- ARGV[1]  the token of this acquisition
-- ARGV[2]  the ttl in integer milliseconds
-- ARGV[3]  optional, "floor": read at least the node's time in microseconds (fence_ttl)
-- returns  the counter (>= 0) when the key was set; -1 when it exists
"""
    + _FLOOR
    + b"""
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return counter_of(KEYS[2], ARGV[3])
end
return -1
""",
    creates=True,
)

FENCE = Script(
    b"""
-- Raise the fencing counter to the new token, only while this acquisition
-- still holds the key: any later holder of the key then reads it. In the
-- same step, name the acquisition that fenced (a digest of its token) beside
-- the counter, so a reader (inspection: MGET of key, counter and this, one
-- atomic read) can tell a counter raised by the key's holder from one that
-- a grant still in its first step has not raised yet.
-- KEYS[1]  the lock key
-- KEYS[2]  the resource's fencing counter
-- KEYS[3]  the counter's fencer: KEYS[2] followed by FENCED_BY
-- ARGV[1]  the token of this acquisition
-- ARGV[2]  the fencing token chosen for it
-- ARGV[3]  optional: the counter's ttl in integer milliseconds (fence_ttl); none: it never expires
-- returns  1 written (or already higher); 0 the key is gone or not ours
"""
    + _RAISE
    + b"""
if redis.call('GET', KEYS[1]) == ARGV[1] then
    raise_counter(KEYS[2], ARGV[2], ARGV[3])
    name_fencer(KEYS[3], ARGV[1], ARGV[3])
    return 1
end
return 0
"""
)

FENCED_BY = b"\x00by"
"""After a fencing counter's key: the key that names (SHA1 of the token, hex) the acquisition whose fence
ran last there. Its life is the counter's."""

EXTEND = Script(
    b"""
-- Compare-and-PEXPIRE of one lock key (an explicit extend() of one unfenced name), and take
-- the key where it is free and the lease may take it here (see EXTEND_MANY: not on a node
-- whose yes its validity counts on). Never touches a key that holds another token. Its
-- fallback after NOSCRIPT takes nothing (it may run behind the lease's own release).
-- KEYS[1]  the lock key
-- ARGV[1]  the token of the acquisition being extended
-- ARGV[2]  the new ttl in integer milliseconds, counted from now
-- ARGV[3]  1: SET the key where it is free; 0: only PEXPIRE
-- returns  1 it holds the token now (extended or taken); 0 the key holds another token, or is
--          gone where it may not be taken
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if not held and ARGV[3] == '1' then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    return 1
end
return 0
"""
)

EXTEND_MANY = Script(
    b"""
-- Extend leases (the watchdog's batched round, or an explicit extend() of several names or a
-- fenced one), and take the nodes where a lease's keys are free. Per lease, all or none on this node: when every key
-- holds its token, or is free and the lease may take it here, the held keys are PEXPIREd and
-- the free ones SET to its token (fenced: their counters raised to its fencing tokens, never
-- lowered, and their fencers named, as FENCE does); otherwise nothing is touched. A key that
-- holds another token is never touched: a lease that ran out may belong to someone else now.
-- A free key is taken only where the lease asks to (take): not on a node whose yes its
-- validity counts on, where a missing key was lost (a restart, a deletion), not freed.
-- Sent again as EVAL after the server lost it, it may run after a later command on its keys
-- (the lease's own release): its fallback asks to take nothing, so a late run never re-creates.
-- KEYS     per lease: its n keys; fenced, then their n fencing counters and n fencers
-- ARGV     per lease: its token; its new ttl in integer milliseconds, counted from now; and
--          "0" or "1" for one key (1: take it here where it is free); otherwise "<take>:<n>"
--          (take 0 or 1; n negative when fenced: then followed by the n fencing tokens and the
--          counters' ttl in integer milliseconds, empty when they never expire)
-- returns  an array, per lease: 1 it holds every key now (extended, maybe taken); 0 a key
--          holds another token, or is gone where it may not be taken (nothing changed)
"""
    + _RAISE
    + b"""
local out, j, k, a, last = {}, 1, 1, 1, #ARGV
while a <= last do
    local token, ttl, spec = ARGV[a], ARGV[a + 1], ARGV[a + 2]
    if spec == '0' or spec == '1' then  -- one key, unfenced: most leases
        local key = KEYS[k]
        local held = redis.call('GET', key)
        if held == token then
            redis.call('PEXPIRE', key, ttl)
            out[j] = 1
        elseif not held and spec == '1' then
            redis.call('SET', key, token, 'PX', ttl)
            out[j] = 1
        else
            out[j] = 0
        end
        a, k = a + 3, k + 1
    else
        local take, n = string.match(spec, '^(%d):(-?%d+)$')
        take, n = take == '1', tonumber(n)
        local fenced = n < 0
        if fenced then
            n = -n
        end
        local free, ok = nil, 1
        for i = k, k + n - 1 do
            local held = redis.call('GET', KEYS[i])
            if held ~= token then
                if held or not take then
                    ok = 0
                    break
                end
                free = free or {}
                free[i] = true
            end
        end
        if ok == 1 then
            for i = k, k + n - 1 do
                if free and free[i] then
                    redis.call('SET', KEYS[i], token, 'PX', ttl)
                    if fenced then
                        local life = ARGV[a + 3 + n]
                        if life == '' then
                            life = nil
                        end
                        raise_counter(KEYS[i + n], ARGV[a + 3 + i - k], life)
                        name_fencer(KEYS[i + 2 * n], token, life)
                    end
                else
                    redis.call('PEXPIRE', KEYS[i], ttl)
                end
            end
        end
        out[j] = ok
        if fenced then
            a, k = a + 4 + n, k + 3 * n
        else
            a, k = a + 3, k + n
        end
    end
    j = j + 1
end
return out
"""
)

FENCED_SET = Script(
    b"""
-- A write to a protected Redis resource, applied only for a fencing token
-- that is not smaller than the largest one this resource has seen.
-- KEYS[1]  the data key written
-- KEYS[2]  the largest fencing token seen for that data (never expires)
-- ARGV[1]  the writer's fencing token
-- ARGV[2]  the value
-- returns  {1, previous largest token} applied; {0, largest token} refused
local seen = tonumber(redis.call('GET', KEYS[2]) or '-1')
local token = tonumber(ARGV[1])
if token < seen then
    return {0, seen}
end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2])
return {1, seen}
"""
)

ACQUIRE_ALL = Script(
    b"""
-- SET NX PX of several keys at once, all or none (lock_many): a node says
-- yes only when it set every key.
-- KEYS[1..n]  the lock keys, in canonical order
-- ARGV[1]     the token of this acquisition (the same on every key)
-- ARGV[2]     the ttl in integer milliseconds
-- returns     1 every key set; -i when key i exists (then nothing was set)
for i, key in ipairs(KEYS) do
    if redis.call('EXISTS', key) == 1 then
        return -i
    end
end
for _, key in ipairs(KEYS) do
    redis.call('SET', key, ARGV[1], 'PX', ARGV[2])
end
return 1
""",
    creates=True,
)

ACQUIRE_ALL_FENCED = Script(
    b"""
-- ACQUIRE_ALL, and read each resource's fencing counter in the same step.
-- KEYS[1..n]     the lock keys, in canonical order
-- KEYS[n+1..2n]  their fencing counters, in the same order
-- ARGV[1]        the token of this acquisition
-- ARGV[2]        the ttl in integer milliseconds
-- ARGV[3]        optional, "floor": read at least the node's time in microseconds (fence_ttl)
-- returns        the n counters (>= 0) when every key was set; -i when key i exists
"""
    + _FLOOR
    + b"""
local n = #KEYS / 2
for i = 1, n do
    if redis.call('EXISTS', KEYS[i]) == 1 then
        return -i
    end
end
local counters = {}
for i = 1, n do
    redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
    counters[i] = counter_of(KEYS[n + i], ARGV[3])
end
return counters
""",
    creates=True,
)

FENCE_ALL = Script(
    b"""
-- FENCE for several keys of one acquisition: only while it holds every one.
-- KEYS[1..n]        the lock keys
-- KEYS[n+1..2n]     their fencing counters
-- KEYS[2n+1..3n]    their counters' fencers (each counter's key followed by FENCED_BY)
-- ARGV[1]           the token of this acquisition
-- ARGV[1+i]         the fencing token chosen for key i
-- ARGV[n+2]         optional: the counters' ttl in integer milliseconds (fence_ttl); none: they never expire
-- returns           1 written (or already higher); 0 a key is gone or not ours
"""
    + _RAISE
    + b"""
local n = #KEYS / 3
for i = 1, n do
    if redis.call('GET', KEYS[i]) ~= ARGV[1] then
        return 0
    end
end
for i = 1, n do
    raise_counter(KEYS[n + i], ARGV[1 + i], ARGV[n + 2])
    name_fencer(KEYS[2 * n + i], ARGV[1], ARGV[n + 2])
end
return 1
"""
)

RELEASE_ALL = Script(
    b"""
-- RELEASE for several keys of one acquisition: each key that still holds
-- the token is deleted, and its waiters told on its own channel.
-- KEYS[1..n]  the lock keys
-- ARGV[1]     the token of the acquisition
-- returns     1 every key held the token (all deleted); 0 some did not
local all = 1
for _, key in ipairs(KEYS) do
    if redis.call('GET', key) == ARGV[1] then
        redis.call('DEL', key)
        redis.call('PUBLISH', key, redis.sha1hex(ARGV[1]))
    else
        all = 0
    end
end
return all
"""
)

ACQUIRE_PERMIT = Script(
    b"""
-- Take permit slot i of a semaphore: a SET NX PX of that slot's key, after
-- checking that no slot is held under another limit. Every token starts
-- with its semaphore's limit ("3:..."), so holders of one limit see those
-- of another; the widest limit in use is kept so that every slot that may be
-- held is looked at. That key lives a lease longer than every permit granted
-- (here) or extended (KEEP_LIMIT) on this node, so it goes once no permit is
-- held, and never while one is.
-- KEYS[1]  the slot's key
-- KEYS[2]  the semaphore's widest-limit key
-- ARGV[1]  the token of this acquisition ("<limit>:<random>")
-- ARGV[2]  the ttl in integer milliseconds
-- ARGV[3]  the limit this client uses
-- ARGV[4]  the slots' key prefix (slot j is this followed by j)
-- returns  1 set; -L a slot is held under limit L (not ours); the slot is held:
--          the list of this node's free slots (so the next try goes where it can win)
local limit = tonumber(ARGV[3])
local keep = 2 * tonumber(ARGV[2])  -- the permit's ttl, and a lease more
local function keep_widest()
    if redis.call('PTTL', KEYS[2]) < keep then
        redis.call('PEXPIRE', KEYS[2], keep)
    end
end
local widest = tonumber(redis.call('GET', KEYS[2]) or '0')
if limit > widest then
    redis.call('SET', KEYS[2], ARGV[3], 'KEEPTTL')  -- (the expiry that other permits set stays)
    keep_widest()
    widest = limit
end
local free = {}
for j = 0, widest - 1 do
    local held = redis.call('GET', ARGV[4] .. j)
    if held then
        local other = tonumber(string.match(held, '^(%d+):'))
        if other ~= limit then
            return -other
        end
    elseif j < limit then
        free[#free + 1] = j
    end
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    keep_widest()
    return 1
end
return free
""",
    creates=True,
)

KEEP_LIMIT = Script(
    b"""
-- After a permit's extension: its semaphore's widest-limit key lives at least a
-- margin longer than the permit's slot, and names at least its limit (written
-- again if this node lost it), only while the slot holds the permit's token.
-- KEYS[1]  the permit's slot key
-- KEYS[2]  the semaphore's widest-limit key
-- ARGV[1]  the permit's token ("<limit>:<random>")
-- ARGV[2]  the margin in integer milliseconds (the permit's ttl)
-- returns  1 kept; 0 the slot is gone or holds another token (nothing written)
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
local limit = string.match(ARGV[1], '^(%d+):')
if tonumber(redis.call('GET', KEYS[2]) or '0') < tonumber(limit) then
    redis.call('SET', KEYS[2], limit, 'KEEPTTL')
end
local keep = redis.call('PTTL', KEYS[1]) + tonumber(ARGV[2])
if redis.call('PTTL', KEYS[2]) < keep then
    redis.call('PEXPIRE', KEYS[2], keep)
end
return 1
"""
)

# -- the grant queue (Redlock(queue=True)) -----------------------------------
#
# Each node keeps, per lock key, the waiters of that key: a sorted set of their
# tokens by a score each waiter chose once (its wall-clock start, the same on
# every node, so every node serves the same waiter first) and a hash of each
# entry's expiry (node milliseconds) and the ttl it wants. A release, or a
# waiter finding the key free, SETs the key to the first live entry's token
# and publishes a grant word naming it (by digest) with the node's time of the
# grant: that waiter holds the key on this node without another round trip.

_NOW = b"""
-- The node's clock, read once and only when needed: microseconds (a float, exact below 2^53).
local clock_us
local function now_us()
    if not clock_us then
        local clock = redis.call('TIME')
        clock_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
    end
    return clock_us
end
"""

_GRANT_NEXT = b"""
-- The key's fencing counter (KEYS[4], when given), as a string: what a fenced waiter granted the key
-- now reads, in the same step as the grant (docs/fencing.md, "Fenced grants from the queue").
local function counter_now()
    return KEYS[4] and redis.call('GET', KEYS[4]) or '0'
end

-- SET the key to the first live waiter (expired entries are dropped) and publish the grant:
-- g<sha1 of its token>:<node time of the grant, us>:<the fencing counter then>;
-- returns that waiter's token, or nil when no one waits.
local function grant_next(key, queue, waits)
    while true do
        local head = redis.call('ZPOPMIN', queue)[1]
        if not head then
            return nil
        end
        local entry = redis.call('HGET', waits, head)
        redis.call('HDEL', waits, head)
        if entry then
            local space = string.find(entry, ' ', 1, true)
            if tonumber(string.sub(entry, 1, space - 1)) > now_us() / 1000 then
                redis.call('SET', key, head, 'PX', string.sub(entry, space + 1))
                local word = 'g' .. redis.sha1hex(head) .. ':' .. string.format('%.0f', now_us())
                redis.call('PUBLISH', key, word .. ':' .. counter_now())
                return head
            end
        end
    end
end
"""

QUEUE_ENTER = Script(
    b"""
-- A waiter joins (or stays in) the key's line; a free key goes to the first live waiter now.
-- KEYS[1]  the lock key (and the channel)
-- KEYS[2]  its line: a sorted set of waiting tokens
-- KEYS[3]  its waits: token -> "<entry expiry, node ms> <ttl ms>"
-- KEYS[4]  optional: the key's fencing counter (read when the key holds the token, and for grants)
-- ARGV[1]  the waiter's token
-- ARGV[2]  the ttl it wants, integer milliseconds
-- ARGV[3]  its score (the same on every node: its place in line)
-- ARGV[4]  how long the entry lives unless entered again, integer milliseconds
-- returns  {1 the key holds the token now / 0 queued, the node's time in us, the key's pttl in ms,
--          the fencing counter (a string) when the key holds the token, else 0}
"""
    + _NOW
    + _GRANT_NEXT
    + b"""
local time = string.format('%.0f', now_us())
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
    return {1, time, redis.call('PTTL', KEYS[1]), counter_now()}
end
if not held and redis.call('EXISTS', KEYS[2]) == 0 then  -- free, and no one in line: ours, told by this reply
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    return {1, time, tonumber(ARGV[2]), counter_now()}
end
local life = tonumber(ARGV[4])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], string.format('%.0f', math.floor(now_us() / 1000) + life) .. ' ' .. ARGV[2])
if redis.call('PTTL', KEYS[2]) < life then  -- the line outlives its entries (set once per life)
    redis.call('PEXPIRE', KEYS[2], 2 * life)
    redis.call('PEXPIRE', KEYS[3], 2 * life)
end
if not held and grant_next(KEYS[1], KEYS[2], KEYS[3]) == ARGV[1] then
    return {1, time, tonumber(ARGV[2]), counter_now()}
end
return {0, time, 0, 0}
""",
    creates=True,
)

QUEUE_LEAVE = Script(
    b"""
-- A waiter or holder leaves the key's line: its entry goes, and if the key holds its token,
-- the key goes straight to the next live waiter (or, with none, is deleted and the release
-- word published, as RELEASE does). It only ever takes away what is its token's: run late (sent
-- again as EVAL after the server lost it, behind commands sent after it), it does what a release
-- of a departed holder does, so it is always sent again (a leave that never ran kept a departed
-- waiter in line, and the next release handed it the key for a whole ttl).
-- KEYS[1]  the lock key (and the channel)
-- KEYS[2]  its line
-- KEYS[3]  its waits
-- KEYS[4]  optional: the key's fencing counter (a grant's word carries it)
-- ARGV[1]  the token
-- returns  1 the key held the token; 0 it did not (as RELEASE)
if redis.call('EXISTS', KEYS[2]) == 0 then  -- no one in line (nor us): RELEASE's work, and no more
    if redis.call('GET', KEYS[1]) == ARGV[1] then
        redis.call('DEL', KEYS[1])
        redis.call('PUBLISH', KEYS[1], redis.sha1hex(ARGV[1]))
        return 1
    end
    return 0
end
"""
    + _NOW
    + _GRANT_NEXT
    + b"""
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
    redis.call('HDEL', KEYS[3], ARGV[1])
end
local had = redis.call('GET', KEYS[1]) == ARGV[1]
if had and not grant_next(KEYS[1], KEYS[2], KEYS[3]) then
    redis.call('DEL', KEYS[1])
    redis.call('PUBLISH', KEYS[1], redis.sha1hex(ARGV[1]))
end
return had and 1 or 0
"""
)

QUEUE_STAY = Script(
    b"""
-- A waiter gives back what this node granted it (a split: no majority came) and keeps (or puts
-- back) its entry: if the key holds its token, the key goes to the first live waiter, which may
-- be itself again. It can put its token back in line and on the key, so it is never run after
-- a later command on the key (its own leave would then be undone): not sent again then.
-- KEYS[1]  the lock key (and the channel)
-- KEYS[2]  its line
-- KEYS[3]  its waits
-- KEYS[4]  optional: the key's fencing counter (as for QUEUE_ENTER)
-- ARGV[1]  the token
-- ARGV[2]  its score, ARGV[3] the entry's life and ARGV[4] its ttl (as for QUEUE_ENTER)
-- returns  {1 the key held the token / 0 it did not, the node's time in us, the key's pttl when
--          it holds the token again (given back to the first waiter: us), else 0, and then the
--          fencing counter, else 0}
"""
    + _NOW
    + _GRANT_NEXT
    + b"""
if not redis.call('HGET', KEYS[3], ARGV[1]) then
    local expiry = math.floor(now_us() / 1000) + tonumber(ARGV[3])
    redis.call('HSET', KEYS[3], ARGV[1], string.format('%.0f', expiry) .. ' ' .. ARGV[4])
end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
local had = redis.call('GET', KEYS[1]) == ARGV[1]
local head = had and grant_next(KEYS[1], KEYS[2], KEYS[3])
if had and not head then  -- (our entry was there already, and expired)
    redis.call('DEL', KEYS[1])
    redis.call('PUBLISH', KEYS[1], redis.sha1hex(ARGV[1]))
end
local time = string.format('%.0f', now_us())
if head == ARGV[1] then
    return {1, time, tonumber(ARGV[4]), counter_now()}
end
return {had and 1 or 0, time, 0, 0}
""",
    creates=True,
)

QUEUE_FENCE = Script(
    b"""
-- FENCE for a waiter of the grant queue that holds the key on a majority (however each node gave it
-- the key: its own SET, an entry, a grant): raise the counter to the chosen fencing token only while
-- the key holds the waiter's token, and name the fencer; reply as QUEUE_ENTER does, so the reply also
-- says where things stand (docs/fencing.md, "Fenced grants from the queue"). It only writes while the
-- key is its token's: run late, it does no harm (a counter raised for a grant that never counted).
-- KEYS[1]  the lock key
-- KEYS[2]  the resource's fencing counter
-- KEYS[3]  the counter's fencer: KEYS[2] followed by FENCED_BY
-- ARGV[1]  the waiter's token
-- ARGV[2]  the fencing token chosen for it
-- ARGV[3]  optional: the counter's ttl in integer milliseconds (fence_ttl); none: it never expires
-- returns  {1 raised (or already higher) / 0 the key is gone or not ours, the node's time in us,
--          the key's pttl when ours, else 0, the counter now when ours, else 0}
"""
    + _NOW
    + _RAISE
    + b"""
local time = string.format('%.0f', now_us())
if redis.call('GET', KEYS[1]) == ARGV[1] then
    raise_counter(KEYS[2], ARGV[2], ARGV[3])
    name_fencer(KEYS[3], ARGV[1], ARGV[3])
    return {1, time, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
end
return {0, time, 0, 0}
"""
)

SCRIPTS = (
    QUEUE_ENTER,
    QUEUE_LEAVE,
    QUEUE_STAY,
    QUEUE_FENCE,
    HANDED_RELEASE,
    RELEASE,
    EXTEND,
    EXTEND_MANY,
    ACQUIRE_FENCED,
    FENCE,
    ACQUIRE_ALL,
    ACQUIRE_ALL_FENCED,
    FENCE_ALL,
    RELEASE_ALL,
    ACQUIRE_PERMIT,
    KEEP_LIMIT,
)
"""The scripts a node loads on every new connection (FENCED_SET runs on the protected resource)."""
