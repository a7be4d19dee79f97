//! The provider's keys as flashgate holds them: each key with the one algorithm it may
//! verify, taken from the key (its `alg`, or its type and curve), never from a token.
//! A key flashgate cannot use is skipped with a warning rather than failing the set.
//!
//! Each key is parsed once, when the JWKS is read, into the crypto library's own key
//! object: a signature check then starts from a ready key (for RSA, its Montgomery
//! constants computed once), not from the JWK's numbers.

use std::collections::HashMap;

use aws_lc_rs::signature::{self as crypto, ParsedPublicKey, RsaPublicKeyComponents};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::Algorithm;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyAlgorithm};
use serde::Deserialize;

/// One usable key.
pub struct Key {
    pub algorithm: Algorithm,
    pub verifying: ParsedPublicKey,
}

/// The keys held, by `kid`.
#[derive(Default)]
pub struct KeySet {
    keys: HashMap<String, Key>,
}

#[derive(Deserialize)]
struct Document {
    keys: Vec<serde_json::Value>,
}

impl KeySet {
    /// Reads a JWKS document. Fails only when the document itself is not a JWKS; keys
    /// without a `kid`, of another use, or of an algorithm flashgate does not verify are
    /// left out with a warning.
    pub fn parse(document: &[u8]) -> Result<Self, String> {
        let document: Document =
            serde_json::from_slice(document).map_err(|error| format!("not a JWKS: {error}"))?;
        let mut keys = HashMap::new();
        for raw in document.keys {
            match usable(raw) {
                Ok((kid, key)) => {
                    keys.insert(kid, key);
                }
                Err(why) => tracing::warn!(why, "a key of the provider's JWKS is skipped"),
            }
        }
        Ok(Self { keys })
    }

