//! Addresses a store client never connects to (the operator's `--deny-endpoints`, issue 42):
//! checked on every connection, not only on the endpoint a policy names, so a redirect, a
//! GCS key's base URL, or a name whose answer changes after the policy was checked (DNS
//! rebinding) cannot reach the cloud's instance-metadata service or the operator's own
//! loopback.
//!
//! A [`DeniedResolver`] resolves a host and keeps only the addresses outside the denied
//! ranges: a host with none left fails to connect, naming the address and the range. An
//! address written as such (an IP literal host) is never resolved, so it is checked where
//! the URL is known ([`check_literal`]).

use std::net::IpAddr;
use std::sync::Arc;

/// An address range, `10.0.0.0/8` or `fd00::/8` (a bare address is the range of one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl std::str::FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            format!(
                "{:?}: expected an address range such as 10.0.0.0/8 or fd00::/8",
                s.chars().take(64).collect::<String>()
            )
        };
        let (addr, prefix) = s.trim().split_once('/').unwrap_or((s.trim(), ""));
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = if prefix.is_empty() {
            max
        } else {
            prefix
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(bad)?
        };
        Ok(Cidr { addr, prefix })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl Cidr {
    /// Whether `ip` (an IPv4-mapped IPv6 address as its IPv4 one) is in the range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let bits = |a: IpAddr| -> (u128, u8) {
            match a.to_canonical() {
                IpAddr::V4(v) => (u128::from(u32::from(v)) << 96, 32),
                IpAddr::V6(v) => (u128::from(v), 128),
            }
        };
        let ((net, width), (ip, ip_width)) = (bits(self.addr), bits(ip));
        if width != ip_width {
            return false;
        }
        let prefix = u32::from(self.prefix.min(width));
        let mask = if prefix == 0 {
            0
        } else {
            u128::MAX << (128 - prefix)
        };
        net & mask == ip & mask
    }
}

/// `list` (comma-separated ranges; empty: none).
///
/// # Errors
/// A part that is not a range, named with the form.
pub fn parse_cidrs(list: &str) -> Result<Vec<Cidr>, String> {
    list.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::parse)
        .collect()
}

/// The first range of `denied` holding `ip`.
pub fn denied_by(denied: &[Cidr], ip: IpAddr) -> Option<Cidr> {
    denied.iter().copied().find(|r| r.contains(ip))
}

/// Why `host` is not reached: one of its addresses, `ip`, lies in `range`.
fn refusal(host: &str, ip: IpAddr, range: Cidr) -> String {
    format!(
        "{host} reaches {ip}, in {range}, which Tidemark does not send requests to (the operator's --deny-endpoints)"
    )
}

/// Refuses a host written as an address (an IP literal, `[::1]` too) in `denied`; a name
/// is left to the resolver.
///
/// # Errors
/// The address and the range.
pub fn check_literal(denied: &[Cidr], host: &str) -> Result<(), String> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<IpAddr>() {
        Ok(ip) => match denied_by(denied, ip) {
            Some(range) => Err(refusal(host, ip, range)),
            None => Ok(()),
        },
        Err(_) => Ok(()),
    }
}

/// Resolves `host` and keeps the addresses outside `denied`.
///
/// # Errors
/// The name does not resolve, or every address it has is denied (the first one named).
pub async fn resolve(denied: &[Cidr], host: &str) -> Result<Vec<IpAddr>, String> {
    let found: Vec<IpAddr> = tokio::net::lookup_host((host, 0))
        .await
        .map_err(|e| format!("resolving {host}: {e}"))?
        .map(|a| a.ip())
        .collect();
    let mut refused = None;
    let allowed: Vec<IpAddr> = found
        .into_iter()
        .filter(|ip| match denied_by(denied, *ip) {
            Some(range) => {
                refused.get_or_insert((*ip, range));
                false
            }
            None => true,
        })
        .collect();
    match (allowed.is_empty(), refused) {
        (true, Some((ip, range))) => Err(refusal(host, ip, range)),
        (true, None) => Err(format!("{host} resolves to no address")),
        (false, _) => Ok(allowed),
    }
}

/// object_store's resolver for every connection a store client makes (see the module's
/// documentation).
#[derive(Debug, Clone)]
pub struct DeniedResolver {
    denied: Arc<[Cidr]>,
}

impl DeniedResolver {
    pub fn new(denied: &[Cidr]) -> Self {
        DeniedResolver {
            denied: denied.into(),
        }
    }

    /// The denied ranges.
    pub fn ranges(&self) -> &[Cidr] {
        &self.denied
    }
}

impl object_store::client::DnsResolver for DeniedResolver {
    fn resolve(&self, host: &str) -> object_store::client::DnsFuture {
        let (denied, host) = (Arc::clone(&self.denied), host.to_owned());
        Box::pin(async move { resolve(&denied, &host).await.map_err(Into::into) })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ranges_hold_what_they_say() {
        let r = |s: &str| s.parse::<Cidr>().unwrap();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let cases = [
            ("169.254.0.0/16", "169.254.169.254", true),
            ("169.254.0.0/16", "169.253.255.255", false),
            ("127.0.0.0/8", "127.1.2.3", true),
            ("127.0.0.0/8", "::ffff:127.0.0.1", true),
            ("::1/128", "::1", true),
            ("::1", "::2", false),
            ("fe80::/10", "fe80::1", true),
            ("fe80::/10", "fec0::1", false),
            ("fd00:ec2::254/128", "fd00:ec2::254", true),
            ("fd00:ec2::254", "fd00:ec2::253", false),
            ("0.0.0.0/0", "8.8.8.8", true),
            ("0.0.0.0/0", "::1", false),
            ("0.0.0.0/8", "0.0.0.0", true),
            ("::/128", "::", true),
            ("::/128", "::1", false),
            ("10.0.0.0/8", "10.255.0.1", true),
        ];
        for (range, addr, want) in cases {
            assert_eq!(r(range).contains(ip(addr)), want, "{range} ∋ {addr}");
        }
        for bad in ["10.0.0.0/33", "::/129", "example.com", "10.0.0.0/x", ""] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_cidrs(" 10.0.0.0/8, ,::1 ").unwrap(),
            [r("10.0.0.0/8"), r("::1/128")]
        );
        assert!(parse_cidrs("10.0.0.0/8,nope").unwrap_err().contains("nope"));
    }

    #[test]
    fn literals_and_names_are_checked() {
        let denied = parse_cidrs("127.0.0.0/8,::1,169.254.0.0/16").unwrap();
        assert!(check_literal(&denied, "[::1]").is_err());
        assert!(check_literal(&denied, "169.254.169.254").is_err());
        assert!(check_literal(&denied, "10.0.0.1").is_ok());
        assert!(check_literal(&denied, "example.internal").is_ok());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // A name that resolves only to denied addresses fails to connect, naming one.
        let e = rt.block_on(resolve(&denied, "localhost")).unwrap_err();
        assert!(
            e.contains("localhost reaches") && e.contains("--deny-endpoints"),
            "{e}"
        );
        // Without the range, it resolves.
        assert!(!rt.block_on(resolve(&[], "localhost")).unwrap().is_empty());
    }
}
