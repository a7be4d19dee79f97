//! The Lua scripts that change a line. Each step is one script, so it is atomic in Redis and
//! every instance sees one line. The line scripts take the same KEYS, in the order of
//! `Keys::of`, all of one deal and so of one Redis Cluster slot (their names share the
//! deal's hash tag); nothing shared by all lines is touched by them:
//!
//! 1 `meta` hash: `seq` (tickets issued), `admitted_through`, `admitted_total`,
//!   `abandoned_total`, `state` (`sold_out` while sold out), `sold_out_at`, `budget`,
//!   `budget_at`, `closed_at` and `drained_total` once an operator drained the line, and for
//!   random order `seed`, `seed_sha256`, `prequeue_size`, `shuffled`, `shuffled_at`;
//! 2 `users` hash user → ticket; 3 `t_user` ticket → user; 4 `t_pos` ticket → position;
//! 5 `t_issue` ticket → issue number; 6 `t_seen` ticket → last poll (ms);
//! 7 `t_adm` ticket → pass expiry (ms), once admitted; 8 `t_skip` ticket → when it was
//! skipped, drained or its session ended (ms): it reads `expired` whatever `t_adm` says;
//! 9 `line` sorted set of waiting tickets by position; 10 `active` sorted set of passes by
//! expiry (ms); 11 `issued` list of tickets in issue order; 12 `used` sorted set of passes
//! that placed an order, by the time they did (ms); 13 `t_join` ticket → when it was
//! issued (ms), until its admission records its wait (`report`); 14 `t_grp` ticket → 1
//! for a ticket of the deal's priority group.
//!
//! A priority group's tickets wait in the same `line`, below zero: their own places
//! (`p_seq`) less `PRIORITY_BASE`, so each group keeps its order and one `ZCARD` still
//! counts everyone waiting. The general group's places then come from `g_seq`, so both are
//! dense; `p_through` is the priority group's `admitted_through`, and `p_credit` carries
//! the share between steps (see `ADVANCE`).
//!
//! The lease scripts (`RENEW`, `RESIGN`, `SLEEP`, `WAKE`) take the advancer's keys, of one
//! slot of their own: 1 the lease; 2 the lines version, bumped when a new line takes its
//! first ticket; 3 the lease epoch, bumped whenever the lease changes hands; 4 `woken`, the
//! set of lines someone joined since the advancer last looked; 5 `asleep`, set while the
//! advancer sleeps (no line had anything to do). A line script run by the advancer is
//! fenced by that epoch rather than by reading the lease: `meta` remembers the highest
//! epoch that touched the line, and an older one is refused.
//!
//! `meta` also keeps `units_left`: the units of the last stock snapshot not yet promised to
//! an outstanding pass, which polls report as the buyer's odds; and `outflow`, the rate the
//! advancer last admitted at, which polls turn into the estimated wait. One more key of each
//! line (same hash tag, not among the keys above), `health`, holds the instances' reports;
//! its scripts are in `health`.
//!
//! Times come from Redis (`TIME`), so instances with skewed clocks still agree.

use crate::redis_link::Script;

/// Shared helpers, prepended to every script.
const PRELUDE: &str = r#"
local PRIORITY_BASE = 1099511627776
local function is_priority(t)
  return redis.call('HEXISTS', KEYS[14], t) == 1
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- A pass carries its expiry in whole seconds, so it stops working at the second before
-- the ticket's expiry in ms: the ticket reads `admitted` exactly while its pass works.
local function pass_end(exp)
  return exp - exp % 1000
end
-- `t_skip` holds when a ticket was skipped, drained or its session ended (ms, positive),
-- or minus when its pass placed an order (the pass still reads admitted until it expires).
local function ended(t)
  return tonumber(redis.call('HGET', KEYS[8], t) or '0') > 0
end
-- 1 when the ticket's position is final: a fifo line, a random line already shuffled, or a
-- ticket taken after the pre-queue froze (the shuffle leaves it where it is); 0 for a
-- pre-queue ticket whose shuffle is still to come.
local function settled(t)
  local m = redis.call('HMGET', KEYS[1], 'seed', 'shuffled', 'prequeue_size')
  if not m[1] or m[2] == '1' then return 1 end
  local issue = tonumber(redis.call('HGET', KEYS[5], t) or '0')
  if m[3] and issue > tonumber(m[3]) then return 1 end
  return 0