    pub fn get(&self, kid: &str) -> Option<&Key> {
        self.keys.get(kid)
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// True when a key of `self` is missing from `next`: tokens it verified must stop
    /// being trusted.
    pub fn loses_keys_in(&self, next: &KeySet) -> bool {
        self.keys.keys().any(|kid| !next.keys.contains_key(kid))
    }
}

fn usable(raw: serde_json::Value) -> Result<(String, Key), String> {
    let jwk: Jwk =
        serde_json::from_value(raw).map_err(|error| format!("unreadable key: {error}"))?;
    let kid = jwk.common.key_id.clone().ok_or("a key without a kid")?;
    if jwk
        .common
        .public_key_use
        .as_ref()
        .is_some_and(|usage| *usage != jsonwebtoken::jwk::PublicKeyUse::Signature)
    {
        return Err(format!("key {kid} is not a signing key"));
    }
    let algorithm =
        algorithm_of(&jwk).ok_or_else(|| format!("key {kid}: unsupported algorithm"))?;
    let verifying =
        verifying_key(&jwk.algorithm, algorithm).map_err(|why| format!("key {kid}: {why}"))?;
    Ok((
        kid,
        Key {
            algorithm,
            verifying,
        },
    ))
}

/// The key parsed for `algorithm`: RSA from its modulus and exponent (at least 2048 bits,
/// as a check asks), P-256 from its point, Ed25519 from its 32 bytes.
fn verifying_key(
    parameters: &AlgorithmParameters,
    algorithm: Algorithm,
) -> Result<ParsedPublicKey, String> {
    let bytes = |text: &str| URL_SAFE_NO_PAD.decode(text).map_err(|e| e.to_string());
    let rejected = |error: aws_lc_rs::error::KeyRejected| error.to_string();
    match (parameters, algorithm) {
        (AlgorithmParameters::RSA(rsa), Algorithm::RS256 | Algorithm::PS256) => {
            let (n, e) = (bytes(&rsa.n)?, bytes(&rsa.e)?);
            let parameters = match algorithm {
                Algorithm::PS256 => &crypto::RSA_PSS_2048_8192_SHA256,
                _ => &crypto::RSA_PKCS1_2048_8192_SHA256,
            };
            RsaPublicKeyComponents { n: &n, e: &e }
                .to_parsed_public_key(parameters)
                .map_err(rejected)
        }
        (AlgorithmParameters::EllipticCurve(ec), Algorithm::ES256) => {
            let mut point = vec![0x04];
            point.extend(bytes(&ec.x)?);
            point.extend(bytes(&ec.y)?);
            ParsedPublicKey::new(&crypto::ECDSA_P256_SHA256_FIXED, point).map_err(rejected)
        }
        (AlgorithmParameters::OctetKeyPair(okp), Algorithm::EdDSA) => {
            ParsedPublicKey::new(&crypto::ED25519, bytes(&okp.x)?).map_err(rejected)
        }
        _ => Err("the key's type does not suit its algorithm".into()),
    }
}

/// RS256, PS256, ES256 and EdDSA, as the key states it or as its type implies. A key
/// whose `alg` disagrees with its type (an RSA key claiming ES256) is refused.
fn algorithm_of(jwk: &Jwk) -> Option<Algorithm> {
    let stated = match jwk.common.key_algorithm {
        None => None,
        Some(KeyAlgorithm::RS256) => Some(Algorithm::RS256),
        Some(KeyAlgorithm::PS256) => Some(Algorithm::PS256),
        Some(KeyAlgorithm::ES256) => Some(Algorithm::ES256),
        Some(KeyAlgorithm::EdDSA) => Some(Algorithm::EdDSA),
        Some(_) => return None,
    };
    match (&jwk.algorithm, stated) {
        (AlgorithmParameters::RSA(_), None) => Some(Algorithm::RS256),
        (AlgorithmParameters::RSA(_), Some(alg @ (Algorithm::RS256 | Algorithm::PS256))) => {
            Some(alg)
        }
        (AlgorithmParameters::EllipticCurve(ec), None | Some(Algorithm::ES256))
            if ec.curve == EllipticCurve::P256 =>
        {
            Some(Algorithm::ES256)
        }
        (AlgorithmParameters::OctetKeyPair(okp), None | Some(Algorithm::EdDSA))
            if okp.curve == EllipticCurve::Ed25519 =>
        {
            Some(Algorithm::EdDSA)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RSA_N: &str = "5zhsXHVaE1xDoXG7dZ9uRlCWHat53BN8CFXitl9QLKkXWU-44cbdMQdnA9ftINTRTXw2kR0VaffunZRxCA1han7Q0GwL2Bn0DEJF7yUN_xNK1mqNQb18W6kByd1ti3PhdyL2hzsBkcLTptFGmt_7pDFRbEDn8jzObnjv9a6TysYeQQyHSF5JdZIMurzkjuu6Hc0F7TGlWCWmbJbD56uxYyno2XhbMG_uxA52wxC2tihiVfFuNiw8qh-WnlI7-5evV03HM52W8ZGOTjyEvQaAYcfDFyJZcKZyI3ktxQ1XFjqUUPJUpPVNQxIuFWyTuknpJwryvakRoGvRwLCLPZhryQ";

    #[test]
    fn unusable_keys_are_skipped_and_the_algorithm_comes_from_the_key() {
        let document = serde_json::json!({"keys": [
            {"kty": "RSA", "kid": "rs", "e": "AQAB", "n": RSA_N},
            {"kty": "RSA", "kid": "ps", "alg": "PS256", "e": "AQAB", "n": RSA_N},
            {"kty": "RSA", "kid": "lying", "alg": "ES256", "e": "AQAB", "n": RSA_N},
            {"kty": "RSA", "kid": "enc", "use": "enc", "e": "AQAB", "n": RSA_N},
            {"kty": "RSA", "e": "AQAB", "n": RSA_N},
            {"kty": "oct", "kid": "secret", "k": "c2VjcmV0"},
            {"kty": "XYZ", "kid": "future"},
            {"kty": "OKP", "kid": "ed", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
        ]});
        let set = KeySet::parse(document.to_string().as_bytes()).unwrap();
        assert_eq!(set.len(), 3);
        assert_eq!(set.get("rs").unwrap().algorithm, Algorithm::RS256);
        assert_eq!(set.get("ps").unwrap().algorithm, Algorithm::PS256);
        assert_eq!(set.get("ed").unwrap().algorithm, Algorithm::EdDSA);
        for skipped in ["lying", "enc", "secret", "future"] {
            assert!(set.get(skipped).is_none(), "{skipped}");
        }
        assert!(KeySet::parse(b"{\"nokeys\": 1}").is_err());
    }
}
