//! Following the line from afar: how often a client reads again, and the answer to a poll
//! from far outside the check-in window.
//!
//! The crowd is far from the front and nothing there changes for it between two reads but
//! `admitted_through`, which the public line state carries. A client far back is told to
//! read less often the further back it is (half the time the line needs, at its fastest
//! rate, to bring it within the check-in window); a ticket poll from far outside the window
//! is answered from the signed position the client shows and the line state this instance
//! holds in memory, without a Redis command, telling the client when to come back. Only a
//! poll within the window reaches Redis: that one is the check-in.

use super::{LineStatus, Position, QueueError, WaitingRoom};
use crate::deals::{AdmissionMode, WaitingRoomTerms};

/// The fastest rate the line may move (tickets per second): the deal's `admit_per_second`,
/// or an adaptive line's `max_per_second`, so a climb of the outflow never brings a turn
/// before the ticket checked in.
pub fn fastest_per_second(terms: &WaitingRoomTerms) -> u64 {
    let fastest = match terms.admission.mode {
        AdmissionMode::Fixed => terms.admit_per_second,
        AdmissionMode::Adaptive => terms.admission.max_per_second,
    };
    u64::try_from(fastest).unwrap_or(1).max(1)
}

/// Seconds a client `behind` tickets from the front waits before it reads again: half the
/// time the line takes at `fastest` tickets a second to bring it within `window` tickets,
/// at least `min` and at most `max`. Within the window, `min`.
pub fn refresh_seconds(behind: u64, window: u64, fastest: u64, min: u64, max: u64) -> u64 {
    let outside = behind.saturating_sub(window);
    let half_way = outside.div_ceil(fastest.max(1) * 2);
    half_way.clamp(min, max.max(min))
}

/// A poll from far outside the check-in window, answered from memory.
#[derive(Debug, Clone)]
pub struct Far {
    /// The line as this instance last read it.
    pub line: LineStatus,
    /// `position - admitted_through`, in the ticket's group's line.
    pub behind: u64,
}

impl WaitingRoom {
    /// The tickets the line passes in `checkin_window_seconds` at its fastest rate.
    pub fn checkin_window_tickets(&self, terms: &WaitingRoomTerms) -> u64 {
        fastest_per_second(terms).saturating_mul(self.settings.checkin_window_seconds)
    }

    /// The answer to a poll by the holder of `position` when the ticket is far outside the
    /// check-in window: the line state this instance holds (read from Redis at most once per
    /// `line_state_refresh_ms` for every reader together). `None` when the ticket is within
    /// the window, its position is not final yet, or the line was drained: the poll then
    /// goes to Redis as a check-in.
    pub async fn far(
        &self,
        deal_id: &str,
        terms: &WaitingRoomTerms,
        position: &Position,
    ) -> Result<Option<Far>, QueueError> {
        if !position.is_final {
            return Ok(None);
        }
        let line = self.line(deal_id).await?;
        let through = match position.priority {
            true => line.priority_through,
            false => line.admitted_through,
        };
        let behind = position.position.saturating_sub(through);
        if line.closed || behind <= self.checkin_window_tickets(terms) {
            return Ok(None);
        }
        Ok(Some(Far { line, behind }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interval_grows_with_the_distance_from_the_window_within_bounds() {
        // A window of 300 tickets at 10 a second, reads between 1 and 60 s.
        let at = |behind| refresh_seconds(behind, 300, 10, 1, 60);
        assert_eq!(at(0), 1);
        assert_eq!(at(300), 1);
        assert_eq!(at(320), 1);
        assert_eq!(at(500), 10);
        assert_eq!(at(1_000_000), 60);
        assert!(at(400) <= at(800) && at(800) <= at(1600));
        assert_eq!(refresh_seconds(10, 0, 0, 2, 1), 2);
    }
}
