//! Load goes to loopback only: every command refuses a target that is not this machine.

use std::net::IpAddr;

/// `Ok` when `base_url` names this machine (`localhost` or a loopback address).
pub fn ensure_loopback(base_url: &str) -> Result<(), String> {
    let url = reqwest::Url::parse(base_url).map_err(|e| e.to_string())?;
    let host = url.host_str().unwrap_or_default().trim_matches(['[', ']']);
    let loopback = host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if loopback {
        Ok(())
    } else {
        Err(format!("{base_url} is not a loopback address"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_targets() {
        assert!(ensure_loopback("http://127.0.0.1:8080").is_ok());
        assert!(ensure_loopback("http://[::1]:8080").is_ok());
        assert!(ensure_loopback("http://localhost:1").is_ok());
        assert!(ensure_loopback("http://10.0.0.1:8080").is_err());
        assert!(ensure_loopback("http://example.com").is_err());
    }
}
