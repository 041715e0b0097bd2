//! Conversions between the map ABI (`lb_common`, network byte order words) and std's address
//! types, and the readable names of protocols and families.
use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
};

use lb_common::{Backend, FAMILY_IPV4, FAMILY_IPV6, FrontendKey, PROTOCOL_TCP, PROTOCOL_UDP};
use serde::{Deserialize, Serialize};

/// The transport protocols socklb translates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Protocol {
    #[serde(rename = "TCP")]
    Tcp,
    #[serde(rename = "UDP")]
    Udp,
}

impl Protocol {
    pub fn number(self) -> u8 {
        match self {
            Self::Tcp => PROTOCOL_TCP,
            Self::Udp => PROTOCOL_UDP,
        }
    }

    pub fn from_number(n: u8) -> Option<Self> {
        match n {
            PROTOCOL_TCP => Some(Self::Tcp),
            PROTOCOL_UDP => Some(Self::Udp),
            _ => None,
        }
    }

    /// Parses "TCP"/"tcp", as Kubernetes and the CLI write it.
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_uppercase().as_str() {
            "TCP" => Some(Self::Tcp),
            "UDP" => Some(Self::Udp),
            _ => None,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Tcp => "TCP",
            Self::Udp => "UDP",
        })
    }
}

/// IPv4 or IPv6, as Kubernetes names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Family {
    IPv4,
    IPv6,
}

impl Family {
    pub fn of(ip: IpAddr) -> Self {
        if ip.is_ipv4() { Self::IPv4 } else { Self::IPv6 }
    }

    pub fn number(self) -> u8 {
        match self {
            Self::IPv4 => FAMILY_IPV4,
            Self::IPv6 => FAMILY_IPV6,
        }
    }

    pub fn from_number(n: u8) -> Option<Self> {
        match n {
            FAMILY_IPV4 => Some(Self::IPv4),
            FAMILY_IPV6 => Some(Self::IPv6),
            _ => None,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::IPv4 => "IPv4",
            Self::IPv6 => "IPv6",
        })
    }
}

/// An IP address as four network-byte-order words (IPv4 in the first).
pub fn ip_to_words(ip: IpAddr) -> [u32; 4] {
    match ip {
        IpAddr::V4(v4) => [u32::from_ne_bytes(v4.octets()), 0, 0, 0],
        IpAddr::V6(v6) => {
            let o = v6.octets();
            let mut w = [0u32; 4];
            for (i, word) in w.iter_mut().enumerate() {
                *word = u32::from_ne_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]]);
            }
            w
        }
    }
}

pub fn words_to_ip(words: [u32; 4], family: u8) -> Option<IpAddr> {
    match family {
        FAMILY_IPV4 => Some(IpAddr::V4(Ipv4Addr::from(words[0].to_ne_bytes()))),
        FAMILY_IPV6 => {
            let mut o = [0u8; 16];
            for (i, word) in words.iter().enumerate() {
                o[4 * i..4 * i + 4].copy_from_slice(&word.to_ne_bytes());
            }
            Some(IpAddr::V6(Ipv6Addr::from(o)))
        }
        _ => None,
    }
}

/// A service address with its protocol: what a frontend key holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Frontend {
    pub addr: SocketAddr,
    pub protocol: Protocol,
}

impl Frontend {
    pub fn new(ip: IpAddr, port: u16, protocol: Protocol) -> Self {
        Self {
            addr: SocketAddr::new(ip, port),
            protocol,
        }
    }

    pub fn family(&self) -> Family {
        Family::of(self.addr.ip())
    }

    /// Parses `ADDR:PORT[/tcp|udp]` (IPv6 as `[ADDR]:PORT`); TCP when no protocol is given.
    pub fn parse(target: &str) -> Result<Self, String> {
        let (addr, protocol) = match target.rsplit_once('/') {
            Some((a, p)) => (
                a,
                Protocol::parse(p).ok_or_else(|| format!("{p:?} is not tcp or udp"))?,
            ),
            None => (target, Protocol::Tcp),
        };
        let addr: SocketAddr = addr
            .parse()
            .map_err(|_| format!("{addr:?} is not ADDR:PORT (IPv6: [ADDR]:PORT)"))?;
        Ok(Self::new(addr.ip(), addr.port(), protocol))
    }

    pub fn to_key(self) -> FrontendKey {
        FrontendKey {
            addr: ip_to_words(self.addr.ip()),
            port_be: self.addr.port().to_be(),
            protocol: self.protocol.number(),
            family: self.family().number(),
        }
    }

    pub fn from_key(key: &FrontendKey) -> Option<Self> {
        Some(Self {
            addr: SocketAddr::new(
                words_to_ip(key.addr, key.family)?,
                u16::from_be(key.port_be),
            ),
            protocol: Protocol::from_number(key.protocol)?,
        })
    }
}

impl fmt::Display for Frontend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.protocol)
    }
}

pub fn backend_to_abi(addr: SocketAddr) -> Backend {
    Backend {
        addr: ip_to_words(addr.ip()),
        port_be: addr.port().to_be(),
        family: Family::of(addr.ip()).number(),
        _pad: 0,
    }
}

pub fn backend_from_abi(b: &Backend) -> Option<SocketAddr> {
    Some(SocketAddr::new(
        words_to_ip(b.addr, b.family)?,
        u16::from_be(b.port_be),
    ))
}

/// Copies a string into a zero-padded fixed field, cutting it at a char boundary if it is too
/// long (validation rejects such names before they get here).
pub fn to_fixed<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [0u8; N];
    let mut end = s.len().min(N);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out[..end].copy_from_slice(&s.as_bytes()[..end]);
    out
}

pub fn from_fixed(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frontend_key_round_trips_and_is_network_order() {
        let fe = Frontend::new("10.96.0.10".parse().unwrap(), 80, Protocol::Tcp);
        let key = fe.to_key();
        assert_eq!(key.addr[0].to_ne_bytes(), [10, 96, 0, 10]);
        assert_eq!(key.port_be.to_ne_bytes(), [0, 80]);
        assert_eq!(Frontend::from_key(&key), Some(fe));
        let v6 = Frontend::new("fd00:96::10".parse().unwrap(), 53, Protocol::Udp);
        assert_eq!(Frontend::from_key(&v6.to_key()), Some(v6));
    }

    #[test]
    fn fixed_strings_cut_at_char_boundaries() {
        let f: [u8; 4] = to_fixed("aé€");
        assert_eq!(from_fixed(&f), "aé");
    }
}
