//! A deal's waiting-room settings: whether buyers must queue for a pass before ordering,
//! and how fast and how fairly the line moves. The line itself lives in Redis.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::Row;
use sqlx::postgres::PgRow;

use crate::store::rows;

/// Bounds on what a waiting room may be configured with.
pub const ADMIT_PER_SECOND_MAX: i32 = 100_000;
pub const MAX_ACTIVE_MAX: i32 = 10_000_000;
pub const PASS_TTL_SECONDS_MAX: i32 = 86_400;
pub const POW_BITS_MAX: i32 = 32;
pub const CHECKOUT_URL_CHARS_MAX: usize = 2000;
/// Highest `target_p99_ms`: a target past a minute is no target for a buyer.
pub const TARGET_P99_MS_MAX: i32 = 60_000;

/// Who sets a line's outflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum AdmissionMode {
    /// The operator: `admit_per_second`, as typed.
    #[default]
    Fixed,
    /// The advancer, from the health the instances report, within the deal's bounds.
    Adaptive,
}

impl AdmissionMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AdmissionMode::Fixed => "fixed",
            AdmissionMode::Adaptive => "adaptive",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "fixed" => Some(AdmissionMode::Fixed),
            "adaptive" => Some(AdmissionMode::Adaptive),
            _ => None,
        }
    }
}

impl TryFrom<String> for AdmissionMode {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        Self::parse(&text).ok_or_else(|| format!("unknown admission mode {text}"))
    }
}

/// Longest invitation claim name, and longest value, in characters.
pub const INVITATION_CLAIM_CHARS_MAX: usize = 100;
/// Most values an invitation claim may hold.
pub const INVITATION_VALUES_MAX: usize = 100;

/// Who may join the line: buyers whose token claim `claim` holds one of `values`, and
/// (with `codes`) buyers who redeem an access code issued for the deal. Either suffices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Invitation {
    /// The token claim read (an HS256 token's or the provider's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    /// The claim's accepted values; a claim holding a list needs one of them in it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
    /// Access codes (`POST /admin/deals/{id}/access-codes`) let their redeemers in.
    #[serde(default)]
    pub codes: bool,
}

impl Invitation {
    /// Each field's bounds: a claim and values of 1-100 characters, none a control
    /// character (the terms are stored as JSON, which cannot hold a NUL).
    fn validate(&self) -> Result<(), String> {
        let bounded = |text: &str| {
            (1..=INVITATION_CLAIM_CHARS_MAX).contains(&text.chars().count())
                && !text.chars().any(char::is_control)
        };
        if self.claim.as_deref().is_some_and(|claim| !bounded(claim))
            || self.values.len() > INVITATION_VALUES_MAX
            || !self.values.iter().all(|v| bounded(v))
        {
            return Err("waiting_room.invitation takes a claim and 1-100 values of 1-100 characters without control characters".into());
        }
        Ok(())
    }

    /// The rules between fields: a claim needs values and values a claim; without a
    /// claim, codes are the only way in.
    fn check_across_fields(&self) -> Result<(), String> {
        match (&self.claim, self.values.is_empty()) {
            (None, false) => Err("waiting_room.invitation.values needs a claim".into()),
            (Some(_), true) => Err("waiting_room.invitation.claim needs values".into()),
            (None, true) if !self.codes => {
                Err("waiting_room.invitation needs a claim with values, or codes: true".into())
            }
            _ => Ok(()),
        }
    }
}

/// A group whose buyers get a share of the line's admissions: those whose token claim
/// `claim` holds one of `values`, or (with `codes`) who redeemed an access code of the
/// deal. Its buyers wait in a line of their own, which gets `share_percent` of the
/// admissions while both lines have someone waiting, and every admission while only it
/// does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Priority {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
    #[serde(default)]
    pub codes: bool,
    /// The group's share of the admissions while both lines wait, 1-99.
    pub share_percent: u8,
}

impl Priority {
    /// Who is in the group, checked as an invitation's fields are.
    pub fn members(&self) -> Invitation {
        Invitation {
            claim: self.claim.clone(),
            values: self.values.clone(),
            codes: self.codes,
        }
    }

    fn validate(&self) -> Result<(), String> {
        if !(1..=99).contains(&self.share_percent) {
            return Err("waiting_room.priority.share_percent must be 1-99".into());
        }
        self.members()
            .validate()
            .map_err(|e| e.replace("waiting_room.invitation", "waiting_room.priority"))
    }

