//! Verified provider tokens, remembered until their `exp` so that a buyer's repeated
//! requests pay for one signature check. An entry is found by the SHA-256 of the whole
//! token, so a token differing in any byte (a forged signature on a known payload) never
//! meets a cached verdict. Bounded: at most `entries_max` entries of at most a digest, a
//! user id of `auth.user_id_bytes_max` and a flag each.

use std::collections::HashMap;
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use crate::domain::{ClaimSet, UserId};

/// Who a verified token names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub user: UserId,
    /// The token carries the operators' role (`auth.oidc.admin_claim`).
    pub admin: bool,
    /// Every claim of the token.
    pub claims: ClaimSet,
}

/// The digest a token is remembered under.
pub type TokenDigest = [u8; 32];

pub fn digest(token: &[u8]) -> TokenDigest {
    Sha256::digest(token).into()
}

struct Entry {
    identity: Identity,
    /// The token's `exp`, Unix seconds.
    expires_at: i64,
}

/// Shards so that concurrent buyers rarely wait on one another's lookups.
const SHARDS: usize = 16;

pub struct TokenCache {
    shards: Vec<Mutex<HashMap<TokenDigest, Entry>>>,
    shard_entries_max: usize,
}

impl TokenCache {
    pub fn new(entries_max: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            shard_entries_max: entries_max.div_ceil(SHARDS).max(1),
        }
    }

    fn shard(&self, digest: &TokenDigest) -> &Mutex<HashMap<TokenDigest, Entry>> {
        &self.shards[usize::from(digest[0]) % SHARDS]
    }

    /// The identity of a token verified before and not expired at `now` (Unix seconds).
    pub fn get(&self, digest: &TokenDigest, now: i64) -> Option<Identity> {
        let shard = self.shard(digest).lock().unwrap_or_else(|e| e.into_inner());
        shard
            .get(digest)
            .filter(|entry| entry.expires_at > now)
            .map(|entry| entry.identity.clone())
    }

    /// Remembers a verified token. At a full shard the expired entries go, and when none
    /// had expired the whole shard does: memory stays bounded whatever the flood.
    pub fn insert(&self, digest: TokenDigest, identity: Identity, expires_at: i64, now: i64) {
        let mut shard = self
            .shard(&digest)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if shard.len() >= self.shard_entries_max {
            shard.retain(|_, entry| entry.expires_at > now);
            if shard.len() >= self.shard_entries_max {
                shard.clear();
            }
        }
        shard.insert(
            digest,
            Entry {
                identity,
                expires_at,
            },
        );
    }

    /// Forgets every verdict: after the provider removed a key, tokens it signed must be
    /// checked again (and refused).
    pub fn clear(&self) {
        for shard in &self.shards {
            shard.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| shard.lock().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> Identity {
        Identity {
            user: UserId::parse("alice", 64).unwrap(),
            admin: false,
            claims: ClaimSet::default(),
        }
    }

    #[test]
    fn remembers_until_exp_and_stays_bounded() {
        let cache = TokenCache::new(64);
        let token = digest(b"a.b.c");
        cache.insert(token, alice(), 100, 0);
        assert_eq!(cache.get(&token, 99), Some(alice()));
        assert_eq!(cache.get(&token, 100), None);
        assert_eq!(cache.get(&digest(b"a.b.d"), 0), None);
        for i in 0..10_000u32 {
            cache.insert(digest(&i.to_be_bytes()), alice(), 1_000, 0);
        }
        assert!(cache.len() <= 64, "{}", cache.len());
        cache.clear();
        assert_eq!(cache.len(), 0);
    }
}
