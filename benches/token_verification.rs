//! CPU per token verification by algorithm, with the crypto backend flashgate is built
//! with (`jsonwebtoken`'s `aws_lc_rs` feature): what a provider's RS256, ES256 or EdDSA
//! token costs a purchase compared with an HS256 one. Signature and claims, as
//! `admission::oidc` decodes them.
//!
//! Run with `cargo bench --bench token_verification`.

use std::collections::HashMap;
use std::hint::black_box;

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

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = verification
}
criterion_main!(benches);
