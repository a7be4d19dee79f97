//! Admission: everything that can turn a request away before it touches inventory.
//!
//! The checks run cheapest first and none of them makes a PostgreSQL round trip on the
//! rejection path: client address → per-IP limit → sold-out mirror (whose only exception,
//! a user retrying an order of that deal, is known from memory) → deal settings (cached:
//! unknown deal) → sale window → paused → token (HS256, or a provider's, see `oidc`) →
//! per-user limit → per-deal limit → the shared per-user and per-deal budgets in Redis
//! (`global`: none while this instance's share of the user's budget and the deal's slice
//! last, else one script call) → waiting-room pass (an HMAC
//! checked in memory) → per-user quantity.
//! What passes is an `Admitted` order request, the only way into the order path.

pub mod client_ip;
pub mod global;
pub mod limits;
pub mod oidc;
mod settings;
pub mod slices;
pub mod soldout;
pub mod token;
mod token_error;
pub mod user_share;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use crate::clock::Clock;
use crate::deals::{Deal, DealCache, Window};
use crate::domain::{DealId, Quantity, UserId};
use crate::redis_link::RedisHandle;
use crate::store::StoreError;
use crate::telemetry;
use crate::waiting_room::{PassError, VerifiedPass, WaitingRoom};

use client_ip::ClientIp;
use global::GlobalLimits;
use limits::{Limited, RateLimits};
pub use oidc::ClaimSet;
use oidc::{Identity, OidcVerifier};
use soldout::{Flag, SoldOut};
use token::{TokenError, TokenVerifier, Tokens};

pub use settings::{
    AdmissionSettings, AuthSettings, GlobalLimitSettings, LimitSettings, RateSettings,
    SoldOutSettings,
};

/// An order's deal that the sold-out mirror let through, before the order's body was read.
/// Only [`Admission::check_sold_out`] makes one and [`Admission::admit_order`] asks for
/// it, so the mirror is read once per order.
#[derive(Debug)]
pub struct SoldOutChecked(DealId);

impl SoldOutChecked {
    pub fn deal(&self) -> &DealId {
        &self.0
    }
}

