//! Field checks shared by the Service and EndpointSlice validators. Every failure names the
//! object and the field, so a user can find the line to fix.
use std::{
    fmt,
    net::{IpAddr, Ipv4Addr},
    sync::Arc,
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::vocab::{Kind, ObjectKey, ObjectRef};

/// One object rejected: which object, which field, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{object}: {field}: {message}")]
pub struct ValidationError {
    pub object: ObjectRef,
    pub field: String,
    pub message: String,
}

/// Collects the object's identity so each check only states the field and the problem.
pub(crate) struct Checker {
    pub object: ObjectRef,
}

/// Lower-case letters, digits and '-' (and '.' when `dots`), starting and ending alphanumeric.
fn is_dns(value: &str, dots: bool) -> bool {
    value
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || (dots && b == b'.'))
        && value.starts_with(|c: char| c.is_ascii_alphanumeric())
        && value.ends_with(|c: char| c.is_ascii_alphanumeric())
}

impl Checker {
    /// The checker for one object, after checking its name (at most `name_max` characters)
    /// and namespace (`default` when absent); also returns the object's key.
    pub(super) fn for_object(
        kind: Kind,
        meta: &ObjectMeta,
        name_max: usize,
    ) -> Result<(Self, ObjectKey), ValidationError> {
        let namespace = meta.namespace.as_deref().unwrap_or("default");
        let name = meta.name.as_deref().unwrap_or_default();
        let shown = if name.is_empty() { "<unnamed>" } else { name };
        let c = Self {
            object: ObjectRef::new(kind, ObjectKey::new(namespace, shown)),
        };
        c.dns_name("metadata.name", name, name_max)?;
        c.dns_name("metadata.namespace", namespace, 63)?;
        // A Service's name is interned too: its slices name it in their label, so the Service
        // and its slices share one copy, and the index of slices by Service compares it by
        // pointer.
        let name: Arc<str> = if kind == Kind::Service {
            super::intern::intern(name)
        } else {
            name.into()
        };
        let key = ObjectKey::new(super::intern::intern(namespace), name);
        Ok((c, key))
    }

    pub(super) fn error(
        &self,
        field: impl fmt::Display,
        message: impl fmt::Display,
    ) -> ValidationError {
        ValidationError {
            object: self.object.clone(),
            field: field.to_string(),
            message: message.to_string(),
        }
    }

    /// An RFC 1123 label or subdomain of at most `max` characters (object names, namespaces).
    pub(super) fn dns_name(
        &self,
        field: &str,
        value: &str,
        max: usize,
    ) -> Result<(), ValidationError> {
        if value.is_empty() {
            return Err(self.error(field, "must not be empty"));
        }
        if value.len() > max {
            return Err(self.error(
                field,
                format!("{} characters, at most {max} allowed", value.len()),
            ));
        }
        if is_dns(value, true) {
            Ok(())
        } else {
            Err(self.error(
                field,
                format!("{value:?} is not a DNS name (lower-case letters, digits, '-', '.')"),
            ))
        }
    }

    /// A port number, 1..=65535.
    pub(super) fn port(&self, field: &str, value: i32) -> Result<u16, ValidationError> {
        match u16::try_from(value) {
            Ok(p) if p != 0 => Ok(p),
            _ => Err(self.error(field, format!("port {value} is outside 1-65535"))),
        }
    }

    /// An IP address, read as kube-proxy reads a Service's (`ParseIPSloppy`: IPv4 parts may
    /// carry leading zeros, as objects stored before the API's strict validation can).
    pub(super) fn ip(&self, field: &str, value: &str) -> Result<IpAddr, ValidationError> {
        parse_ip_sloppy(value)
            .ok_or_else(|| self.error(field, format!("{value:?} is not an IP address")))
    }

    /// A DNS-1123 label (a Service or EndpointSlice port name): lower-case letters, digits and
    /// '-', starting and ending alphanumeric, at most 63 characters.
    pub(super) fn dns_label(&self, field: &str, value: &str) -> Result<(), ValidationError> {
        if value.len() > 63 {
            return Err(self.error(
                field,
                format!(
                    "{value:?} is {} characters, at most 63 allowed",
                    value.len()
                ),
            ));
        }
        if is_dns(value, false) {
            Ok(())
        } else {
            Err(self.error(
                field,
                format!("{value:?} is not a DNS label (lower-case letters, digits, '-')"),
            ))
        }
    }

