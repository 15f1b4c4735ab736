//! Kubernetes quantities (`500m`, `2`, `1.5Gi`, `1e3`) as exact integers, and the four node
//! resources the hub schedules with (`cpu`, `memory`, `ephemeral-storage`, `pods`).
//!
//! Owns: parsing with the grammar of `k8s.io/apimachinery` `resource.Quantity`, the conversions the
//! scheduler needs (`MilliValue`/`Value`, rounded up and saturating), Kubernetes' canonical text
//! form, and [`Resources`] arithmetic. Must not: go through `f64` (a float loses the last KiB of a
//! 16 GiB node and makes fit decisions platform-dependent), panic on any input, or know anything
//! about flavors or pods. Pure: no I/O, no clock, no logging.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use serde::{Deserialize, Serialize};

/// Resource name of CPU (values in cores, handled in millicores).
pub const CPU: &str = "cpu";
/// Resource name of memory (bytes).
pub const MEMORY: &str = "memory";
/// Resource name of ephemeral storage (bytes).
pub const EPHEMERAL_STORAGE: &str = "ephemeral-storage";
/// Resource name of the pod count.
pub const PODS: &str = "pods";

/// Most significant decimal digits kept exactly. `10^38 < i128::MAX`, and any value with more digits
/// than this either saturates every `i64` conversion or differs from the kept digits only below the
/// millis (see [`Quantity::truncated`]).
const MAX_DIGITS: usize = 38;

/// What a valid quantity looks like; appended to every parse error so the message says how to fix it.
const VALID_FORMS: &str = "expected a number with an optional suffix: Ki Mi Gi Ti Pi Ei (powers of 1024), \
n u m k M G T P E (powers of 1000) or an exponent, e.g. \"500m\", \"2\", \"1.5Gi\", \"1e3\"";

/// Why a quantity could not be parsed or converted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The text is empty.
    #[error("empty quantity: {VALID_FORMS}")]
    Empty,
    /// No digit before or after the decimal point (`-`, `.`, `Gi`).
    #[error("invalid quantity {value:?}: the number has no digits; {VALID_FORMS}")]
    NoDigits {
        /// The offending text.
        value: String,
    },
    /// The text after the number is not a known suffix (`1KB`, `1 Gi`, `1,5`, `1e`).
    #[error("invalid quantity {value:?}: unknown suffix {suffix:?} (suffixes are case-sensitive); {VALID_FORMS}")]
    UnknownSuffix {
        /// The offending text.
        value: String,
        /// What follows the number.
        suffix: String,
    },
    /// The exponent of an `e`/`E` form does not fit a 32-bit integer (Kubernetes would wrap it).
    #[error("invalid quantity {value:?}: exponent out of range (at most {} in magnitude); {VALID_FORMS}", i32::MAX)]
    ExponentOutOfRange {
        /// The offending text.
        value: String,
    },
    /// A quantity of a resource list is invalid; names the resource.
    #[error("resource {key:?}: {source}")]
    Resource {
        /// Resource name (`cpu`, `memory`, ...).
        key: String,
        /// What is wrong with its quantity.
        source: Box<QuantityError>,
    },
}

/// A parsed Kubernetes quantity, kept exact: `mantissa × 10^exponent`.
///
/// Binary suffixes are folded in at parse time (`1Ki` is `1024 × 10^0`), so only a decimal scale
/// remains. The mantissa is normalised (no trailing zero digit, zero is `0 × 10^0`), which makes
/// structural equality value equality for every quantity of at most 38 significant digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quantity {
    /// Significant digits with the sign; magnitude below `10^39`.
    mantissa: i128,
    /// Power of ten applied to the mantissa.
    exponent: i64,
    /// Non-zero digits beyond the 38 most significant ones were dropped: the exact magnitude is
    /// strictly above `|mantissa| × 10^exponent`, by less than one unit of the last kept digit.
    /// Rounding up at any unit of at least `10^exponent` stays exact with this one bit (like a
    /// floating-point sticky bit); at finer units the value saturates `i64` anyway.
    truncated: bool,
}

impl Quantity {
    /// `MilliValue()`: the value in thousandths, rounded up (away from zero, like Kubernetes'
    /// `int64Amount`) and saturating at the `i64` bounds. The CPU conversion.
    pub fn as_millis(&self) -> i64 {
        self.scaled(-3)
    }

    /// `Value()`: the value in units, rounded up (away from zero) and saturating at the `i64` bounds.
    /// The conversion for bytes and counts.
    pub fn as_units(&self) -> i64 {
        self.scaled(0)
    }

    /// Whether the quantity is zero.
    pub fn is_zero(&self) -> bool {
        self.mantissa == 0
    }

    /// Whether the quantity is below zero.
    pub fn is_negative(&self) -> bool {
        self.mantissa < 0
    }