end
local function status(t, now)
  local pos = tonumber(redis.call('HGET', KEYS[4], t))
  local priority = is_priority(t)
  local through_at = priority and 'p_through' or 'admitted_through'
  local through = tonumber(redis.call('HGET', KEYS[1], through_at) or '0')
  local state, exp = 'waiting', 0
  local adm = redis.call('HGET', KEYS[7], t)
  if ended(t) then
    state = 'expired'
  elseif adm then
    exp = tonumber(adm)
    if pass_end(exp) > now then state = 'admitted' else state = 'expired' end
  elseif redis.call('HGET', KEYS[1], 'state') == 'sold_out' then
    state = 'sold_out'
  end
  local ahead = 0
  if state == 'waiting' or state == 'sold_out' then
    if priority then
      ahead = redis.call('ZCOUNT', KEYS[9], '-inf', '(' .. (pos - PRIORITY_BASE))
    else
      ahead = redis.call('ZCOUNT', KEYS[9], '(0', '(' .. pos)
    end
  end
  local left = tonumber(redis.call('HGET', KEYS[1], 'units_left') or '-1')
  local outflow = redis.call('HGET', KEYS[1], 'outflow') or ''
  local other = redis.call('ZCOUNT', KEYS[9], '-inf', '(0')
  if priority then other = redis.call('ZCARD', KEYS[9]) - other end
  return {t, pos, through, ahead, state, exp, now, redis.call('ZCARD', KEYS[9]), left, outflow,
    settled(t), priority and 1 or 0, other}
end
-- A pass that ran out unused: admitted, expired, and neither ordered with nor ended (both
-- mark the ticket in `t_skip`). Its holder may take a new place at the back of the line.
local function lapsed(t, now)
  local exp = tonumber(redis.call('HGET', KEYS[7], t) or '0')
  return exp > 0 and pass_end(exp) <= now and redis.call('HEXISTS', KEYS[8], t) == 0
end
local function ensure_seed(seed, hash)
  if seed ~= '' and redis.call('HEXISTS', KEYS[1], 'seed') == 0 then
    redis.call('HSET', KEYS[1], 'seed', seed, 'seed_sha256', hash)
  end
end
local function holds_lease(epoch)
  epoch = tonumber(epoch)
  local seen = tonumber(redis.call('HGET', KEYS[1], 'lease_epoch') or '0')
  if epoch < seen then return false end
  if epoch > seen then redis.call('HSET', KEYS[1], 'lease_epoch', epoch) end
  return true
end
"#;

/// ARGV: user, a ticket id (a fresh one when issuing; else the one the caller showed it
/// holds, empty for any), seed, seed hash (both empty for fifo), keys ttl ms, may issue
/// (0/1). Returns the status of the user's ticket, issuing it on first call and again, at
/// the back of the line, once its pass ran out unused (`lapsed`) while the line is open,
/// when allowed (0 when not, or when the user's ticket is not the one shown: the caller
/// checks a proof of work first); nil when the user has none and the line was closed
/// (`DRAIN`). A `when_busy` line may admit a new ticket at once (ARGV 7..14, see `busy`);
/// ARGV 15 is the new ticket's group: empty on a line without a priority group, `1` for the
/// priority group, `0` for the rest. The
/// status then ends with the switches the join made, plus 4 when it admitted at once. Every join pushes the expiry of the
/// line's keys out, so a finished line leaves Redis on its own. The caller bumps the lines
/// version when the ticket is the line's first.
const JOIN: &str = r#"
local t = redis.call('HGET', KEYS[2], ARGV[1])
local known = t ~= false
local closed = redis.call('HEXISTS', KEYS[1], 'closed_at') == 1
local now = now_ms()
local switched = 0
if t and not closed and lapsed(t, now) then t = nil end
if t and ARGV[6] ~= '1' and ARGV[2] ~= '' and t ~= ARGV[2] then t = nil end
if not t and ARGV[6] ~= '1' then
  if closed then return false end
  return 0
