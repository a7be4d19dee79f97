//! How a ticket is shown to its holder: its place, the estimated wait and odds, and the
//! pass once admitted. A poll that checks in is answered from the ticket's status in
//! Redis; one from far outside the check-in window from the signed position and the line
//! in memory. On a line with a priority group, the estimates count the other group's share
//! of the admissions before the ticket's turn (`waiting_room::priority`).

use bytes::Bytes;
use chrono::{DateTime, Utc};
use http::header::{HeaderValue, RETRY_AFTER, VARY};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use serde::Serialize;

use super::State;
use super::body::{self, Caching};
use super::guard::{POSITION_HEADER, header};
use crate::deals::{Deal, WaitingRoomTerms};
use crate::domain::UserId;
use crate::waiting_room::follow;
use crate::waiting_room::follow::Far;
use crate::waiting_room::priority::{self, Group};
use crate::waiting_room::{Position, TicketState, TicketStatus};

#[derive(Serialize)]
pub(super) struct TicketView<'a> {
    ticket: &'a str,
    position: u64,
    /// The position signed for this ticket, so the client follows the line on the public
    /// state and cannot move itself forward.
    position_token: String,
    /// False while a random-order line's shuffle is still to move this pre-queue ticket.
    position_final: bool,
    /// Check in (poll this ticket) once `position - admitted_through` is at most this.
    checkin_window_tickets: u64,
    /// The highest place the ticket's group's line was admitted through.
    admitted_through: u64,
    /// Tickets waiting in front of this one in its group's line.
    ahead: u64,
    /// `priority` or `general` on a line with a priority group: the line the ticket waits
    /// in, whose places `position`, `admitted_through` and `ahead` count.
    #[serde(skip_serializing_if = "Option::is_none")]
    group: Option<&'static str>,
    /// Seconds until the tickets admitted before this one (`ahead`, and on a line with a
    /// priority group the other line's share meanwhile) have gone, at the current outflow.
    estimated_wait_seconds: u64,
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pass: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pass_expires_at: Option<DateTime<Utc>>,
    /// Milliseconds the pass has left by Redis's clock, so a client counts down on its own
    /// clock without trusting it to agree with ours.
    #[serde(skip_serializing_if = "Option::is_none")]
    pass_expires_in_ms: Option<i64>,
    refresh_after_seconds: u64,
    /// Units of the last stock snapshot not promised to an outstanding pass.
    #[serde(skip_serializing_if = "Option::is_none")]
    units_left: Option<u64>,
    /// `units_left / (admitted before it + 1)`, at most 1: the chance a unit is left at this
    /// ticket's turn if everyone admitted before it buys one and nothing returns.
    #[serde(skip_serializing_if = "Option::is_none")]
    chance_of_units: Option<f64>,
    /// True when more people wait ahead than units are left.
    likely_sold_out: bool,
    /// Where an admitted buyer goes to order (the deal's checkout URL), when configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    checkout_url: Option<&'a str>,
    /// False for a poll answered from far outside the check-in window (from the signed
    /// position and the line in memory): not recorded as a sign of life; come back after
    /// `refresh_after_seconds`.
    checked_in: bool,
}

/// A poll from far outside the check-in window: the ticket as the signed position and the
/// line in memory show it, and when to come back (also as `Retry-After`).
pub(super) fn far_reply(
    state: &State,
    deal: &Deal,
    shown: &Position,
    far: &Far,
    request: &Request<Incoming>,
) -> Response<Full<Bytes>> {
    let terms = &deal.waiting_room;
    let room = state.admission.waiting_room();
    let sold_out = far.line.sold_out || state.admission.sold_out().is_sold_out(&deal.id);
    let ahead = far.behind.saturating_sub(1);
    let group = Group::of_ticket(deal, shown.priority);
    let (through, other_waiting) = match group {
        Group::Priority => (
            far.line.priority_through,
            far.line.waiting.saturating_sub(far.line.priority_waiting),
        ),
        _ => (far.line.admitted_through, far.line.priority_waiting),
    };
    let before = admitted_before(deal, ahead, group, other_waiting);
    let units_left = far.line.units_left.filter(|_| !sold_out);
    let refresh = follow_refresh(state, deal, far.behind);
    let view = TicketView {
        ticket: &shown.ticket,
        position: shown.position,
        position_token: String::from_utf8_lossy(
            header(request, POSITION_HEADER).unwrap_or_default(),
        )
        .into_owned(),
        position_final: shown.is_final,
        checkin_window_tickets: room.checkin_window_tickets(terms),
        admitted_through: through,
        ahead,
        group: group.name(),
        estimated_wait_seconds: if sold_out {
            0
        } else {
            wait_seconds(before, far.line.outflow_per_second, terms)
        },
        state: if sold_out { "sold_out" } else { "waiting" },
        pass: None,
        pass_expires_at: None,
        pass_expires_in_ms: None,
        refresh_after_seconds: refresh,
        units_left,
        chance_of_units: units_left.map(|left| (left as f64 / (before + 1) as f64).min(1.0)),
        likely_sold_out: sold_out || units_left.is_some_and(|left| before >= left),
        checkout_url: None,
        checked_in: false,
    };
    let mut response = body::respond(StatusCode::OK, &view, Caching::Private);
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(refresh));
    response
}

