//! An address descriptor counted by its network (`key: [ip/64]`): one host rotating through
//! the addresses of its IPv6 /64 (or a NAT's IPv4 /24) is one identity, written in the
//! identity as the canonical masked network (`2001:db8::/64`, `203.0.113.0/24`).

use crate::rules::IpMask;
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// `value` as an address, or `None` when it is none. An IPv4-mapped IPv6 address
/// (`::ffff:203.0.113.7`) is its IPv4 address: the same host, however the front end wrote it.
pub fn parse(value: &str) -> Option<IpAddr> {
    value.parse::<IpAddr>().ok().map(|a| a.to_canonical())
}

/// The network of `addr` under `mask`: the address with the bits past the prefix cleared,
/// and the prefix length.
pub fn network(addr: IpAddr, mask: IpMask) -> (IpAddr, u8) {
    match addr {
        IpAddr::V4(a) => {
            let len = mask.v4.min(32);
            let bits = u32::from(a) & u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            (IpAddr::V4(Ipv4Addr::from(bits)), len)
        }
        IpAddr::V6(a) => {
            let len = mask.v6.min(128);
            let bits = u128::from(a) & u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            (IpAddr::V6(Ipv6Addr::from(bits)), len)
        }
    }
}

/// Appends the network of `value` under `mask` (`2001:db8::/64`) to `out`; `false`, with
/// `out` unchanged, when `value` is no address.
pub fn push_network(out: &mut String, value: &str, mask: IpMask) -> bool {
    let Some(addr) = parse(value) else {
        return false;
    };
    let (net, len) = network(addr, mask);
    // Writing to a String cannot fail.
    let _ = write!(out, "{net}/{len}");
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn net(value: &str, v4: u8, v6: u8) -> Option<String> {
        let mut s = String::new();
        push_network(&mut s, value, IpMask { v4, v6 }).then_some(s)
    }

    #[test]
    fn networks_are_canonical() {
        assert_eq!(net("2001:db8::1", 32, 64).as_deref(), Some("2001:db8::/64"));
        assert_eq!(
            net("2001:0DB8:0000:0000:ffff:1:2:3", 32, 64).as_deref(),
            Some("2001:db8::/64")
        );
        assert_eq!(
            net("2001:db8:1:2:3:4:5:6", 32, 48).as_deref(),
            Some("2001:db8:1::/48")
        );
        assert_eq!(
            net("203.0.113.77", 24, 64).as_deref(),
            Some("203.0.113.0/24")
        );
        assert_eq!(
            net("203.0.113.77", 32, 64).as_deref(),
            Some("203.0.113.77/32")
        );
        assert_eq!(
            net("::ffff:203.0.113.77", 24, 64).as_deref(),
            Some("203.0.113.0/24")
        );
        assert_eq!(
            net("2001:db8::1", 32, 128).as_deref(),
            Some("2001:db8::1/128")
        );
        assert_eq!(net("255.255.255.255", 1, 1).as_deref(), Some("128.0.0.0/1"));
        for bad in [
            "",
            "x",
            "1.2.3",
            "1.2.3.4.5",
            "256.1.1.1",
            "2001:db8::/64",
            "fe80::1%eth0",
            " 1.2.3.4",
            "1.2.3.4:80",
        ] {
            assert_eq!(net(bad, 24, 64), None, "{bad:?}");
        }
    }

    fn mask() -> impl Strategy<Value = IpMask> {
        (1u8..=32, 1u8..=128).prop_map(|(v4, v6)| IpMask { v4, v6 })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Two addresses of one network are one identity, whatever their host bits.
        #[test]
        fn addresses_of_one_network_share_it(a in any::<u128>(), b in any::<u128>(), m in mask(), v4 in any::<bool>()) {
            let (x, y) = if v4 {
                let keep = u32::MAX.checked_shl(32 - u32::from(m.v4)).unwrap_or(0);
                let x = a as u32;
                let y = (x & keep) | (b as u32 & !keep);
                (Ipv4Addr::from(x).to_string(), Ipv4Addr::from(y).to_string())
            } else {
                let keep = u128::MAX.checked_shl(128 - u32::from(m.v6)).unwrap_or(0);
                // Leave the mapped range alone: those are IPv4 addresses.
                let x = a | (1 << 127);
                let y = (x & keep) | (b & !keep);
                (Ipv6Addr::from(x).to_string(), Ipv6Addr::from(y).to_string())
            };
            prop_assert_eq!(net(&x, m.v4, m.v6), net(&y, m.v4, m.v6));
        }

        /// Different networks never share an identity: the written network reads back as
        /// the masked address, so equal text means equal networks.
        #[test]
        fn different_networks_never_collide(a in any::<u128>(), b in any::<u128>(), m in mask(), v4 in any::<bool>()) {
            let (x, y) = if v4 {
                (Ipv4Addr::from(a as u32).to_string(), Ipv4Addr::from(b as u32).to_string())
            } else {
                (Ipv6Addr::from(a | 1 << 127).to_string(), Ipv6Addr::from(b | 1 << 127).to_string())
            };
            let (nx, ny) = (net(&x, m.v4, m.v6).expect("address"), net(&y, m.v4, m.v6).expect("address"));
            let same = if v4 {
                let keep = u32::MAX.checked_shl(32 - u32::from(m.v4)).unwrap_or(0);
                (a as u32 & keep) == (b as u32 & keep)
            } else {
                let keep = u128::MAX.checked_shl(128 - u32::from(m.v6)).unwrap_or(0);
                ((a | 1 << 127) & keep) == ((b | 1 << 127) & keep)
            };
            prop_assert_eq!(nx == ny, same, "{} {}", nx, ny);
            // IPv4 and IPv6 networks are never written alike.
            let other = if v4 { Ipv6Addr::from(b | 1 << 127).to_string() } else { Ipv4Addr::from(b as u32).to_string() };
            prop_assert_ne!(net(&other, m.v4, m.v6).expect("address"), nx);
        }
    }
}
