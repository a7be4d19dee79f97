//! An OpenID Connect provider of the tests' own: `tests/oidc/provider.mjs`, the npm package
//! oidc-provider (OpenID Certified) run by Node.js as a child process on a loopback port,
//! issuing JWT access tokens for the audience `flashgate` through the client_credentials
//! grant (`sub` is the client id: `buyer-N`, `operator` with the operators' role, `clerk`
//! without). Restarting it on the same port with another key is a key rotation.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

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
    http: reqwest::Client,
}

fn script_dir() -> PathBuf {
    crate_root().join("tests/oidc")
}

fn node(dir: &Path, key: &str, port: u16, generate_only: bool) -> Command {
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
        .arg(dir.join(format!("{key}.json")));
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
        let dir = std::env::temp_dir().join(format!("fg-oidc-{}", super::unique_suffix()));
        std::fs::create_dir_all(&dir).expect("key directory");
        let mut provider = OidcProvider {
            child: None,
            port: free_port(),
            dir,
            key: key.to_owned(),
            http: reqwest::Client::new(),
        };
        provider.run().await;
        provider
    }

    async fn run(&mut self) {
        let child = node(&self.dir, &self.key, self.port, false)
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

    /// Writes a key the provider never publishes (an attacker's), named `key`.
    pub fn generate_key(&self, key: &str) {
        let status = node(&self.dir, key, 0, true).status().expect("run node");
        assert!(status.success(), "node could not generate a key");
    }

    /// The private key `key` as PEM, and its `kid`.
    pub fn private_key(&self, key: &str) -> (Vec<u8>, String) {
        let path = self.dir.join(format!("{key}.json"));
        let jwk: Value = serde_json::from_slice(&std::fs::read(&path).expect("key file")).unwrap();
        let pem = std::fs::read(self.dir.join(format!("{key}.json.pem"))).expect("PEM");
        (pem, jwk["kid"].as_str().unwrap().to_owned())
    }

    /// The public key `key` as PEM.
    pub fn public_pem(&self, key: &str) -> Vec<u8> {
        std::fs::read(self.dir.join(format!("{key}.json.pub.pem"))).expect("public PEM")
    }

    /// An access token for `client` (client_credentials, resource `urn:flashgate`).
    pub async fn token(&self, client: &str) -> String {
        let response = self
            .http
            .post(format!("{}/token", self.issuer()))
            .basic_auth(client, Some("secret"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body("grant_type=client_credentials&resource=urn%3Aflashgate")
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