/// How long a client `behind` tickets from the front waits before it reads the line again.
pub(super) fn follow_refresh(state: &State, deal: &Deal, behind: u64) -> u64 {
    let terms = &deal.waiting_room;
    let settings = &state.settings.waiting_room;
    let min = u64::from(state.settings.server.public_cache_max_age_seconds.max(1));
    follow::refresh_seconds(
        behind,
        state.admission.waiting_room().checkin_window_tickets(terms),
        follow::fastest_per_second(terms),
        min,
        settings.follow_refresh_seconds_max,
    )
}

/// Seconds until `ahead + 1` tickets are admitted at the current outflow (the deal's
/// `admit_per_second` before the advancer published one), so the promise moves with it.
fn wait_seconds(ahead: u64, outflow: Option<f64>, terms: &WaitingRoomTerms) -> u64 {
    let rate = outflow
        .unwrap_or_else(|| f64::from(terms.admit_per_second))
        .max(0.001);
    ((ahead + 1) as f64 / rate).ceil() as u64
}

/// The tickets admitted before one `ahead` places from the front of `group`'s line.
fn admitted_before(deal: &Deal, ahead: u64, group: Group, other_waiting: u64) -> u64 {
    let share = deal
        .waiting_room
        .priority
        .as_ref()
        .map_or(0, |p| p.share_percent);
    priority::before(ahead, group, share, other_waiting)
}

/// A personal ticket answer, with a freshly signed pass when admitted.
pub(super) fn ticket_reply(
    state: &State,
    deal: &Deal,
    user: &UserId,
    status: &TicketStatus,
    code: StatusCode,
) -> Response<Full<Bytes>> {
    let terms = &deal.waiting_room;
    let mut ticket_state = status.state;
    // The sold-out mirror knows before the advancer's next step.
    if ticket_state == TicketState::Waiting && state.admission.sold_out().is_sold_out(&deal.id) {
        ticket_state = TicketState::SoldOut;
    }
    let group = Group::of_ticket(deal, status.priority);
    let before = admitted_before(deal, status.ahead, group, status.other_waiting);
    let wait = if ticket_state == TicketState::Waiting {
        wait_seconds(before, status.outflow_per_second, terms)
    } else {
        0
    };
    let refresh_max = state.settings.waiting_room.refresh_after_seconds_max.max(1);
    let refresh = (wait / 4).clamp(1, refresh_max);
    let room = state.admission.waiting_room();
    let window = room.checkin_window_tickets(terms);
    let admitted = ticket_state == TicketState::Admitted;
    let expires_s = status.pass_expires_ms.div_euclid(1000);
    let pass = admitted.then(|| {
        room.passes()
            .mint(&deal.id, user.as_str(), expires_s, &status.ticket)
    });
    let waiting = matches!(ticket_state, TicketState::Waiting);
    let units_left = status.units_left.filter(|_| waiting);
    let chance = units_left.map(|left| (left as f64 / (before + 1) as f64).min(1.0));
    let likely_sold_out =
        units_left.is_some_and(|left| before >= left) || ticket_state == TicketState::SoldOut;
    let place = Position {
        ticket: status.ticket.clone(),
        position: status.position,
        is_final: status.position_final,
        priority: status.priority,
    };
    let position_token = room.positions().sign(&deal.id, user.as_str(), &place);
    let view = TicketView {
        ticket: &status.ticket,
        position: status.position,
        position_token,
        position_final: status.position_final,
        checkin_window_tickets: window,
        admitted_through: status.admitted_through,
        ahead: status.ahead,
        group: group.name(),
        estimated_wait_seconds: wait,
        state: ticket_state.as_str(),
        pass,
        pass_expires_at: admitted
            .then(|| DateTime::from_timestamp(expires_s, 0))
            .flatten(),
        pass_expires_in_ms: admitted.then(|| (expires_s * 1000 - status.now_ms).max(0)),
        refresh_after_seconds: refresh,
        units_left,
        chance_of_units: chance,
        likely_sold_out,
        checkout_url: terms.checkout_url.as_deref().filter(|_| admitted),
        checked_in: true,
    };
    let mut response = body::respond(code, &view, Caching::Private);
    response
        .headers_mut()
        .insert(VARY, HeaderValue::from_static("authorization"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimated_wait_follows_the_published_outflow() {
        let terms = WaitingRoomTerms {
            admit_per_second: 100,
            ..WaitingRoomTerms::default()
        };
        assert_eq!(wait_seconds(199, None, &terms), 2);
        assert_eq!(wait_seconds(199, Some(100.0), &terms), 2);
        assert_eq!(wait_seconds(199, Some(25.0), &terms), 8);
        assert_eq!(wait_seconds(0, Some(0.5), &terms), 2);
        assert_eq!(wait_seconds(9, Some(0.0), &terms), 10_000);
    }
}