    /// The value in units of `10^unit_exponent`, rounded away from zero, saturating.
    fn scaled(&self, unit_exponent: i64) -> i64 {
        if self.mantissa == 0 {
            return 0;
        }
        let magnitude = self.mantissa.unsigned_abs();
        let shift = self.exponent.saturating_sub(unit_exponent);
        // Anything at or above this saturates; u128 leaves room to compare before clamping.
        let limit = u128::from(i64::MAX.unsigned_abs()) + 1;
        let scaled: u128 = if shift >= 0 {
            // Dropped digits sit below 10^exponent, so they only add a fraction of a unit; a
            // truncated mantissa has 38 digits and saturates here in any case.
            match u32::try_from(shift).ok().and_then(|s| 10u128.checked_pow(s)) {
                Some(factor) => {
                    magnitude.checked_mul(factor).map_or(limit, |v| v.saturating_add(u128::from(self.truncated)))
                }
                None => limit,
            }
        } else {
            match u32::try_from(shift.unsigned_abs()).ok().and_then(|s| 10u128.checked_pow(s)) {
                Some(divisor) => {
                    let quotient = magnitude / divisor;
                    let exact = magnitude.is_multiple_of(divisor) && !self.truncated;
                    quotient + u128::from(!exact)
                }
                // 10^shift exceeds u128, so it exceeds the magnitude (< 10^39): a non-zero
                // fraction of one unit, rounded up to one.
                None => 1,
            }
        };
        let scaled = scaled.min(limit);
        if self.mantissa < 0 {
            // -2^63 is representable, so the negative side saturates at i64::MIN exactly.
            i128::try_from(scaled).map_or(i64::MIN, |s| i64::try_from(-s).unwrap_or(i64::MIN))
        } else {
            i64::try_from(scaled).unwrap_or(i64::MAX)
        }
    }
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_quantity(s)
    }
}

/// Parses a quantity with the grammar of Kubernetes' `resource.Quantity`:
///
/// ```text
/// quantity        ::= signedNumber suffix
/// signedNumber    ::= number | sign number          sign ::= "+" | "-"
/// number          ::= digits | digits "." digits | digits "." | "." digits
/// suffix          ::= binarySI | decimalSI | decimalExponent
/// binarySI        ::= Ki | Mi | Gi | Ti | Pi | Ei
/// decimalSI       ::= n | u | m | "" | k | M | G | T | P | E
/// decimalExponent ::= ("e" | "E") signedInteger
/// ```
///
/// No whitespace is accepted (trim first, as the API server's JSON decoding does). Unlike
/// apimachinery's parser, a sign or a point without any digit (`-`, `.`) is rejected rather than
/// read as zero, as the grammar and the CRD pattern say. The value is kept exact, whatever its
/// length.
pub fn parse_quantity(s: &str) -> Result<Quantity, QuantityError> {
    let bytes = s.as_bytes();
    if bytes.is_empty() {
        return Err(QuantityError::Empty);
    }
    let (negative, mut pos) = match bytes[0] {
        b'-' => (true, 1),
        b'+' => (false, 1),
        _ => (false, 0),
    };
    let integer_start = pos;
    while pos < bytes.len() && bytes[pos].is_ascii_digit() {
        pos += 1;
    }
    let integer = &bytes[integer_start..pos];
    let mut fraction: &[u8] = &[];
    if pos < bytes.len() && bytes[pos] == b'.' {
        pos += 1;
        let fraction_start = pos;
        while pos < bytes.len() && bytes[pos].is_ascii_digit() {
            pos += 1;
        }
        fraction = &bytes[fraction_start..pos];
    }
    if integer.is_empty() && fraction.is_empty() {
        return Err(QuantityError::NoDigits { value: s.to_string() });
    }
    let suffix = &s[pos..];
    let (suffix_exponent, binary_exponent) = parse_suffix(s, suffix)?;

    // value = digits × 10^(suffix_exponent − |fraction|) × 2^binary_exponent
    let exponent = i64::from(suffix_exponent).saturating_sub(len_i64(fraction.len()));
    let digits = integer.iter().chain(fraction).map(|d| d - b'0');
    Ok(build(negative, digits, exponent, binary_exponent))
}

/// `(power of ten, power of two)` of a suffix.
fn parse_suffix(value: &str, suffix: &str) -> Result<(i32, u32), QuantityError> {
    let decimal = |e: i32| Ok((e, 0));
    let binary = |b: u32| Ok((0, b));
    match suffix {
        "" => decimal(0),
        "n" => decimal(-9),
        "u" => decimal(-6),
        "m" => decimal(-3),
        "k" => decimal(3),
        "M" => decimal(6),
        "G" => decimal(9),
        "T" => decimal(12),
        "P" => decimal(15),
        // `E` alone is exa; `E` followed by digits is an exponent (handled below).
        "E" => decimal(18),
        "Ki" => binary(10),
        "Mi" => binary(20),
        "Gi" => binary(30),
        "Ti" => binary(40),
        "Pi" => binary(50),
        "Ei" => binary(60),
        _ => {
            let unknown = || QuantityError::UnknownSuffix { value: value.to_string(), suffix: suffix.to_string() };
            let rest = suffix.strip_prefix(['e', 'E']).ok_or_else(unknown)?;
            let unsigned = rest.strip_prefix(['+', '-']).unwrap_or(rest);
            // Go's strconv.ParseInt would also take `+`/`-` and digits only; no fraction.
            if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                return Err(unknown());
            }
            let exponent =
                rest.parse::<i32>().map_err(|_| QuantityError::ExponentOutOfRange { value: value.to_string() })?;
            decimal(exponent)
        }
    }
}

