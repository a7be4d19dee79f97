//! An OpenID Connect provider of the tests' own: `tests/oidc/provider.mjs`, the npm package
//! oidc-provider (OpenID Certified) run by Node.js as a child process on a loopback port,
//! issuing JWT access tokens for the audience `flashgate` through the client_credentials
//! grant (`sub` is the client id: `buyer-N`, `operator` with the operators' role, `clerk`
//! without). Restarting it on the same port with another key is a key rotation. Started
//! with more algorithms, it also signs with a PS256, ES256 or EdDSA key of its own
//! ([`OidcProvider::token_signed`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::Value;

use super::{ChildGuard, crate_root, free_port, test_log, wait_for_port};

/// Node's start and the provider's first answers are slow on a busy runner.
const STARTUP: Duration = Duration::from_secs(30);

/// The provider's process, its port (kept across restarts, so its issuer stays) and the
/// directory of its key files.
pub struct OidcProvider {
    child: Option<ChildGuard>,
    pub port: u16,
    dir: PathBuf,
    key: String,
    /// Algorithms signed with besides RS256, each with a key of its own.
    algs: Vec<&'static str>,
    http: reqwest::Client,
}

fn script_dir() -> PathBuf {
    crate_root().join("tests/oidc")
}

fn node(dir: &Path, key: &str, algs: &[&str], port: u16, generate_only: bool) -> Command {
    assert!(
        script_dir().join("node_modules/oidc-provider").is_dir(),
        "tests/oidc/node_modules is missing: run scripts/oidc.sh (scripts/test.sh does)"
    );
    let mut command = Command::new("node");
    command
        .current_dir(script_dir())
        .arg("provider.mjs")
        .args(["--port", &port.to_string()])
        .arg("--key")
        .arg(dir.join(format!("{key}.json")))
        .arg(format!("--algs={}", algs.join(",")));
    if generate_only {
        command.arg("--generate-only");
    }
    if !test_log() {
        command.stdout(Stdio::null()).stderr(Stdio::null());
    }
    command
}

impl OidcProvider {
    /// Starts a provider signing with a fresh key named `key`.
    pub async fn start(key: &str) -> OidcProvider {
        OidcProvider::start_signing(key, &[]).await
    }

    /// Starts a provider signing with a fresh RS256 key named `key` and, for each of
    /// `algs` (PS256, ES256, EdDSA), a fresh key named `key-ALG`.
    pub async fn start_signing(key: &str, algs: &[&'static str]) -> OidcProvider {
        let dir = std::env::temp_dir().join(format!("fg-oidc-{}", super::unique_suffix()));
        std::fs::create_dir_all(&dir).expect("key directory");
        let mut provider = OidcProvider {
            child: None,
            port: free_port(),
            dir,
            key: key.to_owned(),
            algs: algs.to_vec(),
            http: reqwest::Client::new(),
        };
        provider.run().await;
        provider
    }

    async fn run(&mut self) {
        let child = node(&self.dir, &self.key, &self.algs, self.port, false)
            .spawn()
            .expect("start node (scripts/oidc.sh installs it)");
        self.child = Some(ChildGuard { child });
        assert!(
            wait_for_port(self.port, STARTUP).await,
            "the OpenID provider did not listen on {}",
            self.port
        );
    }

    /// `http://127.0.0.1:PORT`: the provider's issuer.
    pub fn issuer(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The provider stops (and its port stays closed).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill();
        }
    }

    /// Restarts the provider on its port signing with a fresh key named `key`: its JWKS
    /// then publishes the new key only.
    pub async fn rotate_to(&mut self, key: &str) {
        self.stop();
        self.key = key.to_owned();
        self.run().await;
    }

    /// Writes a key the provider never publishes (an attacker's), named `key` (and one
    /// named `key-ALG` for each of the provider's other algorithms).
    pub fn generate_key(&self, key: &str) {
        let status = node(&self.dir, key, &self.algs, 0, true)
            .status()
            .expect("run node");
        assert!(status.success(), "node could not generate a key");
    }

    /// The private key `key` as PEM, and its `kid`.
    pub fn private_key(&self, key: &str) -> (Vec<u8>, String) {
        let path = self.dir.join(format!("{key}.json"));
        let jwk: Value = serde_json::from_slice(&std::fs::read(&path).expect("key file")).unwrap();
        let pem = std::fs::read(self.dir.join(format!("{key}.json.pem"))).expect("PEM");
        (pem, jwk["kid"].as_str().unwrap().to_owned())
    }

    /// The private key `key` to sign with, its `kid` and its algorithm.
    pub fn signing_key(&self, key: &str) -> (EncodingKey, String, Algorithm) {
        let (pem, kid) = self.private_key(key);
        let path = self.dir.join(format!("{key}.json"));
        let jwk: Value = serde_json::from_slice(&std::fs::read(&path).expect("key file")).unwrap();
        let (encoding, algorithm) = match jwk["alg"].as_str() {
            Some("ES256") => (EncodingKey::from_ec_pem(&pem), Algorithm::ES256),
            Some("EdDSA") => (EncodingKey::from_ed_pem(&pem), Algorithm::EdDSA),
            Some("PS256") => (EncodingKey::from_rsa_pem(&pem), Algorithm::PS256),
            _ => (EncodingKey::from_rsa_pem(&pem), Algorithm::RS256),
        };
        (encoding.expect("a PEM key"), kid, algorithm)
    }

    /// The public key `key` as PEM.
    pub fn public_pem(&self, key: &str) -> Vec<u8> {
        std::fs::read(self.dir.join(format!("{key}.json.pub.pem"))).expect("public PEM")
    }

    /// An access token for `client` (client_credentials, resource `urn:flashgate`).
    pub async fn token(&self, client: &str) -> String {
        self.token_for(client, "urn%3Aflashgate").await
    }

    /// An access token for `client` signed with `alg` (RS256 or one the provider was
    /// started with).
    pub async fn token_signed(&self, client: &str, alg: &str) -> String {
        match alg {
            "RS256" => self.token(client).await,
            _ => {
                self.token_for(client, &format!("urn%3Aflashgate%3A{alg}"))
                    .await
            }
        }
    }

    async fn token_for(&self, client: &str, resource: &str) -> String {
        let response = self
            .http
            .post(format!("{}/token", self.issuer()))
            .basic_auth(client, Some("secret"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("grant_type=client_credentials&resource={resource}"))
            .send()
            .await
            .expect("the provider answers");
        let status = response.status();
        let body: Value = response.json().await.expect("a JSON token response");
        assert!(status.is_success(), "token request refused: {body}");
        body["access_token"]
            .as_str()
            .expect("access_token")
            .to_owned()
    }

    /// How many times the JWKS was fetched from this process (since its last start).
    pub async fn jwks_fetches(&self) -> u64 {
        let body: Value = self
            .http
            .get(format!("{}/test/jwks-fetches", self.issuer()))
            .send()
            .await
            .expect("the provider answers")
            .json()
            .await
            .expect("JSON");
        body["fetches"].as_u64().expect("a count")
    }
}

impl Drop for OidcProvider {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `claims` as an access token (`typ: at+jwt`) signed with `algorithm` by `key`, naming `kid`.
pub fn signed_token(algorithm: Algorithm, kid: &str, key: &EncodingKey, claims: &Value) -> String {
    let mut header = Header::new(algorithm);
    header.kid = Some(kid.to_owned());
    header.typ = Some("at+jwt".into());
    jsonwebtoken::encode(&header, claims, key).unwrap()
}
