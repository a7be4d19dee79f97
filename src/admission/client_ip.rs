//! The client's address, as far as it can be trusted.
//!
//! A header such as `X-Forwarded-For` is believed only when the TCP peer is a proxy we
//! trust (our CDN or load balancer); anyone else could write any address into it and walk
//! past the per-IP limit.

use std::net::IpAddr;

use ipnet::IpNet;

pub struct ClientIp {
    trusted_proxies: Vec<IpNet>,
}

impl ClientIp {
    pub fn new(trusted_proxies: Vec<IpNet>) -> Self {
        Self { trusted_proxies }
    }

    /// True when `ip` is one of the proxies trusted to name the client.
    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.trusted_proxies.iter().any(|net| net.contains(&ip))
    }

    /// `header_values` are the configured client-address header's values, in the order
    /// received (a proxy may add its own line). For lists (`X-Forwarded-For`) the rightmost
    /// address that is not a trusted proxy is the client.
    pub fn resolve<'a>(
        &self,
        peer: IpAddr,
        header_values: impl DoubleEndedIterator<Item = &'a [u8]>,
    ) -> IpAddr {
        let peer = canonical(peer);
        if !self.is_trusted(peer) {
            return peer;
        }
        let mut hops = header_values
            .rev()
            .filter_map(|value| std::str::from_utf8(value).ok())
            .flat_map(|value| value.rsplit(',').map(str::trim));
        hops.find_map(|hop| {
            let ip = canonical(hop.parse::<IpAddr>().ok()?);
            (!self.is_trusted(ip)).then_some(ip)
        })
        .unwrap_or(peer)
    }
}

/// IPv4-mapped IPv6 addresses count as the IPv4 address they carry.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn one(value: &[u8]) -> std::iter::Once<&[u8]> {
        std::iter::once(value)
    }

    #[test]
    fn untrusted_peer_is_the_client() {
        let resolver = ClientIp::new(vec![]);
        assert_eq!(
            resolver.resolve(ip("203.0.113.9"), one(b"198.51.100.1")),
            ip("203.0.113.9")
        );
    }

    #[test]
    fn trusted_peer_reports_the_rightmost_untrusted_hop() {
        let resolver = ClientIp::new(vec!["10.0.0.0/8".parse().unwrap()]);
        let peer = ip("10.0.0.1");
        assert_eq!(
            resolver.resolve(peer, one(b"1.1.1.1, 198.51.100.7, 10.1.2.3")),
            ip("198.51.100.7")
        );
        assert_eq!(resolver.resolve(peer, one(b"garbage")), peer);
        assert_eq!(resolver.resolve(peer, std::iter::empty()), peer);
        assert_eq!(
            resolver.resolve(peer, one(b"2001:db8::1")),
            ip("2001:db8::1")
        );
    }

    #[test]
    fn a_forged_first_line_does_not_hide_the_proxy_line() {
        let resolver = ClientIp::new(vec!["10.0.0.0/8".parse().unwrap()]);
        let lines = [b"6.6.6.6".as_slice(), b"198.51.100.7".as_slice()];
        assert_eq!(
            resolver.resolve(ip("10.0.0.1"), lines.into_iter()),
            ip("198.51.100.7")
        );
    }

    #[test]
    fn mapped_addresses_are_ipv4() {
        let resolver = ClientIp::new(vec!["127.0.0.1/32".parse().unwrap()]);
        assert_eq!(
            resolver.resolve(ip("::ffff:127.0.0.1"), one(b"192.0.2.4")),
            ip("192.0.2.4")
        );
    }
}
