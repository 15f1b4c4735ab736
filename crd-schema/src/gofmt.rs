//! Go-compatible rendering of values, so our messages read byte for byte like kube-apiserver's.
//!
//! Owns: `strconv.Quote` (`%q`), Go's `%v` for float64, Go's `%#v` for decoded JSON
//! (`map[string]interface {}{...}`), and `encoding/json`'s rendering of decoded JSON (used where the
//! apiserver compares or prints marshalled values). Must not decide what is rendered or when: callers
//! choose; this module only formats.

use serde_json::Value;

/// How kube-apiserver holds a decoded JSON number: unstructured decoding yields `int64` when the literal
/// is an integer that fits, `float64` otherwise.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum GoNum {
    Int(i64),
    Float(f64),
}

pub(crate) fn go_num(n: &serde_json::Number) -> GoNum {
    if let Some(i) = n.as_i64() {
        GoNum::Int(i)
    } else {
        // u64 above i64::MAX and every non-integer literal decode as float64 in Go.
        GoNum::Float(n.as_f64().unwrap_or(f64::NAN))
    }
}

impl GoNum {
    pub(crate) fn as_f64(self) -> f64 {
        match self {
            GoNum::Int(i) => i as f64,
            GoNum::Float(f) => f,
        }
    }
}

/// Go's `strconv.Quote`.
pub(crate) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if is_go_printable(c) => out.push(c),
            c if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
    }
    out.push('"');
    out
}

/// Approximates Go's `unicode.IsPrint` (letters, marks, numbers, punctuation, symbols and ASCII space).
fn is_go_printable(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    !(c.is_control() || c.is_whitespace() || matches!(c as u32, 0xad | 0x200b..=0x200f | 0x2028..=0x202e | 0xfeff))
}

/// Go's `fmt` `%v` for a float64: shortest digits, in `%e` form when the decimal exponent is < -4 or
/// >= 6 (Go's shortest `%g` switches at precision 6: `123456`, `1e+06`).
pub(crate) fn float_v(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf".into() } else { "-Inf".into() };
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0".into() } else { "0".into() };
    }
    // Rust's `{:e}` gives the shortest round-trip digits, like Go's shortest formatting.
    let sci = format!("{f:e}");
    let (mantissa, exp) = match sci.split_once('e') {
        Some((m, e)) => (m.to_string(), e.parse::<i32>().unwrap_or(0)),
        None => (sci.clone(), 0),
    };
    if (-4..6).contains(&exp) {
        return format!("{f}");
    }
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exp.abs())
}

/// `fmt.Sprintf("%v", x)` for an int64 or float64.
pub(crate) fn num_v(n: GoNum) -> String {
    match n {
        GoNum::Int(i) => i.to_string(),
        GoNum::Float(f) => float_v(f),
    }
}

/// Go's `%#v` of a value decoded from JSON into `interface{}`.
pub(crate) fn sharp_v(v: &Value) -> String {
    match v {
        Value::Null => "interface {}(nil)".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => num_v(go_num(n)),
        Value::String(s) => quote(s),
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(sharp_v).collect();
            format!("[]interface {{}}{{{}}}", inner.join(", "))
        }
        Value::Object(map) => {
            // fmt prints map entries with sorted keys; serde_json's map is already sorted.
            let inner: Vec<String> = map.iter().map(|(k, v)| format!("{}:{}", quote(k), sharp_v(v))).collect();
            format!("map[string]interface {{}}{{{}}}", inner.join(", "))
        }
    }
}

/// `encoding/json` string encoding: like JSON, with `<`, `>`, `&`, U+2028 and U+2029 escaped (HTML-safe).
pub(crate) fn go_json_str(s: &str) -> String {
    serde_json::to_string(s)
        .unwrap_or_default()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

/// `encoding/json.Marshal` of a decoded JSON value (sorted keys, Go float formatting).
pub(crate) fn go_json(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => match go_num(n) {
            GoNum::Int(i) => i.to_string(),
            GoNum::Float(f) => go_json_float(f),
        },
        Value::String(s) => go_json_str(s),
        Value::Array(items) => format!("[{}]", items.iter().map(go_json).collect::<Vec<_>>().join(",")),
        Value::Object(map) => {
            let inner: Vec<String> = map.iter().map(|(k, v)| format!("{}:{}", go_json_str(k), go_json(v))).collect();
            format!("{{{}}}", inner.join(","))
        }
    }
}

/// encoding/json's float64 encoding: `%f`-style unless the magnitude calls for an exponent.
fn go_json_float(f: f64) -> String {
    let abs = f.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        let sci = format!("{f:e}");
        match sci.split_once('e') {
            Some((m, e)) => {
                let exp = e.parse::<i32>().unwrap_or(0);
                let sign = if exp < 0 { '-' } else { '+' };
                format!("{m}e{sign}{:02}", exp.abs())
            }
            None => sci,
        }
    } else {
        format!("{f}")
    }
}

/// Go's `swag.IsFloat64AJSONInteger`: integral within ±2^53, with a 1e-9 relative tolerance.
pub(crate) fn is_float_json_integer(f: f64) -> bool {
    const MAX: f64 = 9_007_199_254_740_991.0;
    if !f.is_finite() || !(-MAX..=MAX).contains(&f) {
        return false;
    }
    let g = f.trunc();
    if f == g {
        return true;
    }
    let diff = (f - g).abs();
    if g == 0.0 {
        return diff < 1e-9 * f64::MIN_POSITIVE;
    }
    diff / (f.abs() + g.abs()) < 1e-9
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn floats_render_like_go_percent_v() {
        assert_eq!(float_v(1.0), "1");
        assert_eq!(float_v(0.5), "0.5");
        assert_eq!(float_v(123456.0), "123456");
        assert_eq!(float_v(1e6), "1e+06");
        assert_eq!(float_v(1234567.0), "1.234567e+06");
        assert_eq!(float_v(0.0001), "0.0001");
        assert_eq!(float_v(0.00001), "1e-05");
        assert_eq!(float_v(-2.5), "-2.5");
    }

    #[test]
    fn sharp_v_matches_go() {
        assert_eq!(sharp_v(&json!({"name": "a", "n": 1})), r#"map[string]interface {}{"n":1, "name":"a"}"#);
        assert_eq!(sharp_v(&json!({})), "map[string]interface {}{}");
        assert_eq!(sharp_v(&json!(["a", 2.5])), r#"[]interface {}{"a", 2.5}"#);
    }

    #[test]
    fn quote_escapes_like_strconv() {
        assert_eq!(quote("a\"b\\c\n"), r#""a\"b\\c\n""#);
        assert_eq!(quote("é"), "\"é\"");
        assert_eq!(quote("\u{1}"), r#""\x01""#);
    }

    #[test]
    fn go_json_is_compact_and_go_like() {
        assert_eq!(go_json(&json!({"b": 1.0, "a": [true, null]})), r#"{"a":[true,null],"b":1}"#);
    }
}