    fn check_across_fields(&self, terms: &WaitingRoomTerms) -> Result<(), String> {
        if terms.is_random() {
            return Err("waiting_room.priority needs queue_order fifo: a random line's shuffle places one line only".into());
        }
        self.members()
            .check_across_fields()
            .map_err(|e| e.replace("waiting_room.invitation", "waiting_room.priority"))
    }
}

/// When the line is in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// Every buyer takes a ticket and waits for the advancer.
    #[default]
    Always,
    /// While arrivals stay below the outflow and passes below `max_active`, a join is
    /// admitted at once; once they go past it, buyers queue until the line is empty and
    /// calm again (`waiting_room.when_busy_calm_seconds`).
    WhenBusy,
}

impl Activation {
    pub fn as_str(self) -> &'static str {
        match self {
            Activation::Always => "always",
            Activation::WhenBusy => "when_busy",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "always" => Some(Activation::Always),
            "when_busy" => Some(Activation::WhenBusy),
            _ => None,
        }
    }
}

impl TryFrom<String> for Activation {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        Self::parse(&text).ok_or_else(|| format!("unknown activation {text}"))
    }
}

/// How the line's outflow is set; stored in `wr_admission_mode`, `wr_min_per_second`,
/// `wr_max_per_second` and `wr_target_p99_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct AdmissionTerms {
    /// `fixed` admits `admit_per_second`; `adaptive` follows the measured health.
    pub mode: AdmissionMode,
    /// Adaptive: the outflow never goes below this, however bad the health looks, so the
    /// line always moves.
    pub min_per_second: i32,
    /// Adaptive: the outflow never goes above this, however good the health looks.
    pub max_per_second: i32,
    /// Adaptive: the admitted buyers' order p99 above which the outflow is cut.
    pub target_p99_ms: i32,
}

impl<'r> sqlx::FromRow<'r, PgRow> for AdmissionTerms {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            mode: rows::parsed(row, "wr_admission_mode")?,
            min_per_second: row.try_get("wr_min_per_second")?,
            max_per_second: row.try_get("wr_max_per_second")?,
            target_p99_ms: row.try_get("wr_target_p99_ms")?,
        })
    }
}

impl Default for AdmissionTerms {
    fn default() -> Self {
        Self {
            mode: AdmissionMode::Fixed,
            min_per_second: 1,
            max_per_second: 100,
            target_p99_ms: 500,
        }
    }
}

impl AdmissionTerms {
    pub fn is_adaptive(&self) -> bool {
        self.mode == AdmissionMode::Adaptive
    }

    fn validate(&self) -> Result<(), String> {
        if !(1..=ADMIT_PER_SECOND_MAX).contains(&self.min_per_second) {
            return Err("waiting_room.admission.min_per_second must be 1-100000".into());
        }
        if !(1..=ADMIT_PER_SECOND_MAX).contains(&self.max_per_second) {
            return Err("waiting_room.admission.max_per_second must be 1-100000".into());
        }
        if !(1..=TARGET_P99_MS_MAX).contains(&self.target_p99_ms) {
            return Err("waiting_room.admission.target_p99_ms must be 1-60000".into());
        }
        Ok(())
    }
}

/// How a deal's line behaves; stored in the `wr_*` columns of `deals`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WaitingRoomTerms {
    /// When true, orders need a pass (`Flashgate-Pass`) earned by queueing.
    pub enabled: bool,
    /// Tickets admitted per second, at most.
    pub admit_per_second: i32,
    /// Passes that may be in use at once; admission pauses while this many are outstanding.
    pub max_active: i32,
    /// How long a pass may be used to order, and how long its slot stays taken if unused.
    pub pass_ttl_seconds: i32,
    /// `fifo`, or `random`: tickets taken before the sale opens are shuffled at opening with
    /// a seed whose SHA-256 is published beforehand.
    pub queue_order: String,
    /// When tickets may first be taken; without it, from `starts_at`.
    pub prequeue_opens_at: Option<DateTime<Utc>>,
    /// Leading zero bits of the proof of work asked when joining (0: none); raised with the
    /// crowd's size (`waiting_room.pow_crowd_step`).
    pub pow_bits: i32,
    /// Where the waiting page sends an admitted buyer, with the pass in the fragment.
    pub checkout_url: Option<String>,
    /// Who sets the outflow: the operator's `admit_per_second`, or the measured health.
    pub admission: AdmissionTerms,
    /// `always` queues every buyer; `when_busy` admits at once while the line is calm.
    pub activation: Activation,
    /// Who may join; everyone when absent.
    pub invitation: Option<Invitation>,
    /// A group with a share of the admissions; none when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
    /// The deal's own waiting page (`page_template`), in place of the standard one; read
    /// only where the page is served (a query without the column leaves it out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page_template: Option<String>,
}

