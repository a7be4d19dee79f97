//! Joining a line: the proof of work a new place costs, the signed position a returning
//! buyer shows instead, and the join script itself.
//!
//! Every proof is checked in memory before anything touches Redis, so a join with a
//! missing, wrong or forged proof or position costs Redis nothing; only a valid one reaches
//! the line's script (and, for a new place, the seen-set that refuses a challenge's reuse).

use redis::Value;

use super::priority::Group;
use super::{
    Challenge, ChallengeError, QueueError, TicketState, TicketStatus, WaitingRoom, advancer, busy,
    challenge, parse_status, shuffle,
};
use crate::deals::{Deal, Window};
use crate::telemetry;

/// What a join shows: the proof of work a new place costs, the signed position a returning
/// buyer shows instead.
#[derive(Debug, Clone, Copy, Default)]
pub struct Proof<'a> {
    pub solution: Option<&'a [u8]>,
    pub position: Option<&'a [u8]>,
}

/// What a join may do with the user's ticket.
#[derive(Debug, Clone, Copy)]
enum Take<'a> {
    /// Issue one if the user holds none (or its pass ran out unused); `sold_out` as the
    /// sold-out mirror says.
    Issue { sold_out: bool, group: Group },
    /// Only return the one the user holds, and only if it is this ticket (empty: any).
    Held(&'a str),
}

impl WaitingRoom {
    /// The user's ticket for the deal, issued on the first call; the same afterwards. When
    /// the deal asks for a proof of work, only issuing a ticket takes `solution`: a user who
    /// holds one already gets it back without, by showing the `position` token a ticket
    /// answer gave it (a proof of work buys a place, and joining again takes none). Both
    /// are checked in memory before anything touches Redis, so a join with a wrong, missing
    /// or forged proof costs Redis nothing.
    ///
    /// A `when_busy` deal's line may admit a new ticket at once (`busy`): the status is
    /// then `admitted`. `sold_out` is the sold-out mirror's word on the deal, which holds
    /// that back. A new ticket waits in `group`'s line (`priority`).
    pub async fn join(
        &self,
        deal: &Deal,
        user: &str,
        proof: Proof<'_>,
        sold_out: bool,
        group: Group,
    ) -> Result<TicketStatus, QueueError> {
        let Proof { solution, position } = proof;
        let take = Take::Issue { sold_out, group };
        if let Some(floor) = pow_floor(deal) {
            let shown =
                position.and_then(|token| self.positions.verify(token, &deal.id, user).ok());
            if let Some(shown) = shown
                && let Some(held) = self
                    .take_ticket(deal, user, Take::Held(&shown.ticket))
                    .await?
            {
                return Ok(held);
            }
            let solved = self.check_solution(deal, user, floor, solution)?;
            // A valid proof from a user who holds a ticket already buys no second place and
            // is not used up: the ticket comes back.
            if let Some(held) = self.take_ticket(deal, user, Take::Held("")).await? {
                return Ok(held);
            }
            self.claim_solution(&solved).await?;
        }
        let issued = self.take_ticket(deal, user, take).await?;
        issued.ok_or_else(|| QueueError::Unexpected("join issued no ticket".into()))
    }

