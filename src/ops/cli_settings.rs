//! What the operator commands reach, apart from the commands themselves: every command
//! module takes it, so none of them imports another for it.

use super::audit;
use crate::redis_link::RedisSettings;
use crate::store::DatabaseSettings;
use crate::waiting_room::WaitingRoomSettings;

/// What the operator commands reach: the stores, the waiting room and the audit's options.
pub struct CliSettings {
    pub database: DatabaseSettings,
    pub redis: RedisSettings,
    pub waiting_room: WaitingRoomSettings,
    pub audit: audit::Options,
    /// The checks of endpoint URLs and rotation overlaps, and the feed's page limit.
    pub events: crate::events::EventSettings,
}
