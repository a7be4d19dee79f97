//! Where an endpoint may point. A webhook URL must not become a way into the operator's
//! network: unless `events.allow_private_targets` is set, loopback, private, link-local,
//! shared, unspecified, multicast and cloud-metadata addresses are refused, both when the
//! endpoint is saved (a literal address) and at every delivery (each address the name
//! resolves to then), so a name that later resolves inward (DNS rebinding) is still refused.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Why an endpoint URL is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("the URL is longer than {0} bytes")]
    TooLong(usize),
    #[error("the URL cannot be parsed: {0}")]
    Malformed(String),
    #[error("the URL's scheme must be http or https")]
    Scheme,
    #[error("the URL must name a host and carry no user or password")]
    Host,
    #[error(
        "the URL points at a loopback, private, link-local or metadata address \
         (events.allow_private_targets is off)"
    )]
    Private,
}

/// An endpoint URL that passed the checks made when it is saved.
pub fn parse(url: &str, bytes_max: usize, allow_private: bool) -> Result<Url, TargetError> {
    if url.len() > bytes_max {
        return Err(TargetError::TooLong(bytes_max));
    }
    let parsed = Url::parse(url).map_err(|e| TargetError::Malformed(e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(TargetError::Scheme);
    }
    if parsed.host().is_none() || !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(TargetError::Host);
    }
    let literal = match parsed.host() {
        Some(url::Host::Ipv4(ip)) => Some(IpAddr::V4(ip)),
        Some(url::Host::Ipv6(ip)) => Some(IpAddr::V6(ip)),
        _ => None,
    };
    let named_inward = parsed
        .host_str()
        .is_some_and(|h| h.eq_ignore_ascii_case("localhost") || h.ends_with(".localhost"));
    if !allow_private && (literal.is_some_and(inward) || named_inward) {
        return Err(TargetError::Private);
    }
    Ok(parsed)
}

/// True for an address inside the operator's network or the machine itself.
pub fn inward(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => inward_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => inward_v4(v4),
            None => inward_v6(v6),
        },
    }
}

fn inward_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || (a == 192 && b == 0 && ip.octets()[2] == 0)
        || a >= 240
}

fn inward_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (first & 0xfe00) == 0xfc00
        || (first & 0xffc0) == 0xfe80
        || (first & 0xffc0) == 0xfec0
        || ip.segments()[..6] == [0, 0, 0, 0, 0, 0]
}

/// The deliveries' resolver: the system's answers, less the inward ones unless allowed.
/// A name with only inward answers fails to resolve, and the delivery fails as refused.
#[derive(Clone, Copy, Debug)]
pub struct CheckedResolver {
    pub allow_private: bool,
}

impl Resolve for CheckedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allow_private = self.allow_private;
        Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((name.as_str(), 0))
                .await?
                .filter(|addr| allow_private || !inward(addr.ip()))
                .collect();
            if found.is_empty() {
                let refused = std::io::Error::other(TargetError::Private);
                return Err(Box::new(refused) as Box<dyn std::error::Error + Send + Sync>);
            }
            let addrs: Addrs = Box::new(found.into_iter());
            Ok(addrs)
        })
    }
}

/// The resolver for a delivery client.
pub fn resolver(allow_private: bool) -> Arc<CheckedResolver> {
    Arc::new(CheckedResolver { allow_private })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inward_addresses_are_refused_unless_allowed() {
        for url in [
            "http://127.0.0.1/x",
            "http://10.1.2.3/",
            "http://192.168.0.1/",
            "http://172.16.5.4/",
            "http://169.254.169.254/latest/meta-data",
            "http://[::1]/",
            "http://[fe80::1]/",
            "http://[fd00::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://100.64.0.1/",
            "http://0.0.0.0/",
            "http://localhost:8080/",
        ] {
            assert_eq!(parse(url, 2048, false), Err(TargetError::Private), "{url}");
            assert!(parse(url, 2048, true).is_ok(), "{url}");
        }
        assert!(parse("https://shop.example/hooks", 2048, false).is_ok());
        assert!(parse("https://93.184.216.34/hooks", 2048, false).is_ok());
    }

    #[test]
    fn other_schemes_long_urls_and_credentials_are_refused() {
        assert_eq!(
            parse("ftp://shop.example/", 2048, true),
            Err(TargetError::Scheme)
        );
        assert_eq!(
            parse("file:///etc/passwd", 2048, true),
            Err(TargetError::Scheme)
        );
        let long = format!("https://shop.example/{}", "a".repeat(100));
        assert_eq!(parse(&long, 64, true), Err(TargetError::TooLong(64)));
        assert_eq!(
            parse("https://u:p@shop.example/", 2048, true),
            Err(TargetError::Host)
        );
        assert!(matches!(
            parse("not a url", 2048, true),
            Err(TargetError::Malformed(_))
        ));
    }
}
