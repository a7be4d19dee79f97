//! The `flashgate deals create` options of a deal's waiting room.

use chrono::{DateTime, Utc};

use crate::deals::{
    Activation, AdmissionMode, AdmissionTerms, Invitation, Priority, WaitingRoomTerms,
};

/// The deal's waiting room; the tuning options need `--waiting-room`.
#[derive(Debug, clap::Args)]
pub(super) struct WaitingRoomArgs {
    /// Buyers queue for a pass before ordering (tuned by the options below).
    #[arg(long)]
    waiting_room: bool,
    /// Tickets admitted per second, at most.
    #[arg(long, requires = "waiting_room", value_name = "N")]
    admit_per_second: Option<i32>,
    /// Passes that may be in use at once; admission pauses while this many are out.
    #[arg(long, requires = "waiting_room", value_name = "N")]
    max_active: Option<i32>,
    /// How long a pass may be used to order.
    #[arg(long, requires = "waiting_room", value_name = "SECONDS")]
    pass_ttl_seconds: Option<i32>,
    /// `fifo`, or `random`: tickets taken before the sale opens are shuffled at opening.
    #[arg(long, requires = "waiting_room", value_parser = ["fifo", "random"])]
    queue_order: Option<String>,
    /// RFC 3339: when tickets may first be taken; from `--starts-at` when left out.
    #[arg(long, requires = "waiting_room", value_name = "TIME")]
    prequeue_opens_at: Option<DateTime<Utc>>,
    /// Leading zero bits of the proof of work asked when joining (0: none).
    #[arg(long, requires = "waiting_room", value_name = "BITS")]
    pow_bits: Option<i32>,
    /// Where the waiting page sends an admitted buyer, with the pass in the fragment.
    #[arg(long, requires = "waiting_room", value_name = "URL")]
    checkout_url: Option<String>,
    /// `fixed` (admit `--admit-per-second`) or `adaptive` (follow the measured health).
    #[arg(long, requires = "waiting_room", value_parser = ["fixed", "adaptive"])]
    admission: Option<String>,
    /// Adaptive: the outflow never goes below this.
    #[arg(long, requires = "waiting_room", value_name = "N")]
    min_per_second: Option<i32>,
    /// Adaptive: the outflow never goes above this.
    #[arg(long, requires = "waiting_room", value_name = "N")]
    max_per_second: Option<i32>,
    /// Adaptive: the admitted buyers' order p99 above which the outflow is cut.
    #[arg(long, requires = "waiting_room", value_name = "MS")]
    target_p99_ms: Option<i32>,
    /// `always` (every buyer queues) or `when_busy` (admitted at once while the line is calm).
    #[arg(long, requires = "waiting_room", value_parser = ["always", "when_busy"])]
    activation: Option<String>,
    /// Only buyers whose token claim NAME holds one of `--invitation-value` may join.
    #[arg(long, requires = "invitation_value", value_name = "NAME")]
    invitation_claim: Option<String>,
    /// A value `--invitation-claim` may hold (repeat for more).
    #[arg(long, requires = "invitation_claim", value_name = "VALUE")]
    invitation_value: Vec<String>,
    /// Buyers redeeming an access code (`flashgate deals access-codes`) may join.
    #[arg(long, requires = "waiting_room")]
    invitation_codes: bool,
    /// A priority group's share of the admissions while both lines wait, 1-99; its members
    /// by `--priority-claim` or `--priority-codes`.
    #[arg(long, requires = "waiting_room", value_name = "PERCENT")]
    priority_share_percent: Option<u8>,
    /// Buyers whose token claim NAME holds one of `--priority-value` are the priority group.
    #[arg(long, requires_all = ["priority_value", "priority_share_percent"], value_name = "NAME")]
    priority_claim: Option<String>,
    /// A value `--priority-claim` may hold (repeat for more).
    #[arg(long, requires = "priority_claim", value_name = "VALUE")]
    priority_value: Vec<String>,
    /// Buyers who redeemed an access code are the priority group.
    #[arg(long, requires = "priority_share_percent")]
    priority_codes: bool,
}

impl WaitingRoomArgs {
    pub(super) fn into_terms(self) -> WaitingRoomTerms {
        let defaults = WaitingRoomTerms::default();
        WaitingRoomTerms {
            enabled: self.waiting_room,
            admit_per_second: self.admit_per_second.unwrap_or(defaults.admit_per_second),
            max_active: self.max_active.unwrap_or(defaults.max_active),
            pass_ttl_seconds: self.pass_ttl_seconds.unwrap_or(defaults.pass_ttl_seconds),
            queue_order: self.queue_order.unwrap_or(defaults.queue_order),
            prequeue_opens_at: self.prequeue_opens_at,
            pow_bits: self.pow_bits.unwrap_or(defaults.pow_bits),
            checkout_url: self.checkout_url,
            activation: self
                .activation
                .as_deref()
                .and_then(Activation::parse)
                .unwrap_or_default(),
            invitation: (self.invitation_claim.is_some() || self.invitation_codes).then_some(
                Invitation {
                    claim: self.invitation_claim,
                    values: self.invitation_value,
                    codes: self.invitation_codes,
                },
            ),
            admission: AdmissionTerms {
                mode: self
                    .admission
                    .as_deref()
                    .and_then(AdmissionMode::parse)
                    .unwrap_or_default(),
                min_per_second: self
                    .min_per_second
                    .unwrap_or(defaults.admission.min_per_second),
                max_per_second: self
                    .max_per_second
                    .unwrap_or(defaults.admission.max_per_second),
                target_p99_ms: self
                    .target_p99_ms
                    .unwrap_or(defaults.admission.target_p99_ms),
            },
            priority: self.priority_share_percent.map(|share_percent| Priority {
                claim: self.priority_claim,
                values: self.priority_value,
                codes: self.priority_codes,
                share_percent,
            }),
            page_template: None,
        }
    }
}
