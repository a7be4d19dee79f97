//! Each line's outflow for the next step: the operator's `admit_per_second` for a fixed line,
//! the controller's decision for an adaptive one (the IO around `controller::decide`).

use super::Advancer;
use super::lines::Line;
use crate::deals::AdmissionTerms;
use crate::waiting_room::WaitingRoomSettings;
use crate::waiting_room::controller::{self, Bounds, Control, Reason};
use crate::waiting_room::health;

/// The rate a line admits at this step, and what it was decided from.
#[derive(Debug, Clone, Copy)]
pub(super) struct Outflow {
    pub per_second: f64,
    /// The worst instance's p99 the decision saw (seconds); `None` for a fixed line or
    /// without any order timed.
    pub p99_seconds: Option<f64>,
}

/// The controller's bounds for a deal's terms under the section's tuning.
pub(super) fn bounds(terms: &AdmissionTerms, settings: &WaitingRoomSettings) -> Bounds {
    Bounds {
        min_per_second: f64::from(terms.min_per_second),
        max_per_second: f64::from(terms.max_per_second),
        target_p99_seconds: f64::from(terms.target_p99_ms) / 1000.0,
        cut_keep: f64::from(settings.adaptive_cut_to_percent) / 100.0,
        climb_share_per_second: f64::from(settings.adaptive_climb_percent_per_second) / 100.0,
        cut_cooldown_ms: i64::try_from(settings.adaptive_cut_cooldown_ms).unwrap_or(i64::MAX),
        hold_share: f64::from(settings.adaptive_hold_percent) / 100.0,
        probe_share: f64::from(settings.adaptive_probe_percent) / 100.0,
    }
}

impl Advancer {
    /// The line's outflow: fixed, or decided from the instances' health. A health that
    /// cannot be read (Redis unreachable for it) gives the deal's floor, never more.
    pub(super) async fn outflow(&mut self, line: &Line) -> Outflow {
        let terms = &line.terms.admission;
        if !terms.is_adaptive() {
            self.controls.remove(&line.id);
            return Outflow {
                per_second: f64::from(line.terms.admit_per_second),
                p99_seconds: None,
            };
        }
        let bounds = bounds(terms, &self.room.settings);
        let age = self
            .room
            .clock()
            .instant()
            .saturating_duration_since(self.started);
        let now_ms = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
        let reading = health::read(&self.room, &line.id).await;
        if let Err(error) = &reading {
            tracing::debug!(%error, deal = line.id, "line health not read");
        }
        let reading = reading.ok();
        let published = reading.as_ref().and_then(|r| r.outflow);
        let state = *self
            .controls
            .entry(line.id.clone())
            .or_insert_with(|| Control::resume(published, &bounds, now_ms));
        let health = reading.as_ref().map(|r| r.health);
        let (next, reason) = controller::decide(state, health.as_ref(), &bounds, now_ms);
        self.controls.insert(line.id.clone(), next);
        log_decision(&line.id, &state, &next, reason, health.as_ref());
        Outflow {
            per_second: next.outflow,
            p99_seconds: health.and_then(|h| h.p99_seconds),
        }
    }

    /// Hands an adaptive line's controller the buyers this step admitted.
    pub(super) fn count_admitted(&mut self, line: &Line, admitted: i64) {
        if let Some(control) = self.controls.get_mut(&line.id) {
            control.admitted_since += admitted.max(0) as f64;
        }
    }
}

/// A cut is logged with the signal that caused it; so is falling back to the floor.
fn log_decision(
    deal: &str,
    before: &Control,
    after: &Control,
    reason: Reason,
    health: Option<&controller::Health>,
) {
    let p99_ms = health.and_then(|h| h.p99_seconds).map(|s| s * 1000.0);
    if reason.is_cut() {
        tracing::warn!(
            deal,
            signal = reason.as_str(),
            from_per_second = before.outflow,
            to_per_second = after.outflow,
            p99_ms,
            overloaded = health.map_or(0, |h| h.overloaded),
            "waiting-room outflow cut"
        );
    } else if reason == Reason::NoHealth && before.outflow != after.outflow {
        tracing::warn!(
            deal,
            signal = reason.as_str(),
            from_per_second = before.outflow,
            to_per_second = after.outflow,
            "waiting-room outflow at its floor: health unreadable"
        );
    }
}
