//! Where each setting came from, so a configuration error names what the operator typed
//! (`FLASHGATE_LISTEN`, `database.url in prod.toml`) rather than an internal key, and says
//! what is wrong in plain words: never a Rust type name, never a secret.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};

use figment::Figment;
use figment::error::{Actual, Kind};

use super::ConfigError;
use super::env::{self, EnvSetting};
use super::explain::Origin;

/// The layers a value may come from, later ones winning, as `Settings::load` merges them.
/// Names only, never values: it is kept with the settings, whose `Debug` must show no secret.
#[derive(Clone, Debug, Default)]
pub struct Sources {
    config_file: Option<PathBuf>,
    /// The keys the `--config` file sets.
    file_keys: BTreeSet<String>,
    /// The variable that set each key given in the environment.
    env_vars: BTreeMap<String, String>,
}

impl Sources {
    pub(super) fn new(config_file: Option<&Path>, env: &[EnvSetting]) -> Self {
        Self {
            config_file: config_file.map(Path::to_path_buf),
            file_keys: BTreeSet::new(),
            env_vars: env
                .iter()
                .map(|setting| (setting.key.clone(), setting.var.clone()))
                .collect(),
        }
    }

    /// Records which of `keys` the `--config` file set, from the figment holding only it.
    pub(super) fn note_file_keys(&mut self, file: &Figment, keys: impl Iterator<Item = String>) {
        self.file_keys = keys.filter(|key| file.contains(key)).collect();
    }

    /// The layer `key`'s effective value came from.
    pub fn origin(&self, key: &str) -> Origin {
        if let Some(var) = self.env_vars.get(key) {
            return Origin::Env(var.clone());
        }
        match &self.config_file {
            Some(path) if self.file_keys.contains(key) => Origin::File(path.clone()),
            _ => Origin::Default,
        }
    }

    /// How the operator set `key`: the environment variable, else the key in the
    /// `--config` file, else the key alone (a compiled-in default).
    pub fn name(&self, key: &str) -> String {
        match self.origin(key) {
            Origin::Env(var) => var,
            Origin::File(path) => format!("{key} in {}", path.display()),
            Origin::Default => match &self.config_file {
                Some(path) => format!("{key} in {}", path.display()),
                None => key.to_owned(),
            },
        }
    }

    /// How to set `key`: its variables, or the key in the `--config` file.
    pub fn how_to_set(&self, key: &str) -> String {
        format!("set {}, or {key} in the --config file", env::names(key))
    }

    /// Replaces `key`'s `host:port` with the socket address it resolves to, so a host name
    /// such as `localhost` may be given; an IPv4 address is preferred when the name has both.
    pub(super) fn resolve_listen(
        &self,
        figment: Figment,
        key: &str,
    ) -> Result<Figment, ConfigError> {
        let raw: String = figment
            .extract_inner(key)
            .map_err(|error| self.describe(error))?;
        let addr = resolve(&raw).map_err(|cause| {
            ConfigError::Invalid(format!(
                "{} = \"{raw}\" is not an address to listen on: {cause}; \
                 expected host:port, e.g. 127.0.0.1:8080, [::1]:8080 or localhost:8080",
                self.name(key)
            ))
        })?;
        Ok(figment.merge((key, addr.to_string())))
    }

    /// The source of an error about no one key (a file that is not TOML): the `--config`
    /// path as the operator gave it. figment's own rendering shortens a path relative to
    /// the working directory, turning `/etc/flashgate.toml` into `../../etc/flashgate.toml`.
    fn whole_source(&self, metadata: Option<&figment::Metadata>) -> String {
        let source = metadata.and_then(|m| m.source.as_ref());
        match (source, &self.config_file) {
            (Some(figment::Source::File(_)), Some(path)) => format!("--config {}", path.display()),
            (Some(source), _) => source.to_string(),
            (None, _) => "configuration".to_owned(),
        }
    }

    /// Every error figment found, one per line, each naming its setting.
    pub(super) fn describe(&self, error: figment::Error) -> ConfigError {
        let lines: Vec<String> = error
            .into_iter()
            .map(|error| {
                let key = error.path.join(".");
                let place = if key.is_empty() {
                    self.whole_source(error.metadata.as_ref())
                } else {
                    self.name(&key)
                };
                format!("{place}: {}", kind_text(&error.kind))
            })
            .collect();
        ConfigError::Invalid(lines.join("\n"))
    }
}

/// `host:port` to one socket address.
fn resolve(raw: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = raw.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let Some((host, port)) = raw.rsplit_once(':') else {
        return Err("no port".into());
    };
    if host.is_empty() {
        return Err("no host".into());
    }
    let port: u16 = port
        .parse()
        .map_err(|_| format!("port \"{port}\" is not a number from 0 to 65535"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|error| format!("host \"{host}\" does not resolve ({error})"))?
        .collect();
    addrs
        .iter()
        .find(|addr| addr.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("host \"{host}\" has no address"))
}

/// An error kind in words; serde's expectations name Rust types (`u64`), replaced here.
fn kind_text(kind: &Kind) -> String {
    match kind {
        Kind::InvalidType(actual, expected) | Kind::InvalidValue(actual, expected) => {
            format!(
                "found {}, expected {}",
                actual_text(actual),
                expected_text(expected)
            )
        }
        Kind::UnknownField(field, _) => format!("unknown setting `{field}`"),
        Kind::MissingField(field) => format!("missing setting `{field}`"),
        Kind::UnknownVariant(value, allowed) => {
            format!(
                "unknown value `{value}`, expected one of {}",
                allowed.join(", ")
            )
        }
        Kind::InvalidLength(length, expected) => {
            format!("{length} items, expected {}", expected_text(expected))
        }
        Kind::ISizeOutOfRange(_) | Kind::USizeOutOfRange(_) => "number out of range".into(),
        Kind::Unsupported(actual) | Kind::UnsupportedKey(actual, _) => {
            format!("{} is not supported here", actual_text(actual))
        }
        other => other.to_string(),
    }
}

/// The value found, without the secret it might be: strings are not repeated.
fn actual_text(actual: &Actual) -> String {
    match actual {
        Actual::Str(_) | Actual::Char(_) => "text".into(),
        other => other.to_string(),
    }
}

fn expected_text(expected: &str) -> String {
    let words = match expected {
        "u8" | "u16" | "u32" | "u64" | "u128" | "usize" => "a whole number, 0 or more",
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => "a whole number",
        "f32" | "f64" => "a number",
        "a string" | "a borrowed string" | "a character" => "text",
        other => return other.replace("a sequence", "a list"),
    };
    words.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_addresses_and_host_names() {
        assert_eq!(
            resolve("127.0.0.1:80").unwrap(),
            "127.0.0.1:80".parse().unwrap()
        );
        assert_eq!(resolve("[::1]:80").unwrap(), "[::1]:80".parse().unwrap());
        assert!(resolve("localhost:18082").unwrap().ip().is_loopback());
        assert!(resolve("localhost").unwrap_err().contains("no port"));
        assert!(resolve(":80").unwrap_err().contains("no host"));
        assert!(resolve("localhost:http").unwrap_err().contains("port"));
        assert!(resolve("localhost:70000").unwrap_err().contains("65535"));
    }

    #[test]
    fn kinds_never_name_rust_types() {
        let text = kind_text(&Kind::InvalidType(Actual::Str("x".into()), "u64".into()));
        assert_eq!(text, "found text, expected a whole number, 0 or more");
    }
}
