//! A line in force only while the sale is busy (`"activation": "when_busy"`).
//!
//! While arrivals stay below the line's outflow, passes below `max_active` and nobody
//! waits, a join is admitted at once: the join script issues the ticket and its pass in
//! the same step, so the buyer needs no poll. The first arrival past the outflow (or one
//! that finds the passes or units used up, the sale not open, or a random line not yet
//! shuffled) turns the line active: from then on every newcomer takes a ticket and waits,
//! so nobody who arrives later passes someone already waiting. The line turns calm again
//! once it is empty and arrivals stayed below the outflow for
//! `waiting_room.when_busy_calm_seconds`; the advancer keeps stepping an active line until
//! then, so the switch back happens (and shows) without waiting for the next join.
//!
//! Everything is decided inside the line's Redis scripts, on the line's own keys, so every
//! instance sees one state and two instances cannot both admit past the outflow. `meta`
//! keeps `busy` (set while active), `over_at` (the last time arrivals went past the
//! outflow), `arr_sec`, `arr_n` and `arr_prev` (arrivals counted in the current Redis
//! second and in the one before, weighed into a sliding second so that a burst across a
//! second's boundary counts whole) and `admitted_at_once_total`. An admission at once
//! also spends the advancer's budget (`budget`, `budget_at`), so the two together stay
//! within the outflow when the line turns active mid-second.

use redis::Value;

use crate::deals::Deal;
use crate::telemetry;

use super::{STATUS_FIELDS, WaitingRoomSettings};

/// The Lua helpers of the switch, prepended to `JOIN` and `ADVANCE` after the shared
/// prelude and the report's (`expire_passes`, `record_wait`). `JOIN`'s ARGV 7.. are: when busy (0/1), the rate when none was published, use
/// the published outflow (0/1: adaptive), max_active, pass ttl ms, may admit now (0/1: the
/// sale open, not paused, not flagged sold out), calm ms, burst ms.
pub(super) const LUA: &str = r#"
local function line_busy()
  return redis.call('HEXISTS', KEYS[1], 'busy') == 1
end
-- Back to admitting at once: nobody waits and arrivals stayed below the outflow for calm ms.
local function settle_calm(now, calm)
  if not line_busy() or redis.call('ZCARD', KEYS[9]) > 0 then return false end
  if now - tonumber(redis.call('HGET', KEYS[1], 'over_at') or '0') < calm then return false end
  redis.call('HDEL', KEYS[1], 'busy')
  return true
end
-- Someone must wait: the line turns active (true when it was not).
local function go_busy(now)
  redis.call('HSET', KEYS[1], 'over_at', now)
  if line_busy() then return false end
  redis.call('HSET', KEYS[1], 'busy', now)
  return true
end
local function busy_rate()
  local rate = tonumber(ARGV[8])
  if ARGV[9] == '1' then
    local published = tonumber(redis.call('HGET', KEYS[1], 'outflow') or '')
    if published and published > 0 then rate = published end
  end
  return rate
end
-- Whether nothing but the crowd holds a newcomer back: the sale open, units and passes
-- left, a random line shuffled, nobody waiting.
local function room_now(now)
  if ARGV[12] ~= '1' or redis.call('ZCARD', KEYS[9]) > 0 then return false end
  local m = redis.call('HMGET', KEYS[1], 'state', 'units_left', 'seed', 'shuffled')
  if m[1] == 'sold_out' or (m[2] and tonumber(m[2]) <= 0) or (m[3] and m[4] ~= '1') then
    return false
  end
  expire_passes(now)
  return redis.call('ZCARD', KEYS[10]) < tonumber(ARGV[10])
end
-- Counts a new arrival and decides: {1 when admitted at once, switches (1: turned active,
-- 2: turned calm, 3: both)}.
local function arrive(now)
  local limit = math.max(1, math.floor(busy_rate()))
  local sec = math.floor(now / 1000)
  local m = redis.call('HMGET', KEYS[1], 'arr_sec', 'arr_n', 'arr_prev')
  local last = tonumber(m[1] or '-1')
  local n, prev = 1, 0
  if last == sec then
    n, prev = tonumber(m[2] or '0') + 1, tonumber(m[3] or '0')
  elseif last == sec - 1 then
    prev = tonumber(m[2] or '0')
  end
  redis.call('HSET', KEYS[1], 'arr_sec', sec, 'arr_n', n, 'arr_prev', prev)
  -- Arrivals over the last second: this second's, and the share of the previous second's
  -- that the window still covers, so a burst across a second's boundary counts whole.
  local recent = n + prev * (1000 - now % 1000) / 1000
  if recent > limit then return {0, go_busy(now) and 1 or 0} end
  local switched = 0
  if settle_calm(now, tonumber(ARGV[13])) then switched = 2 end
  if line_busy() then return {0, switched} end
  if room_now(now) then return {1, switched} end
  -- Passes or units used up, or the sale not open: the newcomer waits, the line is active.
  if go_busy(now) then switched = switched + 1 end
  return {0, switched}
