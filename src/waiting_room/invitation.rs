//! Who may join an invitation-only line (`waiting_room.invitation`): a buyer whose token
//! claim holds one of the accepted values, or one who redeems an access code
//! (`access_codes`). Checked before the line's script runs, so a refused buyer takes no
//! place and reserves nothing. The claim is read in memory; PostgreSQL is asked only for a
//! code, or whether the buyer redeemed one before.

use serde_json::Value;
use sqlx::PgPool;

use super::access_codes::{self, Redeemed};
use crate::deals::{Deal, Invitation};
use crate::domain::ClaimSet;
use crate::store::StoreError;

/// Why a buyer may not join.
#[derive(Debug, thiserror::Error)]
pub enum InvitationError {
    /// Neither the claim nor a code: the line is by invitation.
    #[error("this line is by invitation: the token's claim or an access code is required")]
    Required,
    /// The code shown is no code of this deal.
    #[error("no such access code for this deal")]
    CodeInvalid,
    /// The code shown was redeemed by another buyer.
    #[error("this access code was redeemed by another buyer")]
    CodeUsed,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Whether the claims let the buyer in: the claim holds one of the values (a list holds
/// one of them; a number or boolean is compared as written in JSON).
pub fn claim_admits(invitation: &Invitation, claims: &ClaimSet) -> bool {
    claim_holds(invitation.claim.as_deref(), &invitation.values, claims)
}

/// Whether the token's claim `name` holds one of `values`; the rule of an invitation's and
/// of a priority group's claim.
pub fn claim_holds(name: Option<&str>, values: &[String], claims: &ClaimSet) -> bool {
    let Some(name) = name else {
        return false;
    };
    let accepted = |held: &Value| match held {
        Value::String(text) => values.contains(text),
        Value::Number(_) | Value::Bool(_) => values.contains(&held.to_string()),
        _ => false,
    };
    match claims.get(name) {
        Some(Value::Array(items)) => items.iter().any(accepted),
        Some(held) => accepted(held),
        None => false,
    }
}

/// Whether a joining user holds an access code of the deal: the code the join shows,
/// redeemed now, or one redeemed before. PostgreSQL is asked at most once per join, however
/// many of the line's rules (the invitation, the priority group) read the answer.
pub struct CodeHolding<'a> {
    pool: &'a PgPool,
    deal_id: &'a str,
    user: &'a str,
    code: Option<&'a str>,
    known: Option<bool>,
}

impl<'a> CodeHolding<'a> {
    pub fn new(pool: &'a PgPool, deal_id: &'a str, user: &'a str, code: Option<&'a str>) -> Self {
        Self {
            pool,
            deal_id,
            user,
            code,
            known: None,
        }
    }

    /// True when the user holds a code; a code shown that is no code of the deal, or
    /// another user's, is refused rather than read as none.
    pub async fn holds(&mut self) -> Result<bool, InvitationError> {
        if let Some(known) = self.known {
            return Ok(known);
        }
        let held = match self.code {
            Some(code) => {
                match access_codes::redeem(self.pool, self.deal_id, self.user, code).await? {
                    Redeemed::Held => true,
                    Redeemed::Unknown => return Err(InvitationError::CodeInvalid),
                    Redeemed::Taken => return Err(InvitationError::CodeUsed),
                }
            }
            None => access_codes::holds_one(self.pool, self.deal_id, self.user).await?,
        };
        self.known = Some(held);
        Ok(held)
    }
}

/// Lets the user into the deal's line or says why not.
pub async fn check(
    deal: &Deal,
    claims: &ClaimSet,
    codes: &mut CodeHolding<'_>,
) -> Result<(), InvitationError> {
    let Some(invitation) = &deal.waiting_room.invitation else {
        return Ok(());
    };
    if claim_admits(invitation, claims) {
        return Ok(());
    }
    if invitation.codes && codes.holds().await? {
        return Ok(());
    }
    Err(InvitationError::Required)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_admits_by_value_or_list_member() {
        let invitation = Invitation {
            claim: Some("tier".into()),
            values: vec!["gold".into(), "7".into()],
            codes: false,
        };
        let with = |value: Value| {
            let mut claims = serde_json::Map::new();
            claims.insert("tier".into(), value);
            claim_admits(&invitation, &ClaimSet::new(claims))
        };
        assert!(with("gold".into()));
        assert!(with(serde_json::json!(["silver", "gold"])));
        assert!(with(serde_json::json!(7)));
        assert!(!with("silver".into()));
        assert!(!with(serde_json::json!({"gold": true})));
        assert!(!claim_admits(&invitation, &ClaimSet::default()));
    }
}