fn len_i64(len: usize) -> i64 {
    i64::try_from(len).unwrap_or(i64::MAX)
}

/// Builds the normalised representation of `± digits × 10^exponent × 2^binary_exponent`.
fn build(negative: bool, digits: impl Iterator<Item = u8> + Clone, exponent: i64, binary_exponent: u32) -> Quantity {
    // Fast path: up to 38 significant digits fit a u128, and so does their product with 2^60 as
    // long as it stays below i128::MAX; no allocation for everything realistic.
    let significant = digits.clone().skip_while(|&d| d == 0);
    let mut magnitude: u128 = 0;
    let mut count = 0usize;
    let mut fits = true;
    for d in significant {
        count += 1;
        if count > MAX_DIGITS {
            fits = false;
            break;
        }
        magnitude = magnitude * 10 + u128::from(d);
    }
    if fits {
        let shifted = 1u128
            .checked_shl(binary_exponent)
            .and_then(|factor| magnitude.checked_mul(factor))
            .filter(|&m| m <= i128::MAX.unsigned_abs());
        if let Some(m) = shifted {
            return normalise(negative, m, exponent, false);
        }
    }
    build_slow(negative, digits, exponent, binary_exponent)
}

/// Exact path for over-long digit strings or binary products beyond i128: multiply the decimal
/// digits by 2^binary_exponent as a digit vector, then keep the 38 leading digits and a sticky bit.
fn build_slow(negative: bool, digits: impl Iterator<Item = u8>, mut exponent: i64, binary_exponent: u32) -> Quantity {
    // Least significant digit first, which makes carrying natural.
    let mut little_endian: Vec<u8> = digits.skip_while(|&d| d == 0).collect();
    little_endian.reverse();
    for _ in 0..binary_exponent / 10 {
        let mut carry: u32 = 0;
        for d in &mut little_endian {
            let v = u32::from(*d) * 1024 + carry;
            *d = (v % 10) as u8;
            carry = v / 10;
        }
        while carry > 0 {
            little_endian.push((carry % 10) as u8);
            carry /= 10;
        }
    }
    let mut truncated = false;
    if little_endian.len() > MAX_DIGITS {
        let dropped = little_endian.len() - MAX_DIGITS;
        truncated = little_endian[..dropped].iter().any(|&d| d != 0);
        little_endian.drain(..dropped);
        exponent = exponent.saturating_add(len_i64(dropped));
    }
    let magnitude = little_endian.iter().rev().fold(0u128, |m, &d| m * 10 + u128::from(d));
    normalise(negative, magnitude, exponent, truncated)
}

fn normalise(negative: bool, mut magnitude: u128, mut exponent: i64, truncated: bool) -> Quantity {
    if magnitude == 0 {
        // A zero mantissa never comes with dropped digits: the kept digits are the leading ones.
        return Quantity { mantissa: 0, exponent: 0, truncated: false };
    }
    while magnitude.is_multiple_of(10) {
        magnitude /= 10;
        exponent = exponent.saturating_add(1);
    }
    // Callers guarantee magnitude <= i128::MAX (fast path check, or at most 38 digits).
    let signed = i128::try_from(magnitude).unwrap_or(i128::MAX);
    Quantity { mantissa: if negative { -signed } else { signed }, exponent, truncated }
}

/// Kubernetes' canonical text of a DecimalSI quantity `value × 10^exponent`: trailing zeros
/// removed, the exponent brought down to a multiple of three, the SI suffix of that exponent.
fn format_decimal_si(value: i64, exponent: i32) -> String {
    if value == 0 {
        return "0".to_string();
    }
    let mut mantissa = value;
    let mut exponent = exponent;
    while mantissa % 10 == 0 {
        mantissa /= 10;
        exponent += 1;
    }
    // Multiplying back at most restores digits that were just removed, so this cannot overflow
    // unless the input exponent was not a multiple of three (never the case below).
    while exponent.rem_euclid(3) != 0 {
        mantissa = mantissa.saturating_mul(10);
        exponent -= 1;
    }
    let suffix = match exponent {
        -9 => "n",
        -6 => "u",
        -3 => "m",
        0 => "",
        3 => "k",
        6 => "M",
        9 => "G",
        12 => "T",
        15 => "P",
        18 => "E",
        // Unreachable for i64 inputs with exponent -3 or 0 (|value| < 10^19); the exponent form is
        // what Kubernetes falls back to.
        _ => return format!("{mantissa}e{exponent}"),
    };
    format!("{mantissa}{suffix}")
}

/// Canonical CPU quantity from millicores, as Kubernetes prints it: `1500m`, `2`, `100m`, `0`
/// (and `2k` for 2000 cores).
pub fn format_millis_cpu(millis: i64) -> String {
    format_decimal_si(millis, -3)
}