/// Why admission turned a request away.
#[derive(Debug, thiserror::Error)]
pub enum Rejection {
    #[error("rate limited ({})", .0.scope.as_str())]
    RateLimited(Limited),
    #[error("sold out")]
    SoldOut,
    #[error(transparent)]
    Unauthorized(#[from] TokenError),
    #[error("no such deal")]
    UnknownDeal,
    #[error("the sale is {}", if *.0 == Window::Upcoming { "not open yet" } else { "over" })]
    SaleNotOpen(Window),
    /// The operators paused the deal; answered like a closed sale.
    #[error("the sale is paused")]
    SalePaused,
    #[error("at most {limit} units per user")]
    PerUserLimit { limit: i32 },
    /// The deal has a waiting room and the request carries no valid pass for it.
    #[error(transparent)]
    WaitingRoomRequired(PassError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Rejection {
    /// The metric label (and the admission span's outcome).
    pub fn reason(&self) -> &'static str {
        match self {
            Rejection::RateLimited(limited) => limited.scope.rejection_reason(),
            Rejection::SoldOut => "sold_out",
            Rejection::Unauthorized(TokenError::KeysUnavailable { .. }) => "keys_unavailable",
            Rejection::Unauthorized(_) => "unauthorized",
            Rejection::UnknownDeal => "unknown_deal",
            Rejection::SaleNotOpen(_) => "sale_not_open",
            Rejection::SalePaused => "sale_paused",
            Rejection::PerUserLimit { .. } => "per_user_limit",
            Rejection::WaitingRoomRequired(_) => "waiting_room_required",
            Rejection::Store(_) => "overloaded",
        }
    }
}

/// An order request that passed every admission check.
#[derive(Debug)]
pub struct Admitted {
    pub user: UserId,
    pub deal: Arc<Deal>,
    pub quantity: Quantity,
    /// The waiting-room pass the order came with, if the deal has a waiting room.
    pub pass: Option<VerifiedPass>,
}

pub struct Admission {
    client_ip: ClientIp,
    limits: RateLimits,
    global: GlobalLimits,
    tokens: Tokens,
    sold_out: SoldOut,
    deals: DealCache,
    waiting_room: WaitingRoom,
    /// Decides the sale window; every part of admission that keeps time shares it.
    clock: Clock,
}

impl Admission {
    /// `provider` verifies the tokens of `[auth.oidc]`, when one is configured (its keys
    /// are read before admission is built, see `OidcVerifier::start`).
    pub fn new(
        settings: AdmissionSettings<'_>,
        redis: RedisHandle,
        clock: Clock,
        provider: Option<Arc<OidcVerifier>>,
    ) -> Self {
        Self {
            client_ip: ClientIp::new(settings.trusted_proxies.to_vec()),
            limits: RateLimits::new(settings.limits),
            global: GlobalLimits::new(settings.limits, redis.clone(), clock.clone()),
            tokens: Tokens::new(
                TokenVerifier::new(
                    &settings.auth.jwt_secret,
                    token::Audience::of(settings.auth),
                    settings.auth.jwt_leeway_seconds,
                    settings.auth.user_id_bytes_max,
                    clock.clone(),
                ),
                provider,
            ),
            sold_out: SoldOut::new(
                redis.clone(),
                settings.soldout.holders_max,
                Duration::from_millis(settings.soldout.holders_refresh_ms),
                clock.clone(),
            ),
            deals: DealCache::new(
                Duration::from_millis(settings.deals.cache_ttl_ms),
                settings.deals.cache_entries_max,
                settings.deals.catalogue_ids_max,
                clock.clone(),
            ),
            waiting_room: WaitingRoom::new(settings.waiting_room, redis, clock.clone()),
            clock,
        }
    }

    /// The provider's verifier, when `[auth.oidc]` names one (its keys are refreshed by
    /// a background task).
    pub fn provider(&self) -> Option<&Arc<OidcVerifier>> {
        self.tokens.provider()
    }

    /// The application's clock.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    pub fn waiting_room(&self) -> &WaitingRoom {
        &self.waiting_room
    }

    pub fn sold_out(&self) -> &SoldOut {
        &self.sold_out
    }

    pub fn deals(&self) -> &DealCache {
        &self.deals
    }

    pub fn limits(&self) -> &RateLimits {
        &self.limits
    }

    pub fn global_limits(&self) -> &GlobalLimits {
        &self.global
    }

    /// The client address, believing the header values only from trusted proxies.
    pub fn client_ip<'a>(
        &self,
        peer: IpAddr,
        header_values: impl DoubleEndedIterator<Item = &'a [u8]>,
    ) -> IpAddr {
        self.client_ip.resolve(peer, header_values)
    }

    /// True when `peer` is a trusted proxy carrying many clients' connections.
    pub fn is_trusted_proxy(&self, peer: IpAddr) -> bool {
        self.client_ip.is_trusted(peer)
    }

    pub fn check_ip(&self, ip: IpAddr) -> Result<(), Rejection> {
        self.limits
            .check_ip(ip)
            .map_err(|l| counted(Rejection::RateLimited(l)))
    }

    /// Verifies a bearer token as an operator's or a user's, without the per-user limit.
    pub async fn identify(&self, authorization: Option<&[u8]>) -> Result<Identity, TokenError> {
        self.tokens.verify(authorization).await
    }

    /// Verifies the bearer token and applies the per-user limit.
    pub async fn authenticate(&self, authorization: Option<&[u8]>) -> Result<UserId, Rejection> {
        Ok(self.authenticate_claims(authorization).await?.0)
    }

    /// `authenticate`, with the token's claims for a rule that reads one.
    pub async fn authenticate_claims(
        &self,
        authorization: Option<&[u8]>,
    ) -> Result<(UserId, ClaimSet), Rejection> {
        let identity = self
            .tokens
            .verify(authorization)
            .await
            .map_err(|e| counted(e.into()))?;
        self.limits
            .check_user(identity.user.as_str())
            .map_err(|l| counted(Rejection::RateLimited(l)))?;
        Ok((identity.user, identity.claims))
    }

