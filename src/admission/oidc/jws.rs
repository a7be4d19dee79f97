//! A provider token read once: split into its three parts, its header and its claims each
//! decoded from base64url and JSON a single time (the header to pick the key, the claims
//! after the signature holds), and the signature checked with the key parsed when the JWKS
//! was read. A purchase with a token never seen before pays for one signature check and
//! nothing decoded twice.

use std::borrow::Cow;
use std::str::FromStr;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::Algorithm;
use serde::Deserialize;
use serde_json::{Map, Value};

/// Decoded parts up to this size are read without an allocation (a usual header, claims
/// and any signature of a key up to 8192 bits fit); larger ones still are.
const ON_STACK_BYTES: usize = 1024;

/// A compact JWS, borrowed from the `Authorization` header.
pub struct Compact<'t> {
    /// `header.payload`: what the signature signs.
    signed: &'t [u8],
    payload: &'t [u8],
    signature: &'t [u8],
    pub algorithm: Algorithm,
    /// The header's `kid`, when it names one.
    pub kid: Option<String>,
}

#[derive(Deserialize)]
struct Header<'a> {
    #[serde(borrow)]
    alg: Cow<'a, str>,
    #[serde(borrow, default)]
    kid: Option<Cow<'a, str>>,
}

impl<'t> Compact<'t> {
    /// The token's parts and header; `None` when it is not three base64url parts whose
    /// first is a JSON header naming a known algorithm.
    pub fn parse(token: &'t [u8]) -> Option<Self> {
        let mut parts = token.split(|&byte| byte == b'.');
        let (header, payload, signature) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let (algorithm, kid) = decoded(header, |json| {
            let header: Header<'_> = serde_json::from_slice(json).ok()?;
            let algorithm = Algorithm::from_str(&header.alg).ok()?;
            Some((algorithm, header.kid.map(Cow::into_owned)))
        })??;
        Some(Self {
            signed: &token[..header.len() + 1 + payload.len()],
            payload,
            signature,
            algorithm,
            kid,
        })
    }

    /// True when `key` signed it; the key's own algorithm decides how it is checked.
    pub fn signed_by(&self, key: &aws_lc_rs::signature::ParsedPublicKey) -> bool {
        decoded(self.signature, |signature| {
            key.verify_sig(self.signed, signature).is_ok()
        })
        .unwrap_or(false)
    }

    /// The claims, decoded from the payload once; `None` when it is not a JSON object.
    pub fn claims(&self) -> Option<Map<String, Value>> {
        decoded(self.payload, |json| serde_json::from_slice(json).ok())?
    }
}