/// Canonical BinarySI quantity from bytes, as Kubernetes prints it: the largest power-of-1024
/// suffix that divides the value (`1536Mi`, `3911884Ki`, `1Gi`); below 1024 in magnitude,
/// DecimalSI (`100`, `0`, and `1k` for 1000), exactly like `Quantity.String()`.
pub fn format_bytes(bytes: i64) -> String {
    if bytes > -1024 && bytes < 1024 {
        return format_decimal_si(bytes, 0);
    }
    let negative = bytes < 0;
    let mut magnitude = bytes.unsigned_abs();
    let mut power = 0usize;
    while power < 6 && magnitude.is_multiple_of(1024) {
        magnitude /= 1024;
        power += 1;
    }
    let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][power];
    let sign = if negative { "-" } else { "" };
    format!("{sign}{magnitude}{suffix}")
}

/// Why a price (EUR per hour, e.g. a `karpenter.clever-cloud.com/price-per-hour` ceiling) cannot be
/// read; each says what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PriceError {
    #[error("{0:?} is negative: {PRICE_FORM}")]
    Negative(String),
    #[error("{0:?} has more than 6 decimals: {PRICE_FORM}")]
    TooPrecise(String),
    #[error("{0:?} is too large: {PRICE_FORM}")]
    TooLarge(String),
    #[error("{0:?} is not a decimal number (no exponent, sign or unit): {PRICE_FORM}")]
    NotDecimal(String),
}

/// What a price may be, for the errors.
pub const PRICE_FORM: &str =
    "write EUR per hour as a decimal string, digits with at most 6 decimals, e.g. \"0.5\", \"12\" or \"0.0611\"";

/// A decimal EUR string (`"0.5"`, `"12"`, `"0.0611"`, `".5"`) as micro-EUR. Exact: a ceiling
/// compared with sums of prices must not drift through a float. The scheduler, the webhook and the
/// operator read ceilings with this one function.
pub fn parse_price_micros(text: &str) -> Result<i64, PriceError> {
    let s = text.trim();
    if s.starts_with('-') {
        return Err(PriceError::Negative(text.to_string()));
    }
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    let digits = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && frac.is_empty()) || !digits(whole) || !digits(frac) {
        return Err(PriceError::NotDecimal(text.to_string()));
    }
    if frac.len() > 6 {
        return Err(PriceError::TooPrecise(text.to_string()));
    }
    let too_large = || PriceError::TooLarge(text.to_string());
    let whole: i64 = if whole.is_empty() { 0 } else { whole.parse().map_err(|_| too_large())? };
    let frac: i64 = format!("{frac:0<6}").parse().map_err(|_| PriceError::NotDecimal(text.to_string()))?;
    whole.checked_mul(1_000_000).and_then(|w| w.checked_add(frac)).ok_or_else(too_large)
}

/// Canonical DecimalSI quantity of bytes counted in powers of ten, as Clever Cloud sizes flavors
/// (`44G`, `500M`).
pub fn format_decimal_bytes(bytes: i64) -> String {
    format_decimal_si(bytes, 0)
}

/// Canonical DecimalSI quantity of a count (pods): `110`, `0`, `1k`.
pub fn format_count(count: i64) -> String {
    format_decimal_si(count, 0)
}

/// Whether `name` is one of the four node resources (not an extended resource).
pub fn is_node_resource(name: &str) -> bool {
    [CPU, MEMORY, EPHEMERAL_STORAGE, PODS].contains(&name)
}

/// The extended resources of a resource list (every key but the four node resources), in units;
/// zeros left out.
pub fn extended_of(list: &BTreeMap<String, K8sQuantity>) -> Result<BTreeMap<String, i64>, QuantityError> {
    let mut out = BTreeMap::new();
    for (key, q) in list.iter().filter(|(k, _)| !is_node_resource(k)) {
        let parsed = parse_quantity(q.0.trim())
            .map_err(|source| QuantityError::Resource { key: key.clone(), source: Box::new(source) })?;
        if !parsed.is_zero() {
            out.insert(key.clone(), parsed.as_units());
        }
    }
    Ok(out)
}

/// Extended resources as resource list entries (counts).
pub fn extended_list(extended: &BTreeMap<String, i64>) -> impl Iterator<Item = (String, K8sQuantity)> + '_ {
    extended.iter().map(|(k, v)| (k.clone(), K8sQuantity(format_count(*v))))
}

/// Adds `more` to `into`, resource by resource (saturating).
pub fn extended_add(into: &mut BTreeMap<String, i64>, more: &BTreeMap<String, i64>) {
    for (k, v) in more {
        let e = into.entry(k.clone()).or_insert(0);
        *e = e.saturating_add(*v);
    }
}

/// Takes `used` from what is left in `left` (saturating); a resource `left` lacks stays absent.
pub fn extended_sub(left: &mut BTreeMap<String, i64>, used: &BTreeMap<String, i64>) {
    for (k, v) in used {
        if let Some(l) = left.get_mut(k) {
            *l = l.saturating_sub(*v);
        }
    }
}

/// Whether `wanted` (extended resources, in units) fits in `offered`: a resource not offered is 0.
pub fn extended_fits(wanted: &BTreeMap<String, i64>, offered: &BTreeMap<String, i64>) -> bool {
    wanted.iter().all(|(k, v)| *v <= 0 || offered.get(k).is_some_and(|o| o >= v))
}

