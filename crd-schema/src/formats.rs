//! The string `format` checks of kube-openapi's `strfmt.Default` registry, as CRD validation uses them.
//!
//! Owns: one predicate per supported format (`date-time`, `uuid`, `ipv4`, ...), ported from
//! go-openapi/strfmt and govalidator. Must not produce errors or decide whether a format applies
//! (see `openapi`); formats are looked up by the registry's normalized name (without `-`).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::LazyLock;

use regex::Regex;

/// The patterns below are constants known to compile; `None` would only make a format never match.
fn re(p: &str) -> Option<Regex> {
    Regex::new(p).ok()
}

fn is(r: &LazyLock<Option<Regex>>, s: &str) -> bool {
    r.as_ref().is_some_and(|r| r.is_match(s))
}

static HOSTNAME: LazyLock<Option<Regex>> = LazyLock::new(|| {
    re(
        r"^([a-zA-Z0-9\p{S}\p{L}]((-?[a-zA-Z0-9\p{S}\p{L}]{0,62})?)|([a-zA-Z0-9\p{S}\p{L}](([a-zA-Z0-9-\p{S}\p{L}]{0,61}[a-zA-Z0-9\p{S}\p{L}])?)(\.)){1,}([a-zA-Z0-9\p{S}\p{L}])(-?[a-zA-Z0-9\p{S}\p{L}]){1,62})$",
    )
});
static UUID: LazyLock<Option<Regex>> =
    LazyLock::new(|| re(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}$"));
static UUID3: LazyLock<Option<Regex>> =
    LazyLock::new(|| re(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?3[0-9a-f]{3}-?[0-9a-f]{4}-?[0-9a-f]{12}$"));
static UUID4: LazyLock<Option<Regex>> =
    LazyLock::new(|| re(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?4[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$"));
static UUID5: LazyLock<Option<Regex>> =
    LazyLock::new(|| re(r"(?i)^[0-9a-f]{8}-?[0-9a-f]{4}-?5[0-9a-f]{3}-?[89ab][0-9a-f]{3}-?[0-9a-f]{12}$"));
static DATETIME_TIME: LazyLock<Option<Regex>> =
    LazyLock::new(|| re(r"^([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))$"));
static BASE64: LazyLock<Option<Regex>> =
    LazyLock::new(|| re(r"^(?:[A-Za-z0-9+\/]{4})*(?:[A-Za-z0-9+\/]{2}==|[A-Za-z0-9+\/]{3}=|[A-Za-z0-9+\/]{4})$"));
static HEXCOLOR: LazyLock<Option<Regex>> = LazyLock::new(|| re(r"^#?([0-9a-fA-F]{3}|[0-9a-fA-F]{6})$"));
static RGBCOLOR: LazyLock<Option<Regex>> = LazyLock::new(|| {
    let n = r"(0|[1-9]\d?|1\d\d?|2[0-4]\d|25[0-5])";
    re(&format!(r"^rgb\(\s*{n}\s*,\s*{n}\s*,\s*{n}\s*\)$"))
});
static SSN: LazyLock<Option<Regex>> = LazyLock::new(|| re(r"^\d{3}[- ]?\d{2}[- ]?\d{4}$"));
static CREDITCARD: LazyLock<Option<Regex>> = LazyLock::new(|| {
    re(
        r"^(?:4[0-9]{12}(?:[0-9]{3})?|5[1-5][0-9]{14}|(222[1-9]|22[3-9][0-9]|2[3-6][0-9]{2}|27[01][0-9]|2720)[0-9]{12}|6(?:011|5[0-9][0-9])[0-9]{12}|3[47][0-9]{13}|3(?:0[0-5]|[68][0-9])[0-9]{11}|(?:2131|1800|35\d{3})\d{11}|6[27][0-9]{14})$",
    )
});
static ISBN10: LazyLock<Option<Regex>> = LazyLock::new(|| re(r"^(?:[0-9]{9}X|[0-9]{10})$"));
static ISBN13: LazyLock<Option<Regex>> = LazyLock::new(|| re(r"^(?:[0-9]{13})$"));
static EMAIL: LazyLock<Option<Regex>> = LazyLock::new(|| {
    re(
        r#"^(?:[^<>"@\s]+\s+<)?[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*>?$"#,
    )
});
static URI_SCHEME: LazyLock<Option<Regex>> = LazyLock::new(|| re(r"^[A-Za-z][A-Za-z0-9+.\-]*:"));
static DURATION_UNITS: LazyLock<Option<Regex>> = LazyLock::new(|| re(r"((\d+)\s*([A-Za-zµ]+))"));

/// Whether the registry knows `format` (the validator only applies to known formats).
pub(crate) fn known(format: &str) -> bool {
    matches!(
        normalize(format).as_str(),
        "bsonobjectid"
            | "uri"
            | "email"
            | "hostname"
            | "ipv4"
            | "ipv6"
            | "cidr"
            | "mac"
            | "uuid"
            | "uuid3"
            | "uuid4"
            | "uuid5"
            | "isbn"
            | "isbn10"
            | "isbn13"
            | "creditcard"
            | "ssn"
            | "hexcolor"
            | "rgbcolor"
            | "byte"
            | "password"
            | "date"
            | "duration"
            | "datetime"
    )
}

fn normalize(format: &str) -> String {
    format.replace('-', "").to_ascii_lowercase()
}

/// `strfmt.Default.Validates(format, s)`.
pub(crate) fn validates(format: &str, s: &str) -> bool {
    match normalize(format).as_str() {
        "bsonobjectid" => s.len() == 24 && s.bytes().all(|b| b.is_ascii_hexdigit()),
        "uri" => is_request_uri(s),
        "email" => is(&EMAIL, s),
        "hostname" => is_hostname(s),
        "ipv4" => is_ipv4(s),
        "ipv6" => is_ipv6(s),
        "cidr" => is_cidr(s),
        "mac" => is_mac(s),
        "uuid" => is(&UUID, s),
        "uuid3" => is(&UUID3, s),
        "uuid4" => is(&UUID4, s),
        "uuid5" => is(&UUID5, s),
        "isbn" => is_isbn10(s) || is_isbn13(s),
        "isbn10" => is_isbn10(s),
        "isbn13" => is_isbn13(s),
        "creditcard" => is_credit_card(s),
        "ssn" => s.len() == 11 && is(&SSN, s),
        "hexcolor" => is(&HEXCOLOR, s),
        "rgbcolor" => is(&RGBCOLOR, s),
        "byte" => is(&BASE64, s),
        "password" => true,
        "date" => is_date(s),
        "duration" => parse_duration(s).is_some(),
        "datetime" => is_date_time(s),
        _ => true,
    }
}

fn is_hostname(s: &str) -> bool {
    is(&HOSTNAME, s) && s.len() <= 255 && s.split('.').all(|p| p.len() <= 63)
}

/// Go's `net.ParseIP` rejects IPv4 octets with leading zeros, as does Rust's parser.
fn parse_ip(s: &str) -> bool {
    s.parse::<Ipv4Addr>().is_ok() || s.parse::<Ipv6Addr>().is_ok()
}

fn is_ipv4(s: &str) -> bool {
    parse_ip(s) && s.contains('.')
}

fn is_ipv6(s: &str) -> bool {
    parse_ip(s) && s.contains(':')
}

fn is_cidr(s: &str) -> bool {
    let Some((ip, bits)) = s.split_once('/') else { return false };
    if bits.is_empty() || !bits.bytes().all(|b| b.is_ascii_digit()) || (bits.len() > 1 && bits.starts_with('0')) {
        return false;
    }
    let Ok(bits) = bits.parse::<u32>() else { return false };
    if ip.parse::<Ipv4Addr>().is_ok() {
        bits <= 32
    } else if ip.parse::<Ipv6Addr>().is_ok() {
        bits <= 128
    } else {
        false
    }
}

/// `net.ParseMAC`: 6, 8 or 20 octets separated by `:` or `-`, or dotted groups of four hex digits.
fn is_mac(s: &str) -> bool {
    let valid_len = |n: usize| n == 6 || n == 8 || n == 20;
    for sep in [':', '-'] {
        if s.contains(sep) {
            let parts: Vec<&str> = s.split(sep).collect();
            return valid_len(parts.len())
                && parts.iter().all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()));
        }
    }
    if s.contains('.') {
        let parts: Vec<&str> = s.split('.').collect();
        return valid_len(parts.len() * 2)
            && parts.iter().all(|p| p.len() == 4 && p.bytes().all(|b| b.is_ascii_hexdigit()));
    }
    false
}

/// `url.ParseRequestURI`: an absolute URI or an absolute path, without control characters or spaces
/// and with well-formed percent escapes.
fn is_request_uri(s: &str) -> bool {
    if s.is_empty() || s.chars().any(|c| c.is_control() || c == ' ') {
        return false;
    }
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let ok = bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit);
            if !ok {
                return false;
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    s.starts_with('/') || is(&URI_SCHEME, s)
}

fn is_isbn10(s: &str) -> bool {
    let clean: String = s.chars().filter(|c| *c != ' ' && *c != '-').collect();
    if !is(&ISBN10, &clean) {
        return false;
    }
    let mut sum = 0u32;
    for (i, c) in clean.chars().enumerate() {
        let d = if c == 'X' { 10 } else { c.to_digit(10).unwrap_or(0) };
        sum += (i as u32 + 1) * d;
    }
    sum.is_multiple_of(11)
}

fn is_isbn13(s: &str) -> bool {
    let clean: String = s.chars().filter(|c| *c != ' ' && *c != '-').collect();
    if !is(&ISBN13, &clean) {
        return false;
    }
    let digits: Vec<u32> = clean.chars().filter_map(|c| c.to_digit(10)).collect();
    let sum: u32 = digits[..12].iter().enumerate().map(|(i, d)| if i % 2 == 0 { *d } else { d * 3 }).sum();
    (10 - sum % 10) % 10 == digits[12]
}

fn is_credit_card(s: &str) -> bool {
    let clean: String = s.chars().filter(|c| *c != ' ' && *c != '-').collect();
    if !is(&CREDITCARD, &clean) {
        return false;
    }
    // Luhn checksum.
    let mut sum = 0;
    let mut double = false;
    for c in clean.chars().rev() {
        let mut d = c.to_digit(10).unwrap_or(0);
        if double {
            d *= 2;
            if d > 9 {
                d -= 9;
            }
        }
        sum += d;
        double = !double;
    }
    sum % 10 == 0
}

/// `time.Parse("2006-01-02", s)`.
pub(crate) fn is_date(s: &str) -> bool {
    parse_date(s).is_some()
}

fn parse_date(s: &str) -> Option<(i32, u32, u32)> {
    let b = s.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        let part = s.get(r)?;
        if part.bytes().all(|c| c.is_ascii_digit()) { part.parse().ok() } else { None }
    };
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if !(1..=12).contains(&m) || d < 1 || d > days_in_month(y as i32, m) {
        return None;
    }
    Some((y as i32, m, d))
}

fn days_in_month(y: i32, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        _ => 28,
    }
}

/// `strfmt.IsDateTime`: a valid date, `t`/`T`, then `hh:mm:ss[.frac](z|±hh:mm)`.
fn is_date_time(s: &str) -> bool {
    if s.len() < 4 {
        return false;
    }
    let lower = s.to_lowercase();
    let parts: Vec<&str> = lower.split('t').collect();
    if parts.len() < 2 || !is_date(parts[0]) {
        return false;
    }
    match DATETIME_TIME.as_ref().and_then(|r| r.captures(parts[1])) {
        Some(c) => {
            let g = |i: usize| c.get(i).map(|m| m.as_str()).unwrap_or("");
            g(1) <= "23" && g(2) <= "59" && g(3) <= "59"
        }
        None => false,
    }
}

/// `strfmt.ParseDuration`: Go's `time.ParseDuration`, else the `<n> <unit>` (Scala-like) forms.
/// Returns nanoseconds.
pub(crate) fn parse_duration(s: &str) -> Option<i128> {
    if let Some(d) = parse_go_duration(s) {
        return Some(d);
    }
    let mut total: i128 = 0;
    let mut ok = false;
    let units = DURATION_UNITS.as_ref()?;
    for c in units.captures_iter(s) {
        let n: i128 = c.get(2)?.as_str().parse().ok()?;
        let unit = c.get(3)?.as_str().trim().to_lowercase();
        let mult: i128 = match unit.as_str() {
            "ns" | "nanos" | "nanosecond" | "nanoseconds" => 1,
            "us" | "µs" | "micros" | "microsecond" | "microseconds" => 1_000,
            "ms" | "millis" | "millisecond" | "milliseconds" => 1_000_000,
            "s" | "sec" | "secs" | "second" | "seconds" => 1_000_000_000,
            "m" | "min" | "mins" | "minute" | "minutes" => 60_000_000_000,
            "h" | "hr" | "hrs" | "hour" | "hours" => 3_600_000_000_000,
            "d" | "day" | "days" => 86_400_000_000_000,
            "w" | "wk" | "wks" | "week" | "weeks" => 604_800_000_000_000,
            _ => continue,
        };
        total += n * mult;
        ok = true;
    }
    ok.then_some(total)
}

/// Go's `time.ParseDuration`, in nanoseconds (signed; `None` for what Go refuses, overflow included).
pub fn parse_go_duration(s: &str) -> Option<i128> {
    let mut rest = s;
    let mut neg = false;
    if let Some(r) = rest.strip_prefix('-') {
        neg = true;
        rest = r;
    } else if let Some(r) = rest.strip_prefix('+') {
        rest = r;
    }
    if rest == "0" {
        return Some(0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total: f64 = 0.0;
    while !rest.is_empty() {
        let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let num = &rest[..num_end];
        if num.is_empty() || num == "." {
            return None;
        }
        let value: f64 = num.parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let unit = &rest[..unit_end];
        rest = &rest[unit_end..];
        let mult: f64 = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        total += value * mult;
    }
    if total > i64::MAX as f64 {
        return None;
    }
    Some(if neg { -(total as i128) } else { total as i128 })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn date_time_follows_strfmt() {
        assert!(validates("date-time", "2024-01-02T03:04:05Z"));
        assert!(validates("date-time", "2024-01-02t03:04:05.123+02:00"));
        assert!(!validates("date-time", "2024-01-02"));
        assert!(!validates("date-time", "2024-02-30T00:00:00Z"));
        assert!(!validates("date-time", "2024-01-02T24:00:00Z"));
    }

    #[test]
    fn network_formats() {
        assert!(validates("ipv4", "10.0.0.1"));
        assert!(!validates("ipv4", "10.0.0.01"));
        assert!(!validates("ipv4", "::1"));
        assert!(validates("ipv6", "::1"));
        assert!(validates("cidr", "10.0.0.0/8"));
        assert!(!validates("cidr", "10.0.0.0/33"));
        assert!(validates("mac", "00:1a:2b:3c:4d:5e"));
        assert!(validates("hostname", "example.com"));
        assert!(!validates("hostname", "-bad.com"));
    }

    #[test]
    fn misc_formats() {
        assert!(validates("uuid", "123e4567-e89b-12d3-a456-426614174000"));
        assert!(!validates("uuid", "nope"));
        assert!(validates("byte", "aGVsbG8="));
        assert!(!validates("byte", "hello!"));
        assert!(validates("duration", "1h30m"));
        assert!(validates("duration", "3 days"));
        assert!(!validates("duration", "soon"));
        assert!(validates("date", "2024-02-29"));
        assert!(!validates("date", "2023-02-29"));
        assert!(known("date-time") && !known("k8s-short-name"));
    }
}
