//! Manual control of a line's outflow during a sale.
//!
//! An operator who does not like what the adaptive loop does takes over in one call: the
//! line switches to `fixed` at the rate it was admitting at that moment (the outflow the
//! advancer last published), or at a rate the operator names. Switching back to
//! `adaptive` hands the rate to the loop again, which resumes from the published outflow.

use sqlx::PgPool;

use crate::deals::{self, AdmissionMode, Deal, DealError};
use crate::waiting_room::WaitingRoom;

/// Sets the deal's admission mode; `fixed` takes `admit_per_second`, or when that is not
/// given the line's current outflow. Returns the deal as it reads afterwards.
pub async fn set_mode(
    pool: &PgPool,
    room: &WaitingRoom,
    deal_id: &str,
    mode: AdmissionMode,
    admit_per_second: Option<i32>,
) -> Result<Deal, DealError> {
    let rate = match (mode, admit_per_second) {
        (AdmissionMode::Fixed, None) => current_rate(room, deal_id).await,
        (_, rate) => rate,
    };
    deals::set_admission(pool, deal_id, mode, rate)
        .await?
        .ok_or(DealError::NotFound)
}

/// The outflow the line admits at now, as a whole rate of at least 1; `None` before the
/// advancer published one (or without Redis): the deal keeps its `admit_per_second`.
pub async fn current_rate(room: &WaitingRoom, deal_id: &str) -> Option<i32> {
    let line = room.line(deal_id).await.ok()?;
    let rate = line.outflow_per_second?.round().max(1.0);
    Some(rate.min(f64::from(deals::ADMIT_PER_SECOND_MAX)) as i32)
}