impl<'r> sqlx::FromRow<'r, PgRow> for WaitingRoomTerms {
    fn from_row(row: &'r PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            enabled: row.try_get("wr_enabled")?,
            admit_per_second: row.try_get("wr_admit_per_second")?,
            max_active: row.try_get("wr_max_active")?,
            pass_ttl_seconds: row.try_get("wr_pass_ttl_seconds")?,
            queue_order: row.try_get("wr_queue_order")?,
            prequeue_opens_at: row.try_get("wr_prequeue_opens_at")?,
            pow_bits: row.try_get("wr_pow_bits")?,
            checkout_url: row.try_get("wr_checkout_url")?,
            admission: AdmissionTerms::from_row(row)?,
            activation: rows::parsed(row, "wr_activation")?,
            invitation: rows::json(row, "wr_invitation")?,
            priority: rows::json(row, "wr_priority")?,
            page_template: rows::if_selected(row, "wr_page_template")?,
        })
    }
}

impl Default for WaitingRoomTerms {
    fn default() -> Self {
        Self {
            enabled: false,
            admit_per_second: 100,
            max_active: 1000,
            pass_ttl_seconds: 120,
            queue_order: "fifo".into(),
            prequeue_opens_at: None,
            pow_bits: 0,
            checkout_url: None,
            admission: AdmissionTerms::default(),
            activation: Activation::Always,
            invitation: None,
            priority: None,
            page_template: None,
        }
    }
}

impl WaitingRoomTerms {
    pub fn is_random(&self) -> bool {
        self.queue_order == "random"
    }

    pub fn when_busy(&self) -> bool {
        self.activation == Activation::WhenBusy
    }

    /// Whether access codes mean something on this line: they invite, or they place their
    /// redeemers in the priority group.
    pub fn takes_codes(&self) -> bool {
        let invites = self.invitation.as_ref().is_some_and(|i| i.codes);
        let prioritises = self.priority.as_ref().is_some_and(|p| p.codes);
        self.enabled && (invites || prioritises)
    }