    /// The user's ticket, issued when `take` allows; `None` when the user holds none (or
    /// not the one named) and may not take one.
    async fn take_ticket(
        &self,
        deal: &Deal,
        user: &str,
        take: Take<'_>,
    ) -> Result<Option<TicketStatus>, QueueError> {
        // 128 random bits: a ticket cannot be guessed, and only its holder can poll it.
        let fresh = hex::encode(rand::random::<[u8; 16]>());
        let (ticket, issue, sold_out, group) = match take {
            Take::Issue { sold_out, group } => (fresh.as_str(), "1", sold_out, group),
            Take::Held(ticket) => (ticket, "0", true, Group::Only),
        };
        let (seed, hash) = if deal.waiting_room.is_random() {
            let seed = shuffle::new_seed();
            let hash = shuffle::commitment(&seed);
            (seed, hash)
        } else {
            (String::new(), String::new())
        };
        let keys_ttl = (self.settings.keys_ttl_seconds * 1000).to_string();
        let now = self.clock.now();
        let may_admit = !sold_out && !deal.paused && deal.window(now) == Window::Open;
        let busy = busy::join_args(deal, &self.settings, may_admit);
        let mut args = vec![user, ticket, &seed, &hash, &keys_ttl, issue];
        args.extend(busy.iter().map(String::as_str));
        args.push(group.as_arg());
        let reply: Value = self.eval(&self.scripts.join, &deal.id, &args).await?;
        if reply == Value::Int(0) {
            return Ok(None);
        }
        let (reply, switched) = busy::split_switched(reply);
        busy::record_switches(&deal.id, switched & 3);
        let status = parse_status(reply)?.ok_or(QueueError::Closed)?;
        if switched & 4 != 0 {
            metrics::counter!(telemetry::WAITING_ROOM_ADMITTED, "deal" => deal.id.clone())
                .increment(1);
        }
        let in_line = matches!(status.state, TicketState::Waiting | TicketState::SoldOut);
        // A new line (or its first buyer again) is read at once; a line someone waits in
        // is stepped again if the advancer left it idle or sleeps. A failure is returned:
        // joining again wakes it.
        if in_line || status.position == 1 {
            advancer::wake(self, &deal.id, status.position == 1).await?;
        }
        Ok(Some(status))
    }

    /// A proof-of-work challenge for `user`'s join, as hard as the deal and its crowd ask.
    /// The crowd is counted on the line state this instance holds (read from Redis at most
    /// once per `line_state_refresh_ms`), so asking for challenges costs Redis nothing per
    /// request either.
    pub async fn challenge(&self, deal: &Deal, user: &str) -> Result<Challenge, QueueError> {
        let base = u32::try_from(deal.waiting_room.pow_bits).unwrap_or(0);
        let waiting = self.line(&deal.id).await?.waiting;
        let s = &self.settings;
        let bits = challenge::difficulty(base, waiting, s.pow_crowd_step, s.pow_bits_max);
        let now_ms = self.clock.now().timestamp_millis();
        Ok(self.challenges.issue(&deal.id, user, bits, now_ms))
    }

    /// Checks a join's proof of work against the deal's `floor` bits, in memory.
    fn check_solution(
        &self,
        deal: &Deal,
        user: &str,
        floor: u32,
        solution: Option<&[u8]>,
    ) -> Result<challenge::Solved, QueueError> {
        let now_ms = self.clock.now().timestamp_millis();
        let checked = self
            .challenges
            .check(solution, &deal.id, user, floor, now_ms);
        Ok(checked.inspect_err(|e| count_challenge(e.outcome()))?)
    }

    /// Refuses a solved challenge's reuse by recording its id in Redis until it expires.
    async fn claim_solution(&self, solved: &challenge::Solved) -> Result<(), QueueError> {
        let cmd = redis::cmd("SET")
            .arg(self.redis.key(&format!("wr:pow:{}", solved.id)))
            .arg(1)
            .arg("NX")
            .arg("PX")
            .arg(solved.ttl_ms)
            .clone();
        let first: Option<String> = self.redis.run(&cmd).await?;
        if first.is_none() {
            count_challenge(ChallengeError::Replayed.outcome());
            return Err(ChallengeError::Replayed.into());
        }
        count_challenge("solved");
        Ok(())
    }
}

/// The bits of proof of work the deal asks of a new ticket; `None` when it asks none.
fn pow_floor(deal: &Deal) -> Option<u32> {
    u32::try_from(deal.waiting_room.pow_bits)
        .ok()
        .filter(|bits| *bits > 0)
}

fn count_challenge(outcome: &'static str) {
    metrics::counter!(telemetry::WAITING_ROOM_CHALLENGES, "outcome" => outcome).increment(1);
}