    /// A named targetPort: an IANA service name, at most 15 characters.
    pub(super) fn port_name(&self, field: &str, value: &str) -> Result<(), ValidationError> {
        if value.len() > 15 {
            return Err(self.error(
                field,
                format!("port name {value:?} is longer than 15 characters"),
            ));
        }
        if !value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(self.error(
                field,
                format!("port name {value:?} may only hold lower-case letters, digits and '-'"),
            ));
        }
        Ok(())
    }
}

/// Parses an IP address as kube-proxy does: IPv4 parts may carry leading zeros, which count as
/// decimal (`192.168.099.022` is 192.168.99.22).
pub fn parse_ip_sloppy(value: &str) -> Option<IpAddr> {
    if let Ok(ip) = value.parse() {
        return Some(ip);
    }
    let mut octets = [0u8; 4];
    let mut parts = value.split('.');
    for octet in &mut octets {
        let part = parts.next()?;
        if part.is_empty() || part.len() > 3 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *octet = part.parse().ok()?;
    }
    parts
        .next()
        .is_none()
        .then(|| IpAddr::V4(Ipv4Addr::from(octets)))
}

/// An address block (`10.0.0.0/8`), for loadBalancerSourceRanges.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Cidr {
    /// Parses `ADDR/PREFIX` (leading zeros allowed, as kube-proxy does).
    pub fn parse(value: &str) -> Option<Self> {
        let (addr, prefix) = value.split_once('/')?;
        let addr = parse_ip_sloppy(addr)?;
        let prefix: u8 = prefix.parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (prefix <= max).then_some(Self { addr, prefix })
    }

    /// A block that holds every address of its family (`0.0.0.0/0`, `::/0`).
    pub fn is_everything(&self) -> bool {
        self.prefix == 0
    }

    /// Whether `ip` lies in the block (never across families).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let bits = |a: IpAddr| -> u128 {
            match a {
                IpAddr::V4(v4) => u128::from(u32::from(v4)) << 96,
                IpAddr::V6(v6) => u128::from(v6),
            }
        };
        if self.addr.is_ipv4() != ip.is_ipv4() {
            return false;
        }
        let prefix = u32::from(self.prefix);
        let mask = u128::MAX.checked_shl(128 - prefix).unwrap_or(0);
        bits(self.addr) & mask == bits(ip) & mask
    }

    /// The block with its host bits cleared (`203.0.113.7/25` is `203.0.113.0/25`), as tools
    /// that refuse host bits want it.
    #[must_use]
    pub fn network(&self) -> Self {
        let prefix = u32::from(self.prefix);
        let addr = match self.addr {
            IpAddr::V4(v4) => {
                let mask = u32::MAX.checked_shl(32 - prefix).unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask))
            }
            IpAddr::V6(v6) => {
                let mask = u128::MAX.checked_shl(128 - prefix).unwrap_or(0);
                IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) & mask))
            }
        };
        Self {
            addr,
            prefix: self.prefix,
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_like_kube_proxy() {
        assert_eq!(
            parse_ip_sloppy("192.168.099.022"),
            Some("192.168.99.22".parse().unwrap())
        );
        assert_eq!(parse_ip_sloppy("fd00::1"), Some("fd00::1".parse().unwrap()));
        assert_eq!(parse_ip_sloppy("300.1.1.1"), None);
        assert_eq!(parse_ip_sloppy("1.2.3"), None);
        assert_eq!(parse_ip_sloppy("junk"), None);
        let c = Cidr::parse("203.0.113.000/025").unwrap();
        assert_eq!(c.to_string(), "203.0.113.0/25");
        assert!(Cidr::parse("0.0.0.0/0").unwrap().is_everything());
        assert_eq!(Cidr::parse("10.0.0.0/33"), None);
        let net = Cidr::parse("192.0.2.0/24").unwrap();
        assert!(net.contains("192.0.2.77".parse().unwrap()));
        assert!(!net.contains("192.0.3.1".parse().unwrap()));
        assert!(!net.contains("::ffff:192.0.2.77".parse().unwrap()));
        assert!(
            Cidr::parse("0.0.0.0/0")
                .unwrap()
                .contains("8.8.8.8".parse().unwrap())
        );
        assert!(
            Cidr::parse("fd00::/64")
                .unwrap()
                .contains("fd00::5".parse().unwrap())
        );
        assert!(
            !Cidr::parse("fd00::/64")
                .unwrap()
                .contains("fd01::5".parse().unwrap())
        );
    }
}