/// The node resources the hub schedules with, as exact integers.
///
/// Arithmetic saturates instead of overflowing: a saturated total is still "does not fit", which
/// is the safe answer, whereas a wrapped one would be a fit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    /// CPU in millicores.
    pub cpu_millis: i64,
    /// Memory in bytes.
    pub memory_bytes: i64,
    /// Ephemeral storage in bytes.
    pub ephemeral_storage_bytes: i64,
    /// Number of pods.
    pub pods: i64,
}

impl Resources {
    /// All zero.
    pub const ZERO: Resources = Resources { cpu_millis: 0, memory_bytes: 0, ephemeral_storage_bytes: 0, pods: 0 };

    /// Per-resource sum, saturating.
    #[must_use]
    pub fn saturating_add(self, other: Resources) -> Resources {
        self.zip(other, i64::saturating_add)
    }

    /// Per-resource difference, saturating (may go negative: callers that need a floor use
    /// [`Resources::floored_at_zero`]).
    #[must_use]
    pub fn saturating_sub(self, other: Resources) -> Resources {
        self.zip(other, i64::saturating_sub)
    }

    /// Every negative quantity replaced by zero.
    #[must_use]
    pub fn floored_at_zero(self) -> Resources {
        self.zip(Resources::ZERO, i64::max)
    }

    /// Every quantity of `self` is at most the same quantity of `other`.
    pub fn fits(&self, other: &Resources) -> bool {
        self.cpu_millis <= other.cpu_millis
            && self.memory_bytes <= other.memory_bytes
            && self.ephemeral_storage_bytes <= other.ephemeral_storage_bytes
            && self.pods <= other.pods
    }

    /// Whether every quantity is zero.
    pub fn is_zero(&self) -> bool {
        *self == Resources::ZERO
    }

    /// Whether some quantity is below zero.
    pub fn any_negative(&self) -> bool {
        !Resources::ZERO.fits(self)
    }

    /// Reads `cpu`, `memory`, `ephemeral-storage` and `pods` from a Kubernetes resource list (CPU
    /// rounded up to the millicore, the others up to the unit). Missing resources are zero; other
    /// resource names are ignored here. Surrounding whitespace is trimmed, as the API server's JSON
    /// decoding does. The error names the resource.
    pub fn from_resource_list(list: &BTreeMap<String, K8sQuantity>) -> Result<Resources, QuantityError> {
        let read = |key: &str, millis: bool| -> Result<i64, QuantityError> {
            match list.get(key) {
                None => Ok(0),
                Some(q) => {
                    let parsed = parse_quantity(q.0.trim())
                        .map_err(|source| QuantityError::Resource { key: key.to_string(), source: Box::new(source) })?;
                    Ok(if millis { parsed.as_millis() } else { parsed.as_units() })
                }
            }
        };
        Ok(Resources {
            cpu_millis: read(CPU, true)?,
            memory_bytes: read(MEMORY, false)?,
            ephemeral_storage_bytes: read(EPHEMERAL_STORAGE, false)?,
            pods: read(PODS, false)?,
        })
    }

    /// The four resources as a Kubernetes resource list in canonical form (all four keys, zeros
    /// included, so capacity and allocatable always list the same keys).
    pub fn to_resource_list(&self) -> BTreeMap<String, K8sQuantity> {
        BTreeMap::from([
            (CPU.to_string(), K8sQuantity(format_millis_cpu(self.cpu_millis))),
            (MEMORY.to_string(), K8sQuantity(format_bytes(self.memory_bytes))),
            (EPHEMERAL_STORAGE.to_string(), K8sQuantity(format_bytes(self.ephemeral_storage_bytes))),
            (PODS.to_string(), K8sQuantity(format_count(self.pods))),
        ])
    }

    fn zip(self, other: Resources, f: impl Fn(i64, i64) -> i64) -> Resources {
        Resources {
            cpu_millis: f(self.cpu_millis, other.cpu_millis),
            memory_bytes: f(self.memory_bytes, other.memory_bytes),
            ephemeral_storage_bytes: f(self.ephemeral_storage_bytes, other.ephemeral_storage_bytes),
            pods: f(self.pods, other.pods),
        }
    }
}

impl std::ops::Add for Resources {
    type Output = Resources;
    /// Saturating, like [`Resources::saturating_add`].
    fn add(self, other: Resources) -> Resources {
        self.saturating_add(other)
    }
}

impl std::ops::Sub for Resources {
    type Output = Resources;
    /// Saturating, like [`Resources::saturating_sub`].
    fn sub(self, other: Resources) -> Resources {
        self.saturating_sub(other)
    }
}

impl std::ops::AddAssign for Resources {
    fn add_assign(&mut self, other: Resources) {
        *self = self.saturating_add(other);
    }
}

impl std::ops::SubAssign for Resources {
    fn sub_assign(&mut self, other: Resources) {
        *self = self.saturating_sub(other);
    }
}

