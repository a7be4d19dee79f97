//! Connection URLs, checked at load so a URL that can
//! never work (empty, or another database's scheme) stops the process at once, naming
//! the setting, instead of surfacing later as a resolver or pool-timeout error.

use super::{ConfigError, Sources};
use crate::settings::redact_url;
use crate::store::DatabaseSettings;

/// The schemes PostgreSQL's own clients accept.
const POSTGRES_SCHEMES: [&str; 2] = ["postgres", "postgresql"];

/// An example for messages that ask for a URL.
const EXAMPLE_URL: &str = "postgres://user@127.0.0.1:5432/flashgate";

/// `database.url` and, when set, `database.direct_url` must be PostgreSQL URLs.
pub(super) fn check_database(
    settings: &DatabaseSettings,
    sources: &Sources,
) -> Result<(), ConfigError> {
    check_postgres_url(&settings.url, &sources.name("database.url"))?;
    if !settings.direct_url.is_empty() {
        check_postgres_url(&settings.direct_url, &sources.name("database.direct_url"))?;
    }
    Ok(())
}

fn check_postgres_url(url: &str, setting: &str) -> Result<(), ConfigError> {
    if url.trim().is_empty() {
        return Err(ConfigError::Invalid(format!(
            "{setting} is empty: set it to a PostgreSQL URL, e.g. {EXAMPLE_URL}"
        )));
    }
    let scheme = url.split_once("://").map(|(scheme, _)| scheme);
    match scheme {
        Some(scheme) if POSTGRES_SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()) => Ok(()),
        _ => Err(ConfigError::Invalid(format!(
            "{setting} = {} is not a PostgreSQL URL: it must start with postgres:// or \
             postgresql://, e.g. {EXAMPLE_URL}",
            redact_url(url)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_postgres_urls_pass() {
        assert!(check_postgres_url("postgres://h/db", "s").is_ok());
        assert!(check_postgres_url("POSTGRESQL://h/db", "s").is_ok());
        let empty = check_postgres_url("", "DATABASE_URL")
            .unwrap_err()
            .to_string();
        assert!(empty.contains("DATABASE_URL is empty"), "{empty}");
        let mysql = check_postgres_url("mysql://u:pw@x/db", "DATABASE_URL")
            .unwrap_err()
            .to_string();
        assert!(mysql.contains("mysql://u:<redacted>@x/db"), "{mysql}");
        assert!(!mysql.contains("pw"), "{mysql}");
    }
}
