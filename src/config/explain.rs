//! `flashgate config`: every setting's effective value and the layer it came from, so an
//! operator sees what the gateway would run with, and why, without starting it. Secrets are
//! never shown, and URLs keep where they point but not their password.

use std::collections::BTreeMap;
use std::path::PathBuf;

use figment::Figment;
use figment::providers::{Format, Toml};
use figment::value::Value;

use super::DEFAULT_TOML;
use crate::settings::redact_url;

/// Where a setting's effective value came from, later layers winning.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The compiled-in `config/default.toml`.
    Default,
    /// The `--config` file, as its path was given.
    File(PathBuf),
    /// The environment variable, as it was spelled.
    Env(String),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Default => f.write_str("default"),
            Self::File(path) => write!(f, "file {}", path.display()),
            Self::Env(var) => write!(f, "environment {var}"),
        }
    }
}

/// One setting as `flashgate config` prints it.
#[derive(Clone, Debug)]
pub struct Effective {
    pub key: String,
    /// The value as TOML, redacted where it is or may hold a secret.
    pub shown: String,
    pub origin: Origin,
}

impl std::fmt::Display for Effective {
    /// `key = value  # origin`: each line is TOML, so the output can seed a `--config` file.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} = {}  # {}", self.key, self.shown, self.origin)
    }
}

/// Every setting's key with its compiled-in default, in key order.
pub fn defaults() -> BTreeMap<String, Value> {
    let figment = Figment::from(Toml::string(DEFAULT_TOML));
    let root: Value = figment.extract().expect("config/default.toml is valid");
    let mut flat = BTreeMap::new();
    flatten("", &root, &mut flat);
    flat
}

/// The leaves of `value` under their dotted keys; a list is one leaf.
pub(super) fn flatten(prefix: &str, value: &Value, flat: &mut BTreeMap<String, Value>) {
    match value {
        Value::Dict(_, dict) => {
            for (name, inner) in dict {
                let key = if prefix.is_empty() {
                    name.clone()
                } else {
                    format!("{prefix}.{name}")
                };
                flatten(&key, inner, flat);
            }
        }
        leaf => {
            flat.insert(prefix.to_owned(), leaf.clone());
        }
    }
}

/// `value` as a TOML value (a JSON scalar or list of them is also one).
pub fn render(value: &Value) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| "?".to_owned())
}

/// Whether `key` holds a secret: its last part names a secret, token or key, and is not
/// a switch or a limit about one (`admin_token_enabled`, `token_bytes_max`).
pub fn is_secret(key: &str) -> bool {
    let name = key.rsplit('.').next().unwrap_or(key);
    let about_one = name.ends_with("_enabled") || name.ends_with("_max");
    !about_one
        && ["secret", "token", "api_key", "signing_keys"]
            .iter()
            .any(|word| name.contains(word))
}

/// `value` as it may be shown: secrets replaced (a list of them keeps its length, so an
/// empty one still shows as empty), URLs without their password.
pub(super) fn shown(key: &str, value: &Value) -> String {
    let redacted = || Value::from("<redacted>".to_owned());
    match value {
        Value::Array(_, items) if is_secret(key) => {
            render(&Value::from(vec![redacted(); items.len()]))
        }
        _ if is_secret(key) => render(&redacted()),
        Value::String(_, text) if key.ends_with("url") => render(&Value::from(redact_url(text))),
        other => render(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_secret_and_url_is_hidden() {
        let defaults = defaults();
        let secrets: Vec<&str> = defaults
            .keys()
            .map(String::as_str)
            .filter(|key| is_secret(key))
            .collect();
        assert_eq!(
            secrets,
            [
                "auth.admin_token",
                "auth.jwt_secret",
                "payments.api_key",
                "payments.webhook_secret",
                "waiting_room.pass_secret",
                "waiting_room.pass_signing_keys",
            ]
        );
        let url = Value::from("postgres://u:pw@h/db".to_owned());
        assert_eq!(
            shown("database.url", &url),
            "\"postgres://u:<redacted>@h/db\""
        );
        assert_eq!(shown("auth.jwt_secret", &url), "\"<redacted>\"");
        let keys = Value::from(vec![url.clone(), url]);
        assert_eq!(
            shown("waiting_room.pass_signing_keys", &keys),
            r#"["<redacted>","<redacted>"]"#
        );
        assert_eq!(
            shown(
                "waiting_room.pass_signing_keys",
                &Value::from(Vec::<Value>::new())
            ),
            "[]"
        );
    }

    #[test]
    fn values_render_as_toml() {
        let defaults = defaults();
        assert_eq!(render(&defaults["server.listen"]), "\"127.0.0.1:8080\"");
        assert_eq!(render(&defaults["server.trusted_proxies"]), "[]");
        assert_eq!(render(&defaults["database.migrate_on_start"]), "true");
        assert_eq!(render(&defaults["waiting_room.stock_multiple"]), "1.0");
    }
}