impl fmt::Display for Resources {
    /// `cpu=1500m memory=1536Mi ephemeral-storage=0 pods=110`, for logs and error messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{CPU}={} {MEMORY}={} {EPHEMERAL_STORAGE}={} {PODS}={}",
            format_millis_cpu(self.cpu_millis),
            format_bytes(self.memory_bytes),
            format_bytes(self.ephemeral_storage_bytes),
            format_count(self.pods)
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    #[test]
    fn price_ceilings_are_exact_decimal_eur() {
        for (text, micros) in [
            ("0.5", 500_000),
            ("12", 12_000_000),
            ("0.0611", 61_100),
            (" 0.000001 ", 1),
            ("0", 0),
            ("007.25", 7_250_000),
            (".5", 500_000),
            ("5.", 5_000_000),
        ] {
            assert_eq!(parse_price_micros(text), Ok(micros), "{text}");
        }
        for (text, want) in [
            ("-1", PriceError::Negative("-1".into())),
            ("-0.5", PriceError::Negative("-0.5".into())),
            ("0.1234567", PriceError::TooPrecise("0.1234567".into())),
            ("99999999999999999999", PriceError::TooLarge("99999999999999999999".into())),
            ("9300000000000", PriceError::TooLarge("9300000000000".into())),
        ] {
            assert_eq!(parse_price_micros(text), Err(want), "{text}");
        }
        for garbage in ["", ".", "1e3", "1E-2", "+1", "1.2.3", "0.5€", "1k", "abc", "0,5", "0x10"] {
            assert_eq!(parse_price_micros(garbage), Err(PriceError::NotDecimal(garbage.into())), "{garbage}");
        }
        let e = parse_price_micros("1e3").unwrap_err().to_string();
        assert!(e.contains("no exponent") && e.contains("at most 6 decimals") && e.contains("\"0.5\""), "{e}");
    }

    use super::*;
    use proptest::prelude::*;

    fn q(s: &str) -> Quantity {
        parse_quantity(s).unwrap()
    }

    #[test]
    fn parses_every_suffix_of_the_grammar() {
        let units = [
            ("0", 0),
            ("1", 1),
            ("+1", 1),
            ("-1", -1),
            ("1.", 1),
            (".5", 1),
            ("1.5", 2),
            ("000012", 12),
            ("1k", 1_000),
            ("1M", 1_000_000),
            ("1G", 1_000_000_000),
            ("1T", 1_000_000_000_000),
            ("1P", 1_000_000_000_000_000),
            ("1E", 1_000_000_000_000_000_000),
            ("1Ki", 1 << 10),
            ("1Mi", 1 << 20),
            ("1Gi", 1 << 30),
            ("1Ti", 1 << 40),
            ("1Pi", 1 << 50),
            ("1Ei", 1 << 60),
            ("1e3", 1_000),
            ("1E3", 1_000),
            ("1e+3", 1_000),
            ("1e003", 1_000),
            ("15e-1", 2),
            ("1.5Gi", 1_610_612_736),
            ("3911884Ki", 4_005_769_216),
            ("1.G", 1_000_000_000),
        ];
        for (text, expected) in units {
            assert_eq!(q(text).as_units(), expected, "{text}");
        }
        let millis = [
            ("100m", 100),
            ("1500m", 1500),
            ("1.5", 1500),
            ("2", 2000),
            ("1n", 1),
            ("1u", 1),
            ("1m", 1),
            ("0.1m", 1),
            ("1e-3", 1),
            ("1e-4", 1),
            ("-1n", -1),
            ("-1.5m", -2),
            ("1Ki", 1_024_000),
            ("0.5Ki", 512_000),
        ];
        for (text, expected) in millis {
            assert_eq!(q(text).as_millis(), expected, "{text}");
        }
    }

    #[test]
    fn rounds_up_away_from_zero_like_kubernetes() {
        assert_eq!(q("100m").as_units(), 1);
        assert_eq!(q("0.5").as_units(), 1);
        assert_eq!(q("-0.5").as_units(), -1);
        assert_eq!(q("0.1Ki").as_units(), 103); // 102.4 bytes
        assert_eq!(q("1001m").as_units(), 2);
        assert_eq!(q("1000m").as_units(), 1);
        assert_eq!(q("1e-1000").as_units(), 1);
        assert_eq!(q("1e-1000").as_millis(), 1);
        assert_eq!(q("0e1000").as_units(), 0);
        assert_eq!(q("-0").as_units(), 0);
        assert!(q("0.000").is_zero());
        assert!(q("-1m").is_negative());
    }

    #[test]
    fn saturates_at_the_i64_bounds() {
        assert_eq!(q("1e30").as_units(), i64::MAX);
        assert_eq!(q("-1e30").as_units(), i64::MIN);
        assert_eq!(q("1e1000").as_millis(), i64::MAX);
        assert_eq!(q("8Ei").as_units(), i64::MAX);
        assert_eq!(q("-8Ei").as_units(), i64::MIN);
        assert_eq!(q("9223372036854775807").as_units(), i64::MAX);
        assert_eq!(q("9223372036854775806").as_units(), i64::MAX - 1);
        assert_eq!(q("9223372036854775807").as_millis(), i64::MAX);
        assert_eq!(q("9223372036854775.807").as_millis(), i64::MAX);
        assert_eq!(q("9223372036854775.806").as_millis(), i64::MAX - 1);
        assert_eq!(q("999999999999Ei").as_units(), i64::MAX);
    }

