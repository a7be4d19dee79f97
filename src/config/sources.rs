//! Where each setting came from, so a configuration error names what the operator typed
//! (`FLASHGATE_LISTEN`, `database.url in prod.toml`) rather than an internal key, and says
//! what is wrong in plain words: never a Rust type name, never a secret.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;

use figment::Figment;
use figment::error::{Actual, Kind};

use super::{ConfigError, NAMED_ENV};

/// The prefix of the environment variables that set any key (`FLASHGATE__SERVER__LISTEN`).
pub(super) const ENV_PREFIX: &str = "FLASHGATE__";

/// The layers a value may come from, later ones winning, as `Settings::load` merges them.
pub(super) struct Sources<'a> {
    config_file: Option<&'a Path>,
}

impl<'a> Sources<'a> {
    pub(super) fn new(config_file: Option<&'a Path>) -> Self {
        Self { config_file }
    }

    /// How the operator set `key`: the environment variable that won, else the key in the
    /// `--config` file, else the key alone (a compiled-in default).
    pub(super) fn name(&self, key: &str) -> String {
        if let Some(var) = self.env_var(key) {
            return var;
        }
        match self.config_file {
            Some(path) => format!("{key} in {}", path.display()),
            None => key.to_owned(),
        }
    }

    /// The environment variable that set `key`, if one did.
    pub(super) fn env_var(&self, key: &str) -> Option<String> {
        let named = NAMED_ENV
            .iter()
            .find(|(var, named_key)| *named_key == key && std::env::var_os(var).is_some())
            .map(|(var, _)| (*var).to_owned());
        named.or_else(|| {
            let var = format!(
                "{ENV_PREFIX}{}",
                key.replace('.', "__").to_ascii_uppercase()
            );
            std::env::var_os(&var).is_some().then_some(var)
        })
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

    /// Every error figment found, one per line, each naming its setting.
    pub(super) fn describe(&self, error: figment::Error) -> ConfigError {
        let lines: Vec<String> = error
            .into_iter()
            .map(|error| {
                let key = error.path.join(".");
                let place = if key.is_empty() {
                    error
                        .metadata
                        .as_ref()
                        .and_then(|m| m.source.as_ref())
                        .map_or_else(|| "configuration".to_owned(), ToString::to_string)
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