end
for i = 1, 10 do redis.call('PEXPIRE', KEYS[i], ARGV[5]) end
for _, i in ipairs({11, 13, 14}) do redis.call('PEXPIRE', KEYS[i], ARGV[5]) end
if not t then
  if closed then return false end
  t = ARGV[2]
  local n = redis.call('HINCRBY', KEYS[1], 'seq', 1)
  local pos, score = n, n
  if ARGV[15] == '1' then
    pos = redis.call('HINCRBY', KEYS[1], 'p_seq', 1)
    score = pos - PRIORITY_BASE
    redis.call('HSET', KEYS[14], t, 1)
    redis.call('PEXPIRE', KEYS[14], ARGV[5])
  elseif ARGV[15] == '0' then
    pos = redis.call('HINCRBY', KEYS[1], 'g_seq', 1)
    score = pos
  end
  redis.call('HSET', KEYS[2], ARGV[1], t)
  redis.call('HSET', KEYS[3], t, ARGV[1])
  redis.call('HSET', KEYS[4], t, pos)
  redis.call('HSET', KEYS[5], t, n)
  redis.call('RPUSH', KEYS[11], t)
  record_join(t, now, known, ARGV[5])
  ensure_seed(ARGV[3], ARGV[4])
  local decided = {0, 0}
  if ARGV[7] == '1' then decided = arrive(now) end
  switched = decided[2] + 4 * decided[1]
  if decided[1] == 1 then admit_at_once(t, pos, now) else redis.call('ZADD', KEYS[9], score, t) end
