//! What every module's settings share: the check their validations are written with, and
//! connection URLs shown without their password. Each module declares its own section in a
//! `settings.rs` beside its code; `config` assembles the sections into one tree.

/// The cores this process may run on: its CPU affinity and its cgroup's CPU quota, as the
/// standard library reads them, so settings left to 0 fit a container as well as a whole
/// machine; 1 when neither can be read.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// `Ok` when `ok`, else `message`: the message names the setting by its key and says
/// what it must be, and `config` turns it into the start-up error.
pub fn require(ok: bool, message: &str) -> Result<(), String> {
    if ok { Ok(()) } else { Err(message.to_owned()) }
}

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
}
