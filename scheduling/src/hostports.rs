//! Host-port conflicts (karpenter-semantics §3.12): same protocol and port, and equal IPs or either
//! unspecified.
//!
//! Owns the clash rule only.

use crate::model::HostPort;

fn unspecified(ip: &str) -> bool {
    ip.is_empty() || ip == "0.0.0.0" || ip == "::"
}

fn protocol(p: &HostPort) -> &str {
    if p.protocol.is_empty() { "TCP" } else { &p.protocol }
}

/// Whether two host ports clash.
pub fn clash(a: &HostPort, b: &HostPort) -> bool {
    a.port == b.port && protocol(a) == protocol(b) && (a.ip == b.ip || unspecified(&a.ip) || unspecified(&b.ip))
}

/// The first port of `wanted` that clashes with one of `used`.
pub fn first_clash<'a>(wanted: &'a [HostPort], used: &[HostPort]) -> Option<&'a HostPort> {
    wanted.iter().find(|w| used.iter().any(|u| clash(w, u)))
}

/// `8080/TCP`.
pub fn describe(p: &HostPort) -> String {
    if unspecified(&p.ip) {
        format!("{}/{}", p.port, protocol(p))
    } else {
        format!("{}:{}/{}", p.ip, p.port, protocol(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(ip: &str, port: i32, protocol: &str) -> HostPort {
        HostPort { ip: ip.into(), port, protocol: protocol.into() }
    }

    #[test]
    fn clashes() {
        assert!(clash(&port("", 8080, "TCP"), &port("", 8080, "")));
        assert!(!clash(&port("", 8080, "TCP"), &port("", 8080, "UDP")));
        assert!(clash(&port("10.0.0.1", 80, "TCP"), &port("0.0.0.0", 80, "TCP")));
        assert!(!clash(&port("10.0.0.1", 80, "TCP"), &port("10.0.0.2", 80, "TCP")));
    }
}