/// `read` on the base64url decoding of `part` (on the stack when it fits); `None` when
/// `part` is not base64url.
fn decoded<R>(part: &[u8], read: impl FnOnce(&[u8]) -> R) -> Option<R> {
    let mut on_stack = [0; ON_STACK_BYTES];
    match URL_SAFE_NO_PAD.decode_slice(part, &mut on_stack) {
        Ok(length) => Some(read(&on_stack[..length])),
        Err(base64::DecodeSliceError::OutputSliceTooSmall) => {
            URL_SAFE_NO_PAD.decode(part).ok().map(|bytes| read(&bytes))
        }
        Err(base64::DecodeSliceError::DecodeError(_)) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn token(header: &Value, claims: &Value) -> String {
        format!(
            "{}.{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string()),
            URL_SAFE_NO_PAD.encode(b"signature")
        )
    }

    #[test]
    fn the_header_and_the_claims_are_read() {
        let header = json!({"alg": "RS256", "kid": "k1", "typ": "at+jwt"});
        let claims = json!({"iss": "https://id", "aud": ["a"], "exp": 20, "sub": "alice"});
        let text = token(&header, &claims);
        let compact = Compact::parse(text.as_bytes()).unwrap();
        assert_eq!(compact.algorithm, Algorithm::RS256);
        assert_eq!(compact.kid.as_deref(), Some("k1"));
        assert_eq!(Value::Object(compact.claims().unwrap()), claims);
    }

    /// Signs with the bench keys and verifies with the key read from the public JWK, as
    /// a provider's JWKS gives it: RS256, PS256, ES256 and EdDSA.
    #[test]
    fn a_signature_holds_with_its_own_key_only_and_not_once_tampered_with() {
        use jsonwebtoken::EncodingKey;
        use jsonwebtoken::jwk::Jwk;
        let rsa = include_bytes!("../../../benches/keys/rs256.pem");
        let keys = [
            (Algorithm::RS256, EncodingKey::from_rsa_pem(rsa).unwrap()),
            (Algorithm::PS256, EncodingKey::from_rsa_pem(rsa).unwrap()),
            (
                Algorithm::ES256,
                EncodingKey::from_ec_pem(include_bytes!("../../../benches/keys/es256.pem"))
                    .unwrap(),
            ),
            (
                Algorithm::EdDSA,
                EncodingKey::from_ed_pem(include_bytes!("../../../benches/keys/eddsa.pem"))
                    .unwrap(),
            ),
        ];
        let held = |algorithm, key: &EncodingKey| {
            let mut jwk =
                serde_json::to_value(Jwk::from_encoding_key(key, algorithm).unwrap()).unwrap();
            jwk["kid"] = json!(format!("{algorithm:?}"));
            let document = json!({"keys": [jwk]}).to_string();
            let set = super::super::keys::KeySet::parse(document.as_bytes()).unwrap();
            set.get(&format!("{algorithm:?}"))
                .unwrap()
                .verifying
                .clone()
        };
        let claims = json!({"sub": "alice", "aud": "flashgate", "exp": 20});
        // Each algorithm's token against a key of another type.
        let wrong = [2, 2, 3, 0];
        for (index, (algorithm, key)) in keys.iter().enumerate() {
            let mut header = jsonwebtoken::Header::new(*algorithm);
            header.kid = Some("k".into());
            let token = jsonwebtoken::encode(&header, &claims, key).unwrap();
            let jws = Compact::parse(token.as_bytes()).unwrap();
            assert_eq!(jws.algorithm, *algorithm);
            assert!(jws.signed_by(&held(*algorithm, key)), "{algorithm:?}");
            let (other_algorithm, other) = &keys[wrong[index]];
            assert!(
                !jws.signed_by(&held(*other_algorithm, other)),
                "{algorithm:?}"
            );
            let (signed, _) = token.rsplit_once('.').unwrap();
            let forged = format!("{signed}.{}", URL_SAFE_NO_PAD.encode([7u8; 64]));
            assert!(
                !Compact::parse(forged.as_bytes())
                    .unwrap()
                    .signed_by(&held(*algorithm, key))
            );
            let edited = token.replacen("eyJ", "eyK", 2);
            let edited = Compact::parse(edited.as_bytes());
            assert!(edited.is_none_or(|jws| !jws.signed_by(&held(*algorithm, key))));
        }
    }

    #[test]
    fn anything_but_a_compact_jws_with_a_known_algorithm_is_not_read() {
        let claims = json!({"sub": "alice"});
        for header in [json!({"alg": "none"}), json!({"alg": "XS999"}), json!({})] {
            assert!(Compact::parse(token(&header, &claims).as_bytes()).is_none());
        }
        let good = token(&json!({"alg": "ES256"}), &claims);
        assert!(Compact::parse(good.as_bytes()).is_some());
        for bad in [format!("{good}.x"), "a.b".into(), "%%.b.c".into()] {
            assert!(Compact::parse(bad.as_bytes()).is_none(), "{bad}");
        }
        let not_an_object = token(&json!({"alg": "ES256"}), &json!([1]));
        let compact = Compact::parse(not_an_object.as_bytes()).unwrap();
        assert!(compact.claims().is_none());
    }
}
