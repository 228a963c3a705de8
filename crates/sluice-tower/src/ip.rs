//! The client's IP: the peer address, or `X-Forwarded-For` when the peer is a trusted proxy.
//!
//! A rule keyed on `ip` is only as good as the address it is given: `X-Forwarded-For` is
//! written by whoever sends the request, so it is read only when the connection comes from a
//! proxy the operator named, and then only up to the first hop that is not one of them.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use http::HeaderMap;

/// An IP network (`10.0.0.0/8`, `fd00::/8`; a bare address is one host), for trusted proxies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

/// Why a CIDR did not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CidrError {
    /// The address part is not an IPv4 or IPv6 address.
    #[error("not an IP address: {0:?}")]
    Address(String),
    /// The prefix is not a number within the address's bits.
    #[error("bad prefix length in {0:?}")]
    Prefix(String),
}

impl Cidr {
    /// Whether `ip` is in this network (IPv4-mapped IPv6 addresses count as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr = IpAddr::from_str(addr.trim())
            .map_err(|_| CidrError::Address(s.to_string()))?
            .to_canonical();
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| CidrError::Prefix(s.to_string()))?,
        };
        Ok(Cidr { addr, prefix })
    }
}

/// One `X-Forwarded-For` entry: an address, maybe with a port (`1.2.3.4:5`, `[::1]:5`).
fn parse_hop(s: &str) -> Option<IpAddr> {
    let s = s.trim();
    IpAddr::from_str(s)
        .ok()
        .or_else(|| SocketAddr::from_str(s).ok().map(|a| a.ip()))
        .map(|ip| ip.to_canonical())
}

/// The client's address for a request from `peer`.
///
/// When `peer` is in `trusted`, the `X-Forwarded-For` entries (all the header's lines, in
/// order) are walked right to left, skipping trusted hops; the first untrusted one is the
/// client. An unparsable entry ends the walk at the last trusted hop (what is left of it was
/// written by someone no proxy vouches for). When every hop is trusted, the leftmost is the
/// client. An untrusted peer is the client, whatever its header says.
pub fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &[Cidr]) -> IpAddr {
    let peer = peer.to_canonical();
    let is_trusted = |ip: IpAddr| trusted.iter().any(|c| c.contains(ip));
    if !is_trusted(peer) {
        return peer;
    }
    let mut hops: Vec<&str> = Vec::new();
    for value in headers.get_all("x-forwarded-for") {
        let Ok(value) = value.to_str() else {
            return peer;
        };
        hops.extend(value.split(',').filter(|h| !h.trim().is_empty()));
    }
    let mut client = peer;
    for hop in hops.iter().rev() {
        let Some(ip) = parse_hop(hop) else {
            return client;
        };
        client = ip;
        if !is_trusted(ip) {
            return ip;
        }
    }
    client
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn cidrs(list: &[&str]) -> Vec<Cidr> {
        list.iter()
            .map(|c| c.parse().expect("valid cidr"))
            .collect()
    }

    fn xff(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("x-forwarded-for", HeaderValue::from_str(v).expect("value"));
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn cidrs_parse_and_contain() {
        let net: Cidr = "10.0.0.0/8".parse().expect("valid");
        assert!(net.contains(ip("10.255.1.2")));
        assert!(!net.contains(ip("11.0.0.1")));
        assert!(net.contains(ip("::ffff:10.1.2.3")), "v4-mapped is v4");
        let host: Cidr = "192.168.1.7".parse().expect("valid");
        assert!(host.contains(ip("192.168.1.7")));
        assert!(!host.contains(ip("192.168.1.8")));
        let v6: Cidr = "fd00::/8".parse().expect("valid");
        assert!(v6.contains(ip("fd12::1")));
        assert!(!v6.contains(ip("10.0.0.1")));
        let all: Cidr = "0.0.0.0/0".parse().expect("valid");
        assert!(all.contains(ip("8.8.8.8")));
        assert_eq!(
            "10.0.0.0/33".parse::<Cidr>(),
            Err(CidrError::Prefix("10.0.0.0/33".into()))
        );
        assert_eq!(
            "example/8".parse::<Cidr>(),
            Err(CidrError::Address("example/8".into()))
        );
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_its_header_says() {
        let trusted = cidrs(&["10.0.0.0/8"]);
        let spoofed = xff(&["1.2.3.4"]);
        assert_eq!(
            client_ip(ip("203.0.113.9"), &spoofed, &trusted),
            ip("203.0.113.9")
        );
        assert_eq!(
            client_ip(ip("203.0.113.9"), &spoofed, &[]),
            ip("203.0.113.9")
        );
    }

    #[test]
    fn a_trusted_peer_walks_right_to_left_past_trusted_hops() {
        let trusted = cidrs(&["10.0.0.0/8"]);
        // The client prepended a spoofed entry; the first untrusted hop from the right wins.
        let h = xff(&["6.6.6.6, 198.51.100.4, 10.0.0.2"]);
        assert_eq!(client_ip(ip("10.0.0.1"), &h, &trusted), ip("198.51.100.4"));
        // The same across several header lines, with ports.
        let h = xff(&["6.6.6.6", "198.51.100.4:4711", "[::ffff:10.0.0.2]:80"]);
        assert_eq!(client_ip(ip("10.0.0.1"), &h, &trusted), ip("198.51.100.4"));
    }

    #[test]
    fn without_a_header_or_with_only_trusted_hops() {
        let trusted = cidrs(&["10.0.0.0/8"]);
        assert_eq!(
            client_ip(ip("10.0.0.1"), &HeaderMap::new(), &trusted),
            ip("10.0.0.1")
        );
        let h = xff(&["10.9.9.9, 10.0.0.2"]);
        assert_eq!(client_ip(ip("10.0.0.1"), &h, &trusted), ip("10.9.9.9"));
    }

    #[test]
    fn garbage_ends_the_walk_at_the_last_trusted_hop() {
        let trusted = cidrs(&["10.0.0.0/8"]);
        let h = xff(&["1.2.3.4, not-an-ip, 10.0.0.2"]);
        assert_eq!(client_ip(ip("10.0.0.1"), &h, &trusted), ip("10.0.0.2"));
    }
}
