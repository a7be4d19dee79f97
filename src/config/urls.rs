//! Connection URLs: shown without their password, and checked at load so a URL that can
//! never work (empty, or another database's scheme) stops the process at once, naming
//! the setting, instead of surfacing later as a resolver or pool-timeout error.

use super::{ConfigError, DatabaseSettings, Sources};

/// The schemes PostgreSQL's own clients accept.
const POSTGRES_SCHEMES: [&str; 2] = ["postgres", "postgresql"];

/// An example for messages that ask for a URL.
const EXAMPLE_URL: &str = "postgres://user@127.0.0.1:5432/flashgate";

/// The URL with its password (in the user info or a `password` query parameter) replaced:
/// user, hosts, ports and database stay, so a message still says where it went.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let before_query = rest.split('?').next().unwrap_or(rest);
    let (userinfo, remainder) = match before_query.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let user = match userinfo {
        Some(info) => match info.split_once(':') {
            Some((user, _)) => format!("{user}:<redacted>@"),
            None => format!("{info}@"),
        },
        None => String::new(),
    };
    let remainder = match remainder.split_once('?') {
        Some((path, query)) => format!("{path}?{}", redact_query(query)),
        None => remainder.to_owned(),
    };
    format!("{scheme}://{user}{remainder}")
}

fn redact_query(query: &str) -> String {
    query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if key.to_ascii_lowercase().contains("password") => {
                format!("{key}=<redacted>")
            }
            _ => pair.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("&")
}

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
    fn redacts_passwords_and_keeps_where() {
        assert_eq!(
            redact_url("postgres://u:secret@h:5432/db"),
            "postgres://u:<redacted>@h:5432/db"
        );
        assert_eq!(
            redact_url("postgres://u:se/c@ret@h1:1,h2:2/db?sslmode=disable&password=x"),
            "postgres://u:<redacted>@h1:1,h2:2/db?sslmode=disable&password=<redacted>"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(
            redact_url("redis://:pw@h:6379"),
            "redis://:<redacted>@h:6379"
        );
        assert_eq!(redact_url("redis://127.0.0.1"), "redis://127.0.0.1");
    }

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