end
redis.call('HSET', KEYS[6], t, now)
local s = status(t, now)
s[#s + 1] = switched
return s
"#;

/// ARGV: ticket, user. Nil when the ticket is unknown or someone else's; otherwise records
/// the poll (for abandonment) and returns the ticket's status.
const POLL: &str = r#"
if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then return false end
local now = now_ms()
redis.call('HSET', KEYS[6], ARGV[1], now)
return status(ARGV[1], now)
"#;

/// No ARGV. The line as the public sees it (and `units_left`, empty until the advancer read
/// the deal's stock, `1` when the line was drained, `1` while a `when_busy` line is
/// active, then the priority group's `p_through` and how many of it wait).
const PUBLIC: &str = r#"
local now = now_ms()
expire_passes(now)
local m = redis.call('HMGET', KEYS[1], 'admitted_through', 'state', 'seed_sha256', 'seed',
  'shuffled', 'prequeue_size', 'admitted_total', 'outflow', 'units_left', 'closed_at', 'busy',
  'p_through')
return {m[1] or '0', tostring(redis.call('ZCARD', KEYS[9])), m[2] or '', m[3] or '',
  (m[5] == '1' and m[4]) or '', m[6] or '', tostring(redis.call('ZCARD', KEYS[10])),
  m[7] or '0', m[8] or '', m[9] or '', (m[10] and '1') or '', (m[11] and '1') or '',
  m[12] or '0', tostring(redis.call('ZCOUNT', KEYS[9], '-inf', '(0'))}
"#;

/// ARGV: pass id (its ticket), keys ttl ms. Frees the pass's active slot (it placed an
/// order) and records when in `used`, also for a pass that had just expired from `active`,
/// so the advancer counts its unit as taken until a stock snapshot younger than that shows
/// it. Marks the ticket in `t_skip` as used (a negative time, unless its session already
/// ended): a pass that ordered has not lapsed, so its holder does not get a new place, and
/// it still reads admitted until it expires.
const RELEASE: &str = r#"
local now = now_ms()
local freed = redis.call('ZREM', KEYS[10], ARGV[1])
redis.call('ZADD', KEYS[12], now, ARGV[1])
if redis.call('HEXISTS', KEYS[8], ARGV[1]) == 0 then redis.call('HSET', KEYS[8], ARGV[1], -now) end
for _, i in ipairs({8, 12}) do redis.call('PEXPIRE', KEYS[i], ARGV[2]) end
return freed
"#;

/// ARGV: most passes read. The outstanding passes, oldest expiry first, as a flat list of
/// ticket, user pairs.
const ACTIVE: &str = r#"
local out = {}
for _, t in ipairs(redis.call('ZRANGE', KEYS[10], 0, tonumber(ARGV[1]) - 1)) do
  local u = redis.call('HGET', KEYS[3], t)
  if u then
    out[#out + 1] = t
    out[#out + 1] = u
  end
end
return out
"#;

/// ARGV: tickets. Frees the slots of passes whose holders' orders a stock snapshot already
/// counts (their own release was lost). Unlike `RELEASE` it records no use: the snapshot
/// has the order. Returns the slots freed.
const FORGET: &str = r#"
local freed = 0
for _, t in ipairs(ARGV) do freed = freed + redis.call('ZREM', KEYS[10], t) end
return freed
"#;

/// ARGV: user. Ends the user's session on the line: a pass stops working (its slot frees), a
/// waiting ticket leaves the line; both read `expired` (marked in `t_skip`, which `status`
/// reads before `t_adm`; an ended pass does not count as lapsed, so no new place). The
/// pass's expiry in `t_adm` is left as signed, so the expiry returned for a pass is the
/// same however often its session is ended: a repeat (an operator's retry, a cancel after a
/// revocation) announces the same entry again and cannot shorten how long instances keep
/// the pass refused. `t_skip` takes the line keys' expiry when it is new. Returns {ticket,
/// until ms, 1 when this call ended the session (0 for a repeat)} for the caller to append
/// to the
/// revocation stream every instance follows, or false when the user has none.
const REVOKE: &str = r#"
local t = redis.call('HGET', KEYS[2], ARGV[1])
if not t then return false end
local now = now_ms()
local until_ms = tonumber(redis.call('HGET', KEYS[7], t) or '0')
local first = 0
if not ended(t) then
  redis.call('HSET', KEYS[8], t, now)
  first = 1
end
redis.call('ZREM', KEYS[9], t)
local ttl = redis.call('PTTL', KEYS[2])
if ttl > 0 and redis.call('PTTL', KEYS[8]) < 0 then redis.call('PEXPIRE', KEYS[8], ttl) end
redis.call('ZREM', KEYS[10], t)
if first == 1 then redis.call('HINCRBY', KEYS[1], 'revoked_total', 1) end
return {t, tostring(math.max(until_ms, now)), first}
"#;

/// ARGV: lease epoch, flagged sold out (0/1, from the shared sold-out set), outflow (tickets
/// per second: `admit_per_second`, or the adaptive loop's; kept in `meta` as `outflow`), max_active, units available in the last
/// stock snapshot (-1: unknown), pass ttl ms, abandon grace ms, when that snapshot was taken
/// (Redis ms, read before the query), tickets max, burst ms, may admit (0/1), keys ttl ms,
/// stock multiple, snapshot age max ms; `busy` takes ARGV 15 and 16; ARGV 17 is the
/// priority group's share of the admissions in percent (0: no group).
///
/// The share: while both groups wait, each admission adds the share to `p_credit`, and the
/// priority group's head goes when the credit reaches 100 (which it then gives back), so
/// after k admissions the priority group had the share of k to within one ticket. While
/// only one group waits it takes every admission, and the credit stays where it was.
///
/// The bound: a pass promises one unit, so outstanding passes plus the passes that ordered
/// after the snapshot stay within `stock multiple ×` the snapshot's available units. Orders
/// placed before the snapshot are in it; those placed after are still counted in `used`.
/// A snapshot older than its age max admits nobody (its `used` entries may be trimmed).
/// Returns {admitted, skipped, passes active, waiting, buyers joined and passes expired
/// unused since the last step that returned them, then the waits of the tickets admitted
/// (ms)}, or {-1, 0, 0, 0} without the lease; `busy` runs it as a function and inserts the
/// `when_busy` switch (ARGV 15, 16) after the first four.
const ADVANCE: &str = r#"
if not holds_lease(ARGV[1]) then return {-1, 0, 0, 0} end
local now = now_ms()
local age_max = tonumber(ARGV[14])
-- Published for polls' estimates and for the next lease holder to resume from.
redis.call('HSET', KEYS[1], 'outflow', ARGV[3])
expire_passes(now)
redis.call('ZREMRANGEBYSCORE', KEYS[12], '-inf', now - 2 * age_max)
local active = redis.call('ZCARD', KEYS[10])
local waiting = redis.call('ZCARD', KEYS[9])
if redis.call('HEXISTS', KEYS[1], 'closed_at') == 1 then return unpublished({0, 0, active, waiting}) end
local rate = tonumber(ARGV[3])
local cap = rate * tonumber(ARGV[10]) / 1000
if cap < 1 then cap = 1 end
local function hold(left)
  redis.call('HSET', KEYS[1], 'budget', tostring(cap), 'budget_at', now)
  if left then redis.call('HSET', KEYS[1], 'units_left', math.max(left, 0)) end
  return unpublished({0, 0, active, waiting})
end
local available, snap_at = tonumber(ARGV[5]), tonumber(ARGV[8])
local stale = available >= 0 and now - snap_at > age_max
local unsold = nil
if available >= 0 and not stale then
  unsold = available - redis.call('ZCOUNT', KEYS[12], snap_at, '+inf')
end
-- Sold out only when certain: the snapshot itself has no unit, or PostgreSQL said so through
-- the shared flag. `unsold` can undercount (an order in the snapshot whose pass was released
-- after it is subtracted twice): that holds admissions below, but telling the line sold out
-- on it would send away people a unit is left for.
if (available == 0 and not stale) or ARGV[2] == '1' then
  if redis.call('HGET', KEYS[1], 'state') ~= 'sold_out' then
    redis.call('HSET', KEYS[1], 'state', 'sold_out', 'sold_out_at', now)
  end
  return hold(0)
end
if stale then return hold(nil) end
if unsold and unsold <= 0 then return hold(0) end
if redis.call('HGET', KEYS[1], 'state') == 'sold_out' then
  redis.call('HSET', KEYS[1], 'state', 'open', 'resumed_at', now)
end
if ARGV[11] ~= '1' then return hold(unsold and unsold - active) end
local bm = redis.call('HMGET', KEYS[1], 'budget', 'budget_at')
local budget = tonumber(bm[1] or tostring(cap))
local at = tonumber(bm[2] or tostring(now))
if now > at then budget = budget + (now - at) * rate / 1000 end
if budget > cap then budget = cap end
local slots = math.floor(budget)
local free = tonumber(ARGV[4]) - active
if free < slots then slots = free end
if unsold then
  local promise = math.floor(tonumber(ARGV[13]) * unsold) - active
  if promise < slots then slots = promise end
end
local ttl, grace, seen_max = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[9])
local admitted, skipped, seen, through, waits = 0, 0, 0, nil, {}
local share = tonumber(ARGV[17] or '0')
local credit = tonumber(redis.call('HGET', KEYS[1], 'p_credit') or '0')
local p_admitted, p_through = 0, nil
local function head_of(lower, upper)
  return redis.call('ZRANGEBYSCORE', KEYS[9], lower, upper, 'WITHSCORES', 'LIMIT', 0, 1)
end
-- The next ticket to decide, whether it is the priority group's, and whether both groups
-- were waiting (only then does the share count).
local function next_head()
  if share <= 0 then return redis.call('ZRANGE', KEYS[9], 0, 0, 'WITHSCORES'), false, false end
  local p, g = head_of('-inf', '(0'), head_of('(0', '+inf')
  if #p == 0 then return g, false, false end
  if #g == 0 then return p, true, false end
  if credit + share >= 100 then return p, true, true end
  return g, false, true
end
-- A random line's pre-queue learns its places from the shuffle: its holders check in once
-- it is published, so the shuffle counts as their last sign of life until they do.
local sm = redis.call('HMGET', KEYS[1], 'shuffled_at', 'prequeue_size')
local shuffled_at, prequeue = tonumber(sm[1] or '0'), tonumber(sm[2] or '0')
while admitted < slots and seen < seen_max do
  local head, priority, contested = next_head()
  if #head == 0 then break end
  local t = head[1]
  redis.call('ZREM', KEYS[9], t)
  if tonumber(head[2]) < 0 then
    p_through = tonumber(head[2]) + PRIORITY_BASE
  else
    through = head[2]
  end
  seen = seen + 1
  local last = tonumber(redis.call('HGET', KEYS[6], t) or '0')
  if shuffled_at > last and tonumber(redis.call('HGET', KEYS[5], t) or '0') <= prequeue then
    last = shuffled_at
  end
  if now - last > grace then
    redis.call('HSET', KEYS[8], t, now)
    skipped = skipped + 1
  else
    redis.call('HSET', KEYS[7], t, now + ttl)
    redis.call('ZADD', KEYS[10], now + ttl, t)
    admitted = admitted + 1
    waits[admitted] = record_wait(t, now)
    if contested then credit = credit + share end
    if priority then
      p_admitted = p_admitted + 1
      if contested then credit = credit - 100 end
    end
  end
end
if through then redis.call('HSET', KEYS[1], 'admitted_through', through) end
if p_through then redis.call('HSET', KEYS[1], 'p_through', string.format('%d', p_through)) end
if share > 0 then redis.call('HSET', KEYS[1], 'p_credit', credit) end
if p_admitted > 0 then redis.call('HINCRBY', KEYS[1], 'admitted_priority_total', p_admitted) end
redis.call('HSET', KEYS[1], 'budget', tostring(budget - admitted), 'budget_at', now)
if unsold then redis.call('HSET', KEYS[1], 'units_left', math.max(unsold - active - admitted, 0)) end
if admitted > 0 then redis.call('HINCRBY', KEYS[1], 'admitted_total', admitted) end
if skipped > 0 then redis.call('HINCRBY', KEYS[1], 'abandoned_total', skipped) end
if admitted + skipped > 0 then
  for _, i in ipairs({1, 7, 8, 10, 13, 14}) do redis.call('PEXPIRE', KEYS[i], ARGV[12]) end
end
local step = unpublished({admitted, skipped, active + admitted, waiting - seen})
for _, ms in ipairs(waits) do step[#step + 1] = ms end
return step
"#;

/// ARGV: tickets max, keys ttl ms. Closes the line for good (no new tickets, no more
/// admissions: `JOIN` and `ADVANCE` check `closed_at`) and marks up to `tickets max` waiting
/// tickets from the front as skipped, so they read `expired`. Passes already handed out
/// stay valid until they expire. Returns {tickets expired now, tickets still waiting,
/// passes active}; call again until nothing is left waiting.
const DRAIN: &str = r#"
local now = now_ms()
if redis.call('HEXISTS', KEYS[1], 'closed_at') == 0 then
  redis.call('HSET', KEYS[1], 'closed_at', now)
end
local batch = redis.call('ZRANGE', KEYS[9], 0, tonumber(ARGV[1]) - 1)
for _, t in ipairs(batch) do
  redis.call('HSET', KEYS[8], t, now)
  redis.call('ZREM', KEYS[9], t)
end
if #batch > 0 then redis.call('HINCRBY', KEYS[1], 'drained_total', #batch) end
expire_passes(now)
for _, i in ipairs({1, 8}) do
  if redis.call('PTTL', KEYS[i]) < 0 then redis.call('PEXPIRE', KEYS[i], ARGV[2]) end
end
return {#batch, redis.call('ZCARD', KEYS[9]), redis.call('ZCARD', KEYS[10])}
"#;

/// ARGV: lease epoch, seed, seed hash, shuffle size max. Before a random-order line opens:
/// fixes the pre-queue (`prequeue_size`, once) and the seed. Returns {prequeue size,
/// seed, shuffled (0/1)}, or {-1} without the lease.
const FREEZE: &str = r#"
if not holds_lease(ARGV[1]) then return {-1, '', 0} end
ensure_seed(ARGV[2], ARGV[3])
local m = redis.call('HMGET', KEYS[1], 'prequeue_size', 'seq', 'seed', 'shuffled')
local size = m[1]
if not size then
  size = math.min(tonumber(m[2] or '0'), tonumber(ARGV[4]))
  redis.call('HSET', KEYS[1], 'prequeue_size', size)
end
return {tonumber(size), m[3], (m[4] == '1') and 1 or 0}
"#;

/// ARGV: lease epoch, start, stop. The tickets issued `start+1`-th to `stop+1`-th.
const ISSUED: &str = r#"
if not holds_lease(ARGV[1]) then return false end
return redis.call('LRANGE', KEYS[11], ARGV[2], ARGV[3])
"#;

/// ARGV: lease epoch, then position, ticket pairs. Moves tickets to their shuffled places.
const PLACE: &str = r#"
if not holds_lease(ARGV[1]) then return -1 end
for i = 2, #ARGV, 2 do
  redis.call('HSET', KEYS[4], ARGV[i + 1], ARGV[i])
  redis.call('ZADD', KEYS[9], 'XX', ARGV[i], ARGV[i + 1])
end
return 0
"#;

/// ARGV: lease epoch. Marks the shuffle done, which publishes the seed, and notes when
/// (`shuffled_at`, once): `ADVANCE` counts it as the pre-queue's last sign of life.
const SHUFFLED: &str = r#"
if not holds_lease(ARGV[1]) then return -1 end
if redis.call('HGET', KEYS[1], 'shuffled') ~= '1' then
  redis.call('HSET', KEYS[1], 'shuffled', '1', 'shuffled_at', now_ms())
end
return 0
"#;

/// ARGV: lease token, ttl ms. Renews the lease if ours, takes it if free and the advancer
/// is not asleep (a new epoch: past the last one and at least Redis's clock in ms, so it
/// still grows if the epoch key was lost while lines kept the one they saw). The holder
/// takes the woken lines with it.
/// Returns {1 when held, the lines version, Redis's clock in ms, the lease epoch, 1 when
/// asleep, woken deal ids}: a new version means a new line to read.
const RENEW: &str = r#"
local held, asleep, woken = 0, 0, {}
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  held = 1
elseif redis.call('EXISTS', KEYS[5]) == 1 then
  asleep = 1
elseif redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local last = tonumber(redis.call('GET', KEYS[3]) or '0')
  redis.call('SET', KEYS[3], string.format('%d', math.max(last + 1, now_ms())))
  held = 1
end
if held == 1 then
  woken = redis.call('SMEMBERS', KEYS[4])
  if #woken > 0 then redis.call('DEL', KEYS[4]) end
end
return {held, tonumber(redis.call('GET', KEYS[2]) or '0'), now_ms(),
  tonumber(redis.call('GET', KEYS[3]) or '0'), asleep, woken}
"#;

/// ARGV: lease token. The holder found nothing to do on any line: unless a line was woken
/// since its last renewal, it gives the lease up and marks the advancer asleep, so no
/// instance takes the lease until a join wakes it. Returns 1 when asleep.
const SLEEP: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('SCARD', KEYS[4]) > 0 then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[5], '1')
return 1
"#;

/// ARGV: deal id, 1 when its line just took its first ticket. Someone is waiting in the
/// deal's line: marks it woken (the holder steps it again) and wakes the advancer; a new
/// line bumps the lines version too, so the holder reads it at once.
const WAKE: &str = r#"
redis.call('SADD', KEYS[4], ARGV[1])
redis.call('DEL', KEYS[5])
if ARGV[2] == '1' then redis.call('INCR', KEYS[2]) end
return 0
"#;

/// ARGV: lease token. Gives the lease up on shutdown, if still ours.
const RESIGN: &str = r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"#;

/// The scripts, with the shared helpers in front.
pub struct Scripts {
    pub join: Script,
    pub poll: Script,
    pub public: Script,
    pub release: Script,
    pub advance: Script,
    pub freeze: Script,
    pub issued: Script,
    pub place: Script,
    pub shuffled: Script,
    pub renew: Script,
    pub resign: Script,
    pub sleep: Script,
    pub wake: Script,
    pub drain: Script,
    pub revoke: Script,
    pub active: Script,
    pub forget: Script,
    pub health_report: Script,
    pub health_read: Script,
    pub report: Script,
}

impl Scripts {
    pub fn new() -> Self {
        let with = |body: &str| Script::new(format!("{PRELUDE}{}{body}", super::report::PRELUDE));
        Self {
            join: with(&format!("{}{JOIN}", super::busy::LUA)),
            poll: with(POLL),
            public: with(PUBLIC),
            release: with(RELEASE),
            advance: with(&super::busy::advance_script(ADVANCE)),
            freeze: with(FREEZE),
            issued: with(ISSUED),
            place: with(PLACE),
            shuffled: with(SHUFFLED),
            renew: with(RENEW),
            resign: with(RESIGN),
            sleep: with(SLEEP),
            wake: with(WAKE),
            drain: with(DRAIN),
            revoke: with(REVOKE),
            active: with(ACTIVE),
            forget: with(FORGET),
            health_report: Script::new(super::health::REPORT),
            health_read: Script::new(super::health::READ),
            report: with(super::report::READ),
        }
    }
}

impl Default for Scripts {
    fn default() -> Self {
        Self::new()
    }
}