    /// The rest of the pipeline for placing an order, after the per-IP check and the
    /// sold-out mirror, which the HTTP layer ran before reading the body.
    pub async fn admit_order(
        &self,
        pool: &PgPool,
        checked: &SoldOutChecked,
        authorization: Option<&[u8]>,
        pass: Option<&[u8]>,
        quantity: Quantity,
    ) -> Result<Admitted, Rejection> {
        let deal_id = checked.0.as_str();
        // Refusals that hold whoever asks come before the signature check, which can cost
        // tens of microseconds for a provider's token; the deal is read from the cache
        // (and an unknown id from the catalogue) almost always.
        let deal = self.deal(pool, deal_id).await.map_err(counted)?;
        match deal.window(self.clock.now()) {
            Window::Open => {}
            closed => return Err(counted(Rejection::SaleNotOpen(closed))),
        }
        if deal.paused {
            return Err(counted(Rejection::SalePaused));
        }
        let user = self.authenticate(authorization).await?;
        self.limits
            .check_deal(deal_id)
            .map_err(|l| counted(Rejection::RateLimited(l)))?;
        self.check_shared(user.as_str(), deal_id).await?;
        // In memory only: the HMAC and the bindings, no Redis or PostgreSQL round trip.
        let pass = if deal.waiting_room.enabled {
            let verified = self
                .waiting_room
                .check_pass(pass, &deal.id, user.as_str())
                .map_err(|e| counted(Rejection::WaitingRoomRequired(e)))?;
            Some(verified)
        } else {
            None
        };
        Ok(Admitted {
            user,
            deal,
            quantity,
            pass,
        })
    }

    /// The budgets all instances share: the user's first, so that a user over the limit
    /// does not use up the deal's.
    async fn check_shared(&self, user_id: &str, deal_id: &str) -> Result<(), Rejection> {
        self.global
            .check_user(user_id)
            .await
            .map_err(|l| counted(Rejection::RateLimited(l)))?;
        self.global
            .check_deal(deal_id)
            .await
            .map_err(|l| counted(Rejection::RateLimited(l)))
    }

    /// The sold-out mirror, from memory: the HTTP layer calls it before reading the body,
    /// so the flood after a sell-out costs no more than parsing its head. Only valid ids
    /// are ever flagged, so the raw id is looked up first and a flood is refused without
    /// parsing or copying it.
    pub fn check_sold_out(
        &self,
        raw_id: &str,
        authorization: Option<&[u8]>,
    ) -> Result<SoldOutChecked, Rejection> {
        let refused = match self.sold_out.flag(raw_id) {
            Flag::Clear => false,
            Flag::SoldOut => true,
            Flag::SoldOutWithHolders => !self.may_replay(raw_id, authorization),
        };
        if refused {
            return Err(counted(Rejection::SoldOut));
        }
        let deal = DealId::parse(raw_id).map_err(|_| Rejection::UnknownDeal)?;
        Ok(SoldOutChecked(deal))
    }

    /// A sold-out deal still lets through users who ordered it, whose request may be the
    /// retry of an order they hold; PostgreSQL then replays it or answers sold out.
    /// Whom the token names is read first, unverified: anyone else is refused whatever
    /// the token is worth, so only a request the mirror would let through pays for the
    /// signature check.
    fn may_replay(&self, deal_id: &str, authorization: Option<&[u8]>) -> bool {
        let claimed = token::with_claimed_subject(authorization, |claimed| {
            self.sold_out.may_replay(deal_id, claimed)
        });
        claimed == Some(true)
            && self
                .tokens
                .verify_held(authorization)
                .is_ok_and(|identity| self.sold_out.may_replay(deal_id, identity.user.as_str()))
    }

    /// The deal's cached settings.
    pub async fn deal(&self, pool: &PgPool, deal_id: &str) -> Result<Arc<Deal>, Rejection> {
        self.deals
            .get(pool, deal_id)
            .await?
            .ok_or(Rejection::UnknownDeal)
    }
}

/// Counts a rejection once, where it is made (in this thread's tally, see
/// `telemetry::tally`).
fn counted(rejection: Rejection) -> Rejection {
    telemetry::tally::rejection(rejection.reason());
    rejection
}