    #[test]
    fn stays_exact_beyond_38_significant_digits() {
        let long_one = format!("1.{}1", "0".repeat(40));
        assert_eq!(q(&long_one).as_units(), 2);
        assert_eq!(q(&long_one).as_millis(), 1001);
        let trailing = format!("1.5{}", "0".repeat(50));
        assert_eq!(q(&trailing), q("1.5"));
        let leading = format!("{}1.5", "0".repeat(50));
        assert_eq!(q(&leading), q("1.5"));
        let tiny = format!("0.{}1", "0".repeat(50));
        assert_eq!(q(&tiny).as_millis(), 1);
        assert_eq!(q(&tiny).as_units(), 1);
        assert_eq!(q(&format!("1{}", "0".repeat(50))).as_units(), i64::MAX);
        // Binary suffixes multiply the full digit string before truncation (reference: Python Fraction).
        let ones = format!("0.{}Ki", "1".repeat(40));
        assert_eq!(q(&ones).as_units(), 114);
        assert_eq!(q(&ones).as_millis(), 113_778);
        let small_ei = format!("0.{}{}Ei", "0".repeat(15), "1".repeat(45));
        assert_eq!(q(&small_ei).as_units(), 129);
        assert_eq!(q(&small_ei).as_millis(), 128_103);
        assert_eq!(q(&format!("9.{}Ei", "9".repeat(44))).as_units(), i64::MAX);
    }

    #[test]
    fn rejects_what_the_grammar_rejects_and_says_how_to_fix_it() {
        assert_eq!(parse_quantity(""), Err(QuantityError::Empty));
        for text in ["-", "+", ".", "Gi", "-.", "+Ki", "--1", " 1"] {
            assert!(matches!(parse_quantity(text), Err(QuantityError::NoDigits { .. })), "{text}");
        }
        for text in [
            "1KB", "1K", "1ki", "1 Gi", "1 ", "1e", "1e+", "1e1.5", "1ee3", "1e3e3", "1Mi3", "1.2.3", "1,5", "0x10",
            "1m1", "1ei",
        ] {
            assert!(
                matches!(parse_quantity(text), Err(QuantityError::UnknownSuffix { .. })),
                "{text}: {:?}",
                parse_quantity(text)
            );
        }
        assert!(matches!(parse_quantity("1e99999999999"), Err(QuantityError::ExponentOutOfRange { .. })));
        let message = parse_quantity("12XB").unwrap_err().to_string();
        assert!(message.contains("\"12XB\""), "{message}");
        assert!(message.contains("\"XB\""), "{message}");
        assert!(message.contains("e.g. \"500m\""), "{message}");
        assert!(message.contains("Ki Mi Gi"), "{message}");
        let message = parse_quantity("").unwrap_err().to_string();
        assert!(message.contains("e.g."), "{message}");
        assert_eq!("1Gi".parse::<Quantity>().unwrap().as_units(), 1 << 30);
    }

    #[test]
    fn formats_like_kubernetes() {
        let cpu = [
            (1500, "1500m"),
            (2000, "2"),
            (0, "0"),
            (100, "100m"),
            (1, "1m"),
            (10, "10m"),
            (1010, "1010m"),
            (2_000_000, "2k"),
            (-1500, "-1500m"),
            (-2000, "-2"),
        ];
        for (millis, text) in cpu {
            assert_eq!(format_millis_cpu(millis), text);
        }
        let bytes = [
            (1_610_612_736, "1536Mi"),
            (4_005_769_216, "3911884Ki"),
            (100, "100"),
            (0, "0"),
            (1000, "1k"),
            (1023, "1023"),
            (1024, "1Ki"),
            (1500, "1500"),
            (1 << 30, "1Gi"),
            (1 << 60, "1Ei"),
            (40_971_488 * 1024, "40971488Ki"),
            (36_874_339 * 1024, "36874339Ki"),
            (-1024, "-1Ki"),
            (-100, "-100"),
            (i64::MAX, "9223372036854775807"),
            (i64::MIN, "-8Ei"),
        ];
        for (value, text) in bytes {
            assert_eq!(format_bytes(value), text, "{value}");
        }
        assert_eq!(format_count(110), "110");
        assert_eq!(format_count(1000), "1k");
        assert_eq!(format_count(0), "0");
        assert_eq!(format_count(i64::MAX), "9223372036854775807");
    }

    fn list(entries: &[(&str, &str)]) -> BTreeMap<String, K8sQuantity> {
        entries.iter().map(|(k, v)| (k.to_string(), K8sQuantity(v.to_string()))).collect()
    }