end
-- Admits the newcomer `t` at position `n` at once, spending the advancer's budget too.
local function admit_at_once(t, n, now)
  local exp = now + tonumber(ARGV[11])
  redis.call('HSET', KEYS[7], t, exp)
  redis.call('ZADD', KEYS[10], exp, t)
  local priority = is_priority(t)
  redis.call('HSET', KEYS[1], priority and 'p_through' or 'admitted_through', n)
  redis.call('HINCRBY', KEYS[1], 'admitted_total', 1)
  if priority then redis.call('HINCRBY', KEYS[1], 'admitted_priority_total', 1) end
  redis.call('HINCRBY', KEYS[1], 'admitted_at_once_total', 1)
  record_wait(t, now)
  if redis.call('HEXISTS', KEYS[1], 'units_left') == 1 then
    redis.call('HINCRBY', KEYS[1], 'units_left', -1)
  end
  local rate = busy_rate()
  local cap = math.max(1, rate * tonumber(ARGV[14]) / 1000)
  local bm = redis.call('HMGET', KEYS[1], 'budget', 'budget_at')
  local budget = tonumber(bm[1] or tostring(cap))
  local at = tonumber(bm[2] or tostring(now))
  if now > at then budget = budget + (now - at) * rate / 1000 end
  budget = math.max(math.min(budget, cap) - 1, -rate)
  redis.call('HSET', KEYS[1], 'budget', tostring(budget), 'budget_at', now)
end
"#;

/// Appended to `ADVANCE` (whose body runs as `step()`); its ARGV 15 and 16 are: when busy
/// (0/1), calm ms. Inserts into the step's reply, after its first four fields, whether the
/// line is active (1) or admits at once (0), and the switch the step made (2: turned calm).
const SETTLE: &str = r#"
local r = step()
local line_active, switched = 1, 0
if r[1] >= 0 and ARGV[15] == '1' then
  if settle_calm(now_ms(), tonumber(ARGV[16])) then switched = 2 end
  line_active = line_busy() and 1 or 0
end
table.insert(r, 5, switched)
table.insert(r, 5, line_active)
return r
"#;

/// The advance script: `body` as a function, then the switch back.
pub(super) fn advance_script(body: &str) -> String {
    format!("{LUA}\nlocal function step()\n{body}\nend\n{SETTLE}")
}

/// `JOIN`'s ARGV 7.. for `deal`: everything the script needs to admit at once. `may_admit`
/// is false while the sale is not open, paused or flagged sold out.
pub(super) fn join_args(
    deal: &Deal,
    settings: &WaitingRoomSettings,
    may_admit: bool,
) -> [String; 8] {
    let terms = &deal.waiting_room;
    let adaptive = terms.admission.is_adaptive();
    let start = if adaptive {
        terms.admission.min_per_second
    } else {
        terms.admit_per_second
    };
    [
        u8::from(terms.when_busy()).to_string(),
        start.to_string(),
        u8::from(adaptive).to_string(),
        terms.max_active.to_string(),
        (i64::from(terms.pass_ttl_seconds) * 1000).to_string(),
        u8::from(may_admit).to_string(),
        (settings.when_busy_calm_seconds * 1000).to_string(),
        settings.burst_ms.to_string(),
    ]
}

/// Splits a join's reply into the ticket's status and what the join did: the switches
/// (bits 1 and 2, as `record_switches` takes them) and 4 when it admitted at once.
pub(super) fn split_switched(reply: Value) -> (Value, i64) {
    match reply {
        Value::Array(mut items) if items.len() == STATUS_FIELDS + 1 => {
            let switched = match items.pop() {
                Some(Value::Int(switched)) => switched,
                _ => 0,
            };
            (Value::Array(items), switched)
        }
        other => (other, 0),
    }
}

/// Logs and counts the switches one script made on `deal_id`'s line.
pub(super) fn record_switches(deal_id: &str, switched: i64) {
    if switched & 2 != 0 {
        tracing::info!(
            deal = deal_id,
            line_active = false,
            "waiting-room line calm: joins admitted at once"
        );
        metrics::counter!(telemetry::WAITING_ROOM_LINE_SWITCHES, "to" => "calm").increment(1);
    }
    if switched & 1 != 0 {
        tracing::info!(
            deal = deal_id,
            line_active = true,
            "waiting-room line active: arrivals past the outflow queue"
        );
        metrics::counter!(telemetry::WAITING_ROOM_LINE_SWITCHES, "to" => "active").increment(1);
    }
}

/// The series of the switch counter, at zero from the start.
pub fn export_zeroes() {
    for to in ["active", "calm"] {
        metrics::counter!(telemetry::WAITING_ROOM_LINE_SWITCHES, "to" => to).increment(0);
    }
}
