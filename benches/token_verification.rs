//! CPU per token verification by algorithm, with the crypto backend flashgate is built
//! with (`jsonwebtoken`'s `aws_lc_rs` feature): what a provider's RS256, ES256 or EdDSA
//! token costs a purchase compared with an HS256 one. Signature and claims, as
//! `admission::oidc` decodes them.
//!
//! Then the signature alone by backend (`backends`), which picked the one
//! `admission::oidc` verifies with.
//!
//! Run with `cargo bench --bench token_verification`.

use std::collections::HashMap;
use std::hint::black_box;

use aws_lc_rs::signature as aws;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use criterion::{Criterion, criterion_group, criterion_main};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde_json::{Value, json};

fn claims() -> Value {
    json!({
        "sub": "buyer-12345", "iss": "https://id.example.com", "aud": "flashgate",
        "iat": 1_900_000_000, "exp": 1_900_000_600, "scope": "orders",
        "client_id": "shop", "jti": "0123456789abcdef",
    })
}

fn validation(algorithm: Algorithm) -> Validation {
    let mut validation = Validation::new(algorithm);
    validation.validate_exp = false;
    validation.set_audience(&["flashgate"]);
    validation.set_issuer(&["https://id.example.com"]);
    validation
}

fn keys(algorithm: Algorithm) -> (EncodingKey, DecodingKey) {
    let file = |name: &str| {
        std::fs::read(format!(
            "{}/benches/keys/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
    };
    match algorithm {
        Algorithm::HS256 => (
            EncodingKey::from_secret(b"bench-secret-bench-secret-bench!").unwrap(),
            DecodingKey::from_secret(b"bench-secret-bench-secret-bench!").unwrap(),
        ),
        Algorithm::RS256 | Algorithm::PS256 => (
            EncodingKey::from_rsa_pem(&file("rs256.pem")).unwrap(),
            DecodingKey::from_rsa_pem(&file("rs256.pub.pem")).unwrap(),
        ),
        Algorithm::ES256 => (
            EncodingKey::from_ec_pem(&file("es256.pem")).unwrap(),
            DecodingKey::from_ec_pem(&file("es256.pub.pem")).unwrap(),
        ),
        Algorithm::EdDSA => (
            EncodingKey::from_ed_pem(&file("eddsa.pem")).unwrap(),
            DecodingKey::from_ed_pem(&file("eddsa.pub.pem")).unwrap(),
        ),
        other => panic!("{other:?} is not benchmarked"),
    }
}

fn verification(c: &mut Criterion) {
    for algorithm in [
        Algorithm::HS256,
        Algorithm::RS256,
        Algorithm::PS256,
        Algorithm::ES256,
        Algorithm::EdDSA,
    ] {
        let (signing, verifying) = keys(algorithm);
        let mut header = Header::new(algorithm);
        header.kid = Some("bench".into());
        let token = jsonwebtoken::encode(&header, &claims(), &signing).unwrap();
        let validation = validation(algorithm);
        c.bench_function(&format!("verify/{algorithm:?}"), |b| {
            b.iter(|| {
                jsonwebtoken::decode::<HashMap<String, Value>>(
                    black_box(&token),
                    &verifying,
                    &validation,
                )
                .unwrap()
            })
        });
    }
}

/// The signature alone, by backend: jsonwebtoken's (aws-lc, the key built from its numbers
/// for every check), aws-lc with the key parsed once (what `admission::oidc` holds), ring,
/// and for Ed25519 ed25519-dalek. The message is a token's signing input.
fn backends(c: &mut Criterion) {
    for algorithm in [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA] {
        let (signing, verifying) = keys(algorithm);
        let mut header = Header::new(algorithm);
        header.kid = Some("bench".into());
        let token = jsonwebtoken::encode(&header, &claims(), &signing).unwrap();
        let (message, signature) = token.rsplit_once('.').unwrap();
        let (message, signature) = (
            message.as_bytes(),
            URL_SAFE_NO_PAD.decode(signature).unwrap(),
        );
        let public = public_key(algorithm);
        let mut group = c.benchmark_group(format!("signature/{algorithm:?}"));
        group.bench_function("jsonwebtoken", |b| {
            b.iter(|| {
                let encoded = URL_SAFE_NO_PAD.encode(&signature);
                jsonwebtoken::crypto::verify(&encoded, message, &verifying, algorithm).unwrap()
            })
        });
        let (aws, ring_algorithm): (
            &'static dyn aws::VerificationAlgorithm,
            &'static dyn ring::signature::VerificationAlgorithm,
        ) = match algorithm {
            Algorithm::RS256 => (
                &aws::RSA_PKCS1_2048_8192_SHA256,
                &ring::signature::RSA_PKCS1_2048_8192_SHA256,
            ),
            Algorithm::ES256 => (
                &aws::ECDSA_P256_SHA256_FIXED,
                &ring::signature::ECDSA_P256_SHA256_FIXED,
            ),
            _ => (&aws::ED25519, &ring::signature::ED25519),
        };
        let parsed = aws::ParsedPublicKey::new(aws, &public).unwrap();
        group.bench_function("aws-lc parsed key", |b| {
            b.iter(|| parsed.verify_sig(black_box(message), &signature).unwrap())
        });
        let unparsed = ring::signature::UnparsedPublicKey::new(ring_algorithm, &public);
        group.bench_function("ring", |b| {
            b.iter(|| unparsed.verify(black_box(message), &signature).unwrap())
        });
        if algorithm == Algorithm::EdDSA {
            let key =
                ed25519_dalek::VerifyingKey::from_bytes(&public[..].try_into().unwrap()).unwrap();
            let dalek = ed25519_dalek::Signature::from_slice(&signature).unwrap();
            group.bench_function("ed25519-dalek", |b| {
                b.iter(|| key.verify_strict(black_box(message), &dalek).unwrap())
            });
        }
        group.finish();
    }
}

/// The public key as ring and aws-lc read it: RSAPublicKey DER, an uncompressed P-256
/// point, or Ed25519's 32 bytes.
fn public_key(algorithm: Algorithm) -> Vec<u8> {
    use aws_lc_rs::signature::KeyPair;
    let file = |name: &str| {
        let pem = std::fs::read_to_string(format!(
            "{}/benches/keys/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        base64::engine::general_purpose::STANDARD
            .decode(body)
            .unwrap()
    };
    match algorithm {
        Algorithm::RS256 => aws::RsaKeyPair::from_pkcs8(&file("rs256.pem"))
            .unwrap()
            .public_key()
            .as_ref()
            .to_vec(),
        Algorithm::ES256 => {
            aws::EcdsaKeyPair::from_pkcs8(&aws::ECDSA_P256_SHA256_FIXED_SIGNING, &file("es256.pem"))
                .unwrap()
                .public_key()
                .as_ref()
                .to_vec()
        }
        _ => aws::Ed25519KeyPair::from_pkcs8(&file("eddsa.pem"))
            .unwrap()
            .public_key()
            .as_ref()
            .to_vec(),
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = verification, backends
}
criterion_main!(benches);
