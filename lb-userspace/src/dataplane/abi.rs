//! Conversions between the vocabulary's types and the map ABI (`lb_common`: network byte order
//! words, fixed-size names). The model and translation never see the ABI; only this module
//! converts. The one identity the ABI stores as text, `ServiceMeta.name` (`namespace/name`), is
//! written and parsed only here.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use lb_common::{
    Backend, FAMILY_IPV4, FAMILY_IPV6, FrontendKey, PROTOCOL_TCP, PROTOCOL_UDP, SCOPE_CLUSTER,
    SCOPE_LOCAL, ServiceMeta,
};

use crate::vocab::{
    Family, ObjectKey, Protocol, Scope, ServiceAddr, ServicePortKey, ServicePortKeyFields,
};

pub fn protocol_number(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => PROTOCOL_TCP,
        Protocol::Udp => PROTOCOL_UDP,
    }
}

pub fn protocol_from(n: u8) -> Option<Protocol> {
    match n {
        PROTOCOL_TCP => Some(Protocol::Tcp),
        PROTOCOL_UDP => Some(Protocol::Udp),
        _ => None,
    }
}

pub fn family_number(f: Family) -> u8 {
    match f {
        Family::IPv4 => FAMILY_IPV4,
        Family::IPv6 => FAMILY_IPV6,
    }
}

pub fn family_from(n: u8) -> Option<Family> {
    match n {
        FAMILY_IPV4 => Some(Family::IPv4),
        FAMILY_IPV6 => Some(Family::IPv6),
        _ => None,
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

/// The map key of a service address.
pub fn frontend_key(addr: ServiceAddr) -> FrontendKey {
    FrontendKey {
        addr: ip_to_words(addr.addr.ip()),
        port_be: addr.addr.port().to_be(),
        protocol: protocol_number(addr.protocol),
        family: family_number(addr.family()),
    }
}

/// The service address a map key stands for.
pub fn service_addr(key: &FrontendKey) -> Option<ServiceAddr> {
    Some(ServiceAddr::new(
        words_to_ip(key.addr, key.family)?,
        u16::from_be(key.port_be),
        protocol_from(key.protocol)?,
    ))
}

pub fn backend(addr: SocketAddr) -> Backend {
    Backend {
        addr: ip_to_words(addr.ip()),
        port_be: addr.port().to_be(),
        family: family_number(Family::of(addr.ip())),
        _pad: 0,
    }
}

/// The address of a backend entry; `None` for an unused (zero) entry.
pub fn backend_addr(b: &Backend) -> Option<SocketAddr> {
    Some(SocketAddr::new(
        words_to_ip(b.addr, b.family)?,
        u16::from_be(b.port_be),
    ))
}

/// The metadata entry that names a backend set in the maps.
pub fn service_meta(key: &ServicePortKey, port: u16) -> ServiceMeta {
    ServiceMeta {
        name: to_fixed_joined(&[&key.service.namespace, "/", &key.service.name]),
        port_name: to_fixed(&key.port_name),
        port,
        protocol: protocol_number(key.protocol),
        family: family_number(key.family),
        scope: match key.scope {
            Scope::Cluster => SCOPE_CLUSTER,
            Scope::Local => SCOPE_LOCAL,
        },
        _pad: [0; 3],
    }
}

/// The backend set a metadata entry names.
pub fn service_port_key(meta: &ServiceMeta) -> Option<ServicePortKey> {
    let name = from_fixed(&meta.name);
    let (namespace, service) = name.split_once('/')?;
    Some(ServicePortKey::from(ServicePortKeyFields {
        service: ObjectKey::new(namespace, service),
        port_name: from_fixed(&meta.port_name).into(),
        protocol: protocol_from(meta.protocol)?,
        family: family_from(meta.family)?,
        scope: match meta.scope {
            SCOPE_LOCAL => Scope::Local,
            _ => Scope::Cluster,
        },
    }))
}

/// Copies a string into a zero-padded fixed field, cutting it at a char boundary if it is too
/// long (Kubernetes names always fit: see `lb_common::SERVICE_NAME_LEN`, `PORT_NAME_LEN`).
pub fn to_fixed<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [0u8; N];
    let mut end = s.len().min(N - 1);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out[..end].copy_from_slice(&s.as_bytes()[..end]);
    out
}

/// [`to_fixed`] of the parts joined, without building the joined string (a full sync writes a
/// name per backend set).
pub fn to_fixed_joined<const N: usize>(parts: &[&str]) -> [u8; N] {
    let mut out = [0u8; N];
    let mut at = 0;
    for part in parts {
        let mut end = part.len().min(N - 1 - at);
        while !part.is_char_boundary(end) {
            end -= 1;
        }
        out[at..at + end].copy_from_slice(&part.as_bytes()[..end]);
        at += end;
        if end < part.len() {
            break;
        }
    }
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
        let fe = ServiceAddr::new("10.96.0.10".parse().unwrap(), 80, Protocol::Tcp);
        let key = frontend_key(fe);
        assert_eq!(key.addr[0].to_ne_bytes(), [10, 96, 0, 10]);
        assert_eq!(key.port_be.to_ne_bytes(), [0, 80]);
        assert_eq!(service_addr(&key), Some(fe));
        let v6 = ServiceAddr::new("fd00:96::10".parse().unwrap(), 53, Protocol::Udp);
        assert_eq!(service_addr(&frontend_key(v6)), Some(v6));
    }

    #[test]
    fn metadata_round_trips_with_long_names() {
        let key = ServicePortKey::from(ServicePortKeyFields {
            service: ObjectKey::new("a".repeat(63), "b".repeat(63)),
            port_name: "p".repeat(63).into(),
            protocol: Protocol::Udp,
            family: Family::IPv6,
            scope: Scope::Local,
        });
        assert_eq!(service_port_key(&service_meta(&key, 53)), Some(key));
    }

    #[test]
    fn fixed_strings_cut_at_char_boundaries() {
        let f: [u8; 5] = to_fixed("aé€");
        assert_eq!(from_fixed(&f), "aé");
    }

    #[test]
    fn joined_parts_cut_as_the_joined_string() {
        for (ns, name) in [
            ("ns", "svc"),
            ("nsé", "€x"),
            ("abcdefg", "h"),
            ("a", "bcé€"),
        ] {
            let joined: [u8; 8] = to_fixed_joined(&[ns, "/", name]);
            let whole: [u8; 8] = to_fixed(&format!("{ns}/{name}"));
            assert_eq!(joined, whole, "{ns}/{name}");
        }
    }
}
