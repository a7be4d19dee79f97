//! The load tester as an OpenID Connect provider: RS256 tokens signed with its own key
//! (`loadtest/keys/rs256.pem`), and a tiny HTTP server publishing that key as a JWKS (and a
//! discovery document), so a gateway can verify provider tokens as it would a real
//! provider's, and anyone can reproduce the cost of doing so.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::signature::{RSA_PKCS1_SHA256, RsaKeyPair};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use jsonwebtoken::jwk::{Jwk, JwkSet, KeyAlgorithm, PublicKeyUse};
use jsonwebtoken::{Algorithm, EncodingKey};
use serde_json::json;
use tokio::net::TcpListener;

/// The signing key's id, as the JWKS publishes it and every token's header names it.
pub const KEY_ID: &str = "flashgate-loadtest-rs256";

const KEY_PEM: &[u8] = include_bytes!("../keys/rs256.pem");

/// Which kind of user token a command signs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TokenKind {
    /// HS256 with the secret shared with the gateway (`--jwt-secret`).
    #[default]
    Hs256,
    /// RS256 with the load tester's own key, as a provider signs; the gateway must be
    /// pointed at `flashgate-loadtest provider`'s JWKS.
    Rs256,
}

fn signing_key() -> Result<&'static EncodingKey, String> {
    static KEY: OnceLock<Result<EncodingKey, String>> = OnceLock::new();
    KEY.get_or_init(|| EncodingKey::from_rsa_pem(KEY_PEM).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(Clone::clone)
}

/// The signing key parsed once: `jsonwebtoken::encode` parses and checks the private key
/// for every token, which costs more than the signature and would make a flood of a
/// million distinct tokens take a quarter of an hour to sign.
fn key_pair() -> Result<&'static RsaKeyPair, String> {
    static PAIR: OnceLock<Result<RsaKeyPair, String>> = OnceLock::new();
    PAIR.get_or_init(|| {
        let body: String = std::str::from_utf8(KEY_PEM)
            .map_err(|e| e.to_string())?
            .lines()
            .filter(|line| !line.starts_with("-----"))
            .collect();
        let der = STANDARD.decode(body).map_err(|e| e.to_string())?;
        RsaKeyPair::from_pkcs8(&der).map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// A provider token for `user`, from `issuer` for `audience`, valid for `ttl_seconds`.
pub fn rs256_token(
    issuer: &str,
    audience: &str,
    user: &str,
    ttl_seconds: i64,
) -> Result<String, String> {
    let now = chrono::Utc::now().timestamp();
    let header = json!({"alg": "RS256", "typ": "at+jwt", "kid": KEY_ID});
    let claims = json!({
        "iss": issuer, "aud": audience, "sub": user,
        "iat": now, "exp": now + ttl_seconds, "scope": "orders",
    });
    let pair = key_pair()?;
    let signed = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let mut signature = vec![0; pair.public_modulus_len()];
    pair.sign(
        &RSA_PKCS1_SHA256,
        &SystemRandom::new(),
        signed.as_bytes(),
        &mut signature,
    )
    .map_err(|e| e.to_string())?;
    Ok(format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature)))
}

/// The public half of the signing key as a JWKS.
fn jwks() -> Result<JwkSet, String> {
    let mut jwk =
        Jwk::from_encoding_key(signing_key()?, Algorithm::RS256).map_err(|e| e.to_string())?;
    jwk.common.key_id = Some(KEY_ID.to_owned());
    jwk.common.public_key_use = Some(PublicKeyUse::Signature);
    jwk.common.key_algorithm = Some(KeyAlgorithm::RS256);
    Ok(JwkSet { keys: vec![jwk] })
}

/// Serves `/jwks.json` and `/.well-known/openid-configuration` (issuer `http://<listen>`)
/// on `listen`, a loopback address, until the process ends.
pub async fn serve(listen: SocketAddr) -> Result<(), String> {
    if !listen.ip().is_loopback() {
        return Err(format!("{listen} is not a loopback address"));
    }
    let issuer = format!("http://{listen}");
    let jwks = serde_json::to_vec(&jwks()?).map_err(|e| e.to_string())?;
    let discovery = serde_json::to_vec(&json!({
        "issuer": issuer,
        "jwks_uri": format!("{issuer}/jwks.json"),
        "id_token_signing_alg_values_supported": ["RS256"],
    }))
    .map_err(|e| e.to_string())?;
    let documents = Arc::new((Bytes::from(jwks), Bytes::from(discovery)));
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    eprintln!("provider: JWKS at {issuer}/jwks.json, kid {KEY_ID}");
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let documents = documents.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                let answer = answer(request.uri().path(), &documents);
                async move { Ok::<_, Infallible>(answer) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn answer(path: &str, (jwks, discovery): &(Bytes, Bytes)) -> Response<Full<Bytes>> {
    let body = match path {
        "/jwks.json" => jwks.clone(),
        "/.well-known/openid-configuration" => discovery.clone(),
        _ => {
            let mut response = Response::new(Full::new(Bytes::new()));
            *response.status_mut() = StatusCode::NOT_FOUND;
            return response;
        }
    };
    let mut response = Response::new(Full::new(body));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("max-age=3600"));
    response
}

#[cfg(test)]
mod tests {
    use jsonwebtoken::{DecodingKey, Validation, decode, decode_header};
    use serde_json::Value;

    use super::{KEY_ID, jwks, rs256_token};

    #[test]
    fn tokens_verify_with_the_published_key_only_for_their_audience() {
        let token = rs256_token("http://127.0.0.1:8097", "shop", "buyer-1", 60).unwrap();
        let header = decode_header(&token).unwrap();
        assert_eq!(header.kid.as_deref(), Some(KEY_ID));
        let set = jwks().unwrap();
        let key = DecodingKey::from_jwk(set.find(KEY_ID).unwrap()).unwrap();
        let mut validation = Validation::new(jsonwebtoken::Algorithm::RS256);
        validation.set_audience(&["shop"]);
        let claims = decode::<Value>(&token, &key, &validation).unwrap().claims;
        assert_eq!(claims["sub"], "buyer-1");
        validation.set_audience(&["another"]);
        assert!(decode::<Value>(&token, &key, &validation).is_err());
    }
}
