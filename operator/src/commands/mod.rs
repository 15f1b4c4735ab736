//! The subcommands of `karpenter-hub`; each owns its flags and its output, and nothing else.

pub mod fleet;
pub mod plan;
pub mod register_cluster;
pub mod run;
// The only command (with `sim-cke` in main.rs) that needs the emulators: feature `sandbox`.
#[cfg(feature = "sandbox")]
pub mod sandbox;

/// `--min-values-policy` of `run` and `plan` (upstream's `MIN_VALUES_POLICY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MinValuesArg {
    /// A new node whose flavor options would fall below a requirement's `minValues` is not made:
    /// its pods wait.
    Strict,
    /// The `minValues` is lowered to the values left, and the NodeClaim says so
    /// (`karpenter.sh/nodeclaim-min-values-relaxed: "true"`).
    BestEffort,
}

impl From<MinValuesArg> for scheduling::model::MinValuesPolicy {
    fn from(arg: MinValuesArg) -> Self {
        match arg {
            MinValuesArg::Strict => scheduling::model::MinValuesPolicy::Strict,
            MinValuesArg::BestEffort => scheduling::model::MinValuesPolicy::BestEffort,
        }
    }
}
