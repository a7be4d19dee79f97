//! Standard Webhooks signatures: `webhook-signature: v1,<base64 HMAC-SHA256 of
//! "<webhook-id>.<webhook-timestamp>.<body>">`, keyed with the bytes of a `whsec_<base64>`
//! secret. During a rotation's overlap both secrets sign, separated by a space, so a
//! receiver holding either verifies.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// The prefix of a secret as the specification writes it.
pub const SECRET_PREFIX: &str = "whsec_";

/// Bytes of a generated secret (the specification asks for 24 to 64).
const SECRET_BYTES: usize = 32;

/// A fresh random secret's key bytes.
pub fn generate() -> Vec<u8> {
    rand::random::<[u8; SECRET_BYTES]>().to_vec()
}

/// The secret as given to the shop: `whsec_` and the key in base64.
pub fn render(key: &[u8]) -> String {
    format!("{SECRET_PREFIX}{}", STANDARD.encode(key))
}

/// One `v1,<base64>` signature of the message.
fn signature(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

/// The `webhook-signature` header: the current key's signature, then each still valid
/// previous key's, space-separated.
pub fn header(keys: &[&[u8]], id: &str, timestamp: i64, body: &[u8]) -> String {
    keys.iter()
        .map(|key| signature(key, id, timestamp, body))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the specification's reference libraries: secret, id, timestamp and
    /// payload with the signature they compute.
    #[test]
    fn matches_the_specification_example() {
        let key = STANDARD.decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            header(&[&key], "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn an_overlap_signs_with_both_keys() {
        let (a, b) = (generate(), generate());
        let both = header(&[&a, &b], "evt_1", 1, b"{}");
        let parts: Vec<_> = both.split(' ').collect();
        assert_eq!(
            parts,
            [
                header(&[&a], "evt_1", 1, b"{}"),
                header(&[&b], "evt_1", 1, b"{}")
            ]
        );
        assert_eq!(render(&a).len(), SECRET_PREFIX.len() + 44);
    }
}
