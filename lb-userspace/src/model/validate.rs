//! Field checks shared by the Service and EndpointSlice validators. Every failure names the
//! object and the field, so a user can find the line to fix.
use std::{fmt, net::IpAddr};

/// One object rejected: which object, which field, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {object}: {field}: {message}")]
pub struct ValidationError {
    pub kind: &'static str,
    pub object: String,
    pub field: String,
    pub message: String,
}

/// Collects the object's identity so each check only states the field and the problem.
pub(crate) struct Checker {
    pub kind: &'static str,
    pub object: String,
}

impl Checker {
    pub fn error(&self, field: impl fmt::Display, message: impl fmt::Display) -> ValidationError {
        ValidationError {
            kind: self.kind,
            object: self.object.clone(),
            field: field.to_string(),
            message: message.to_string(),
        }
    }

    /// An RFC 1123 label or subdomain of at most `max` characters (object names, namespaces).
    pub fn dns_name(&self, field: &str, value: &str, max: usize) -> Result<(), ValidationError> {
        if value.is_empty() {
            return Err(self.error(field, "must not be empty"));
        }
        if value.len() > max {
            return Err(self.error(
                field,
                format!("{} characters, at most {max} allowed", value.len()),
            ));
        }
        let ok = value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
            && value.starts_with(|c: char| c.is_ascii_alphanumeric())
            && value.ends_with(|c: char| c.is_ascii_alphanumeric());
        if ok {
            Ok(())
        } else {
            Err(self.error(
                field,
                format!("{value:?} is not a DNS name (lower-case letters, digits, '-', '.')"),
            ))
        }
    }

    /// A port number, 1..=65535.
    pub fn port(&self, field: &str, value: i32) -> Result<u16, ValidationError> {
        match u16::try_from(value) {
            Ok(p) if p != 0 => Ok(p),
            _ => Err(self.error(field, format!("port {value} is outside 1-65535"))),
        }
    }

    pub fn ip(&self, field: &str, value: &str) -> Result<IpAddr, ValidationError> {
        value
            .parse()
            .map_err(|_| self.error(field, format!("{value:?} is not an IP address")))
    }

    /// A port name: an IANA service name, at most 15 characters.
    pub fn port_name(&self, field: &str, value: &str) -> Result<(), ValidationError> {
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