    #[test]
    fn reads_and_writes_resource_lists() {
        let read = Resources::from_resource_list(&list(&[
            ("cpu", "1500m"),
            ("memory", "1536Mi"),
            ("ephemeral-storage", "40971488Ki"),
            ("pods", "110"),
            ("nvidia.com/gpu", "not even a quantity"),
            ("hugepages-2Mi", "0"),
        ]))
        .unwrap();
        let expected = Resources {
            cpu_millis: 1500,
            memory_bytes: 1_610_612_736,
            ephemeral_storage_bytes: 40_971_488 * 1024,
            pods: 110,
        };
        assert_eq!(read, expected);
        assert_eq!(Resources::from_resource_list(&expected.to_resource_list()).unwrap(), expected);
        assert_eq!(
            expected.to_resource_list(),
            list(&[("cpu", "1500m"), ("memory", "1536Mi"), ("ephemeral-storage", "40971488Ki"), ("pods", "110"),])
        );
        assert_eq!(Resources::from_resource_list(&BTreeMap::new()).unwrap(), Resources::ZERO);
        // The API server's JSON decoding trims; so do we.
        let trimmed = Resources::from_resource_list(&list(&[("cpu", " 2 ")])).unwrap();
        assert_eq!(trimmed.cpu_millis, 2000);
        let error = Resources::from_resource_list(&list(&[("cpu", "1"), ("memory", "12XB")])).unwrap_err();
        assert!(matches!(&error, QuantityError::Resource { key, .. } if key == "memory"));
        let message = error.to_string();
        assert!(message.starts_with("resource \"memory\": "), "{message}");
        assert!(message.contains("12XB"), "{message}");
        assert_eq!(expected.to_string(), "cpu=1500m memory=1536Mi ephemeral-storage=40971488Ki pods=110");
    }

    #[test]
    fn resource_arithmetic_saturates_and_compares_per_resource() {
        let a = Resources { cpu_millis: 1000, memory_bytes: 10, ephemeral_storage_bytes: 0, pods: 1 };
        let b = Resources { cpu_millis: 500, memory_bytes: 20, ephemeral_storage_bytes: 5, pods: 1 };
        assert_eq!(a + b, Resources { cpu_millis: 1500, memory_bytes: 30, ephemeral_storage_bytes: 5, pods: 2 });
        assert_eq!(a - b, Resources { cpu_millis: 500, memory_bytes: -10, ephemeral_storage_bytes: -5, pods: 0 });
        assert!((a - b).any_negative());
        assert_eq!((a - b).floored_at_zero(), Resources { cpu_millis: 500, ..Resources::ZERO });
        let max = Resources {
            cpu_millis: i64::MAX,
            memory_bytes: i64::MAX,
            ephemeral_storage_bytes: i64::MAX,
            pods: i64::MAX,
        };
        assert_eq!(max + a, max);
        let mut c = a;
        c += b;
        c -= b;
        assert_eq!(c, a);
        assert!(a.fits(&a));
        assert!(!a.fits(&b)); // cpu 1000 > 500
        assert!(!b.fits(&a)); // memory 20 > 10
        assert!(Resources::ZERO.fits(&a));
        assert!(Resources::default().is_zero());
    }

    proptest! {
        #[test]
        fn canonical_text_round_trips(value in any::<i64>()) {
            prop_assert_eq!(q(&format_millis_cpu(value)).as_millis(), value);
            prop_assert_eq!(q(&format_bytes(value)).as_units(), value);
            prop_assert_eq!(q(&format_count(value)).as_units(), value);
        }

        #[test]
        fn never_panics(text in "[-+0-9.eEKMGTPEinumk ]{0,24}") {
            if let Ok(parsed) = parse_quantity(&text) {
                let _ = (parsed.as_millis(), parsed.as_units());
            }
        }

        /// Against an i128 rational reference wherever that reference does not overflow.
        #[test]
        fn matches_a_rational_reference(
            negative in any::<bool>(),
            integer in 0u64..10_000_000,
            fraction in "[0-9]{0,7}",
            suffix in prop::sample::select(vec![
                ("", 0i32, 0u32), ("n", -9, 0), ("u", -6, 0), ("m", -3, 0), ("k", 3, 0), ("M", 6, 0),
                ("G", 9, 0), ("T", 12, 0), ("P", 15, 0), ("E", 18, 0), ("Ki", 0, 10), ("Mi", 0, 20),
                ("Gi", 0, 30), ("Ti", 0, 40), ("Pi", 0, 50), ("Ei", 0, 60), ("e-7", -7, 0), ("e2", 2, 0),
            ]),
        ) {
            let (suffix, e10, e2) = suffix;
            let sign = if negative { "-" } else { "" };
            let text = if fraction.is_empty() {
                format!("{sign}{integer}{suffix}")
            } else {
                format!("{sign}{integer}.{fraction}{suffix}")
            };
            let parsed = q(&text);
            let digits: i128 = format!("{integer}{fraction}").parse().unwrap();
            let f = i32::try_from(fraction.len()).unwrap();
            for (unit, got) in [(-3, parsed.as_millis()), (0, parsed.as_units())] {
                // value / 10^unit = digits × 2^e2 × 10^(e10 − f − unit)
                let shift = e10 - f - unit;
                let numerator = digits
                    .checked_mul(1i128 << e2)
                    .and_then(|n| n.checked_mul(10i128.checked_pow(shift.max(0).unsigned_abs())?));
                let denominator = 10i128.checked_pow((-shift).max(0).unsigned_abs());
                let (Some(n), Some(d)) = (numerator, denominator) else { continue };
                let magnitude = n / d + i128::from(n % d != 0);
                let expected = if negative { -magnitude } else { magnitude };
                let expected = i64::try_from(expected)
                    .unwrap_or(if negative { i64::MIN } else { i64::MAX });
                prop_assert_eq!(got, expected, "{} at 10^{}", text, unit);
            }
        }
    }
}
