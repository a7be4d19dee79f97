//! A deal's priority group (`waiting_room.priority`): who is in it, and what its share of
//! the admissions means for the places, waits and odds each group is shown.
//!
//! The group waits in a line of its own beside everyone else's (`scripts`); while both
//! lines have someone waiting, the advancer gives the group `share_percent` of the
//! admissions, to within one ticket, and while only one does, that one gets them all. So a
//! ticket's turn comes after those ahead of it in its own line and the other line's share
//! of the admissions meanwhile: [`before`] counts them, and the estimates use that count
//! rather than the place in one line alone.

use sqlx::PgPool;

use super::invitation::{self, CodeHolding, InvitationError, claim_holds};
use crate::deals::Deal;
use crate::domain::ClaimSet;

/// Which of a line's groups a ticket waits in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Group {
    /// The line has no priority group.
    Only,
    General,
    Priority,
}

impl Group {
    /// The group as the line's join script takes it (`ARGV[15]`).
    pub fn as_arg(self) -> &'static str {
        match self {
            Self::Only => "",
            Self::General => "0",
            Self::Priority => "1",
        }
    }

    /// The group as a ticket answer names it; `None` on a line without groups.
    pub fn name(self) -> Option<&'static str> {
        match self {
            Self::Only => None,
            Self::General => Some("general"),
            Self::Priority => Some("priority"),
        }
    }

    /// The group of a ticket the line's scripts marked (or not) as the priority group's.
    pub fn of_ticket(deal: &Deal, marked: bool) -> Self {
        match (deal.waiting_room.priority.is_some(), marked) {
            (false, _) => Self::Only,
            (true, false) => Self::General,
            (true, true) => Self::Priority,
        }
    }
}

/// Whether `user` may join the deal's line (`invitation`), and in which group: the priority
/// group when the token's claim or a code of the deal puts them in it. `code` is the access
/// code the join shows, if any; PostgreSQL is asked about codes at most once, and an
/// unknown or someone else's code is refused, not quietly ignored.
pub async fn admit(
    pool: &PgPool,
    deal: &Deal,
    user: &str,
    claims: &ClaimSet,
    code: Option<&str>,
) -> Result<Group, InvitationError> {
    let mut codes = CodeHolding::new(pool, &deal.id, user, code);
    invitation::check(deal, claims, &mut codes).await?;
    let Some(priority) = &deal.waiting_room.priority else {
        return Ok(Group::Only);
    };
    let by_claim = claim_holds(priority.claim.as_deref(), &priority.values, claims);
    if by_claim || (priority.codes && codes.holds().await?) {
        return Ok(Group::Priority);
    }
    Ok(Group::General)
}

/// The tickets admitted before a ticket `ahead` places from the front of its group's line:
/// those `ahead`, and the other group's share of the admissions until this one's turn,
/// at most the `other_waiting` now in the other line. Buyers who join the other line later
/// can only add to its share's count while it was short of it.
pub fn before(ahead: u64, group: Group, share_percent: u8, other_waiting: u64) -> u64 {
    let share = u64::from(share_percent.clamp(1, 99));
    let (own, other) = match group {
        Group::Only => return ahead,
        Group::Priority => (share, 100 - share),
        Group::General => (100 - share, share),
    };
    let others = (ahead + 1).saturating_mul(other).div_ceil(own);
    ahead.saturating_add(others.min(other_waiting))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_without_groups_counts_its_own_places_only() {
        assert_eq!(before(41, Group::Only, 50, 1_000), 41);
    }

    #[test]
    fn each_group_waits_for_the_others_share_of_the_admissions() {
        // Half each: one of the other line's for each of one's own, this ticket's included.
        assert_eq!(before(9, Group::Priority, 50, 1_000), 19);
        assert_eq!(before(9, Group::General, 50, 1_000), 19);
        // A fifth for the priority group: four general admissions to each priority one.
        assert_eq!(before(9, Group::Priority, 20, 1_000), 49);
        assert_eq!(before(9, Group::General, 20, 1_000), 12);
        // The first of a line still waits for the other's share of its own turn.
        assert_eq!(before(0, Group::General, 20, 1_000), 1);
    }

    #[test]
    fn the_other_line_counts_only_those_waiting_in_it() {
        assert_eq!(before(9, Group::General, 50, 3), 12);
        assert_eq!(before(9, Group::Priority, 50, 0), 9);
    }
}
