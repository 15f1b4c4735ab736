//! `sim::cke::quota`: the organisation quota as CKE enforces it (clever-cloud.md §1.5, §1.7).
//!
//! Owns: the sizing CKE bills against the quota (vCPU and nominal GB per flavor), the accounting
//! (control plane included) and the verdict with CKE's message shape. Must not do I/O or read a clock.
//!
//! Observed message (RAM): `Quota exceeded: RAM max: limit = 40.0 GB | actual = 48.0 GB`, where
//! `actual` is the usage the new group would bring. The vCPU form is not observed; this simulator
//! writes `Quota exceeded: CPU max: limit = 40 | actual = 46` (inferred). RAM is judged first.

use crds::catalog::BuiltinFlavor;

/// The kernel-visible KiB per nominal GB measured on `M` (15988992 / 16): a flavor without a
/// built-in sizing is billed `round(memoryKi / this)` GB.
const KI_PER_NOMINAL_GB: i64 = 999_312;

/// A flavor as the simulated platform knows it: scheduling sizing and quota sizing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimFlavor {
    /// Name as used in `spec.flavor`.
    pub name: String,
    /// vCPUs (node capacity and quota).
    pub cpu: i64,
    /// Kernel-visible memory capacity, KiB (node capacity).
    pub memory_ki: i64,
    /// Nominal GB (quota).
    pub nominal_gb: i64,
}

impl SimFlavor {
    /// A flavor with the quota size derived from its memory (for flavors outside the built-in table).
    pub fn new(name: impl Into<String>, cpu: i64, memory_ki: i64) -> SimFlavor {
        let nominal_gb = (memory_ki + KI_PER_NOMINAL_GB / 2) / KI_PER_NOMINAL_GB;
        SimFlavor { name: name.into(), cpu, memory_ki, nominal_gb }
    }

    /// The built-in flavors (`2XS` … `XL`).
    pub fn builtins() -> Vec<SimFlavor> {
        crds::catalog::BUILTIN_FLAVORS.iter().map(SimFlavor::from).collect()
    }

    /// What one node of this flavor counts against the quota.
    pub fn usage(&self) -> Usage {
        Usage { vcpu: self.cpu, ram_gb: self.nominal_gb }
    }
}

impl From<&BuiltinFlavor> for SimFlavor {
    fn from(b: &BuiltinFlavor) -> SimFlavor {
        SimFlavor { name: b.name.to_string(), cpu: b.cpu, memory_ki: b.memory_ki, nominal_gb: b.nominal_gb }
    }
}

/// Quota usage or limit: vCPUs and nominal GB of RAM.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// vCPUs.
    pub vcpu: i64,
    /// Nominal GB (10^9 bytes).
    pub ram_gb: i64,
}

impl Usage {
    /// `self + other × count`.
    #[must_use]
    pub fn plus(self, other: Usage, count: i64) -> Usage {
        Usage {
            vcpu: self.vcpu.saturating_add(other.vcpu.saturating_mul(count)),
            ram_gb: self.ram_gb.saturating_add(other.ram_gb.saturating_mul(count)),
        }
    }
}

/// The organisation quota: the default is 40 vCPU / 40 GB, and two `S` control-plane nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaConfig {
    /// Limit of the organisation.
    pub limit: Usage,
    /// What the control plane uses (counted against the limit).
    pub control_plane: Usage,
}

impl Default for QuotaConfig {
    fn default() -> QuotaConfig {
        QuotaConfig { limit: Usage { vcpu: 40, ram_gb: 40 }, control_plane: Usage { vcpu: 16, ram_gb: 24 } }
    }
}

/// CKE's verdict on a new group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuotaVerdict {
    /// Fits: the usage after acceptance.
    Fits(Usage),
    /// Refused, with CKE's message.
    Exceeded(String),
}

/// Judges a group that would add `adding` to `workers` (the accepted worker usage, and with
/// concurrent judging the other in-flight groups).
pub fn judge(quota: &QuotaConfig, workers: Usage, adding: Usage) -> QuotaVerdict {
    let actual = quota.control_plane.plus(workers, 1).plus(adding, 1);
    if actual.ram_gb > quota.limit.ram_gb {
        return QuotaVerdict::Exceeded(format!(
            "Quota exceeded: RAM max: limit = {:.1} GB | actual = {:.1} GB",
            quota.limit.ram_gb as f64, actual.ram_gb as f64
        ));
    }
    if actual.vcpu > quota.limit.vcpu {
        return QuotaVerdict::Exceeded(format!(
            "Quota exceeded: CPU max: limit = {} | actual = {}",
            quota.limit.vcpu, actual.vcpu
        ));
    }
    QuotaVerdict::Fits(actual)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flavor(name: &str) -> SimFlavor {
        SimFlavor::builtins().into_iter().find(|f| f.name == name).unwrap_or_else(|| SimFlavor::new(name, 0, 0))
    }

    #[test]
    fn default_quota_refuses_large_flavors() {
        let q = QuotaConfig::default();
        // 24 GB of control plane + L (24 GB) = 48 GB: exactly the observed message.
        assert_eq!(
            judge(&q, Usage::default(), flavor("L").usage()),
            QuotaVerdict::Exceeded("Quota exceeded: RAM max: limit = 40.0 GB | actual = 48.0 GB".to_string())
        );
        assert!(matches!(judge(&q, Usage::default(), flavor("XL").usage()), QuotaVerdict::Exceeded(_)));
        // M (16 GB) only when nothing else runs.
        assert_eq!(
            judge(&q, Usage::default(), flavor("M").usage()),
            QuotaVerdict::Fits(Usage { vcpu: 26, ram_gb: 40 })
        );
        assert!(matches!(judge(&q, flavor("2XS").usage(), flavor("M").usage()), QuotaVerdict::Exceeded(_)));
    }

    #[test]
    fn exact_limit_fits_and_cpu_form() {
        let q = QuotaConfig { limit: Usage { vcpu: 20, ram_gb: 100 }, control_plane: Usage { vcpu: 16, ram_gb: 24 } };
        assert!(matches!(judge(&q, Usage::default(), flavor("2XS").usage()), QuotaVerdict::Fits(_)));
        assert_eq!(
            judge(&q, Usage::default(), flavor("XS").usage()),
            QuotaVerdict::Exceeded("Quota exceeded: CPU max: limit = 20 | actual = 22".to_string())
        );
    }

    #[test]
    fn nominal_gb_of_custom_flavors() {
        for b in SimFlavor::builtins() {
            assert_eq!(SimFlavor::new(&b.name, b.cpu, b.memory_ki).nominal_gb, b.nominal_gb, "{}", b.name);
        }
        assert_eq!(SimFlavor::new("CUSTOM", 2, 2_097_152).nominal_gb, 2);
    }
}