    /// Checks the bounds; the message names the offending field.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=ADMIT_PER_SECOND_MAX).contains(&self.admit_per_second) {
            return Err("waiting_room.admit_per_second must be 1-100000".into());
        }
        if !(1..=MAX_ACTIVE_MAX).contains(&self.max_active) {
            return Err("waiting_room.max_active must be 1-10000000".into());
        }
        if !(1..=PASS_TTL_SECONDS_MAX).contains(&self.pass_ttl_seconds) {
            return Err("waiting_room.pass_ttl_seconds must be 1-86400".into());
        }
        if !matches!(self.queue_order.as_str(), "fifo" | "random") {
            return Err("waiting_room.queue_order must be fifo or random".into());
        }
        if !(0..=POW_BITS_MAX).contains(&self.pow_bits) {
            return Err("waiting_room.pow_bits must be 0-32".into());
        }
        if let Some(url) = &self.checkout_url
            && (url.chars().count() > CHECKOUT_URL_CHARS_MAX
                || !(url.starts_with("https://") || url.starts_with("http://"))
                || url.len() <= "http://".len()
                || url.chars().any(|c| c.is_whitespace() || c.is_control()))
        {
            return Err(
                "waiting_room.checkout_url must be an http(s) URL of at most 2000 characters"
                    .into(),
            );
        }
        if let Some(invitation) = &self.invitation {
            invitation.validate()?;
        }
        if let Some(priority) = &self.priority {
            priority.validate()?;
        }
        if let Some(template) = &self.page_template {
            super::page_template::parse(template)?;
        }
        self.admission.validate()
    }

    /// The rules between fields: the line's floor under its ceiling, and tickets not
    /// opening after the sale starts (`starts_at`).
    pub fn check_across_fields(&self, starts_at: Option<DateTime<Utc>>) -> Result<(), String> {
        if let Some(invitation) = &self.invitation {
            invitation.check_across_fields()?;
        }
        if let Some(priority) = &self.priority {
            priority.check_across_fields(self)?;
        }
        let (min, max) = (self.admission.min_per_second, self.admission.max_per_second);
        if min > max {
            return Err(format!(
                "waiting_room.admission.min_per_second ({min}) must not be above max_per_second ({max})"
            ));
        }
        if let (Some(opens), Some(starts)) = (self.prequeue_opens_at, starts_at)
            && opens > starts
        {
            return Err("waiting_room.prequeue_opens_at must not be after starts_at".into());
        }
        Ok(())
    }

    /// Whether tickets may be taken at `now` (the sale's end is checked by the caller).
    pub fn queue_open(&self, starts_at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> bool {
        match self.prequeue_opens_at.or(starts_at) {
            Some(opens) => now >= opens,
            None => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bounds_are_checked() {
        let starts = Some(crate::clock::Clock::system().now());
        assert_eq!(WaitingRoomTerms::default().validate(), Ok(()));
        assert_eq!(
            WaitingRoomTerms::default().check_across_fields(starts),
            Ok(())
        );
        let bad = [
            WaitingRoomTerms {
                admit_per_second: 0,
                ..Default::default()
            },
            WaitingRoomTerms {
                max_active: 0,
                ..Default::default()
            },
            WaitingRoomTerms {
                pass_ttl_seconds: PASS_TTL_SECONDS_MAX + 1,
                ..Default::default()
            },
            WaitingRoomTerms {
                queue_order: "lifo".into(),
                ..Default::default()
            },
            WaitingRoomTerms {
                pow_bits: 33,
                ..Default::default()
            },
            WaitingRoomTerms {
                checkout_url: Some("javascript:alert(1)".into()),
                ..Default::default()
            },
            WaitingRoomTerms {
                admission: AdmissionTerms {
                    min_per_second: 10,
                    max_per_second: 9,
                    ..Default::default()
                },
                ..Default::default()
            },
            WaitingRoomTerms {
                admission: AdmissionTerms {
                    target_p99_ms: 0,
                    ..Default::default()
                },
                ..Default::default()
            },
            WaitingRoomTerms {
                prequeue_opens_at: starts.map(|s| s + chrono::Duration::seconds(1)),
                ..Default::default()
            },
        ];
        for terms in bad {
            let checked = terms.validate().and(terms.check_across_fields(starts));
            assert!(checked.is_err(), "{terms:?}");
        }
    }

    #[test]
    fn an_invitation_breaks_a_bound_or_a_rule_between_its_fields() {
        let invitation = |claim: Option<&str>, values: &[&str], codes: bool| Invitation {
            claim: claim.map(str::to_owned),
            values: values.iter().map(|v| (*v).to_owned()).collect(),
            codes,
        };
        let long = "é".repeat(INVITATION_CLAIM_CHARS_MAX);
        let fine = [
            invitation(Some("tier"), &["gold", &long], false),
            invitation(None, &[], true),
        ];
        for terms in fine {
            assert_eq!(terms.validate().and(terms.check_across_fields()), Ok(()));
        }
        let out_of_bounds = [
            invitation(Some("tier"), &["go\0ld"], false),
            invitation(Some(""), &["gold"], false),
            invitation(Some("tier"), &[&format!("{long}e")], false),
        ];
        for terms in out_of_bounds {
            assert!(terms.validate().is_err(), "{terms:?}");
            assert_eq!(terms.check_across_fields(), Ok(()), "{terms:?}");
        }
        let inconsistent = [
            invitation(None, &["gold"], true),
            invitation(Some("tier"), &[], true),
            invitation(None, &[], false),
        ];
        for terms in inconsistent {
            assert_eq!(terms.validate(), Ok(()), "{terms:?}");
            assert!(terms.check_across_fields().is_err(), "{terms:?}");
        }
    }

    #[test]
    fn the_queue_opens_at_the_prequeue_or_the_start() {
        let now = crate::clock::Clock::system().now();
        let later = Some(now + chrono::Duration::seconds(60));
        let earlier = Some(now - chrono::Duration::seconds(60));
        let terms = WaitingRoomTerms::default();
        assert!(terms.queue_open(None, now));
        assert!(!terms.queue_open(later, now));
        let prequeue = WaitingRoomTerms {
            prequeue_opens_at: earlier,
            ..Default::default()
        };
        assert!(prequeue.queue_open(later, now));
    }
}
