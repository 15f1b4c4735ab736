//! `sim::cke`: the simulated Clever Kubernetes Engine, as ordinary Kubernetes API clients, so it
//! plays CKE against the in-process emulator or any real API server (`karpenter-hub sim-cke`).
//!
//! Owns the CKE side of a workload cluster (clever-cloud.md §1, testing.md §2):
//! - the NodeGroup controller ([`nodegroup`]): finalizer, verdict (accepted `Ready=True`/`Synced`,
//!   quota-rejected with CKE's message, unknown flavor), Nodes `<group>-node<i>` with CKE's labels
//!   and the flavor's capacity after a delay, asynchronous deletion behind the finalizer, vanishing;
//! - the organisation quota, control plane included, optionally shared by several simulated
//!   clusters of one organisation ([`quota`], [`OrganizationQuota`]);
//! - a kubelet stand-in for the Nodes it made ([`kubelet`]): Ready, Running pods, confirmed deletions;
//! - a binder ([`binder`], [`fit`]): binds pending pods that fit, marks the rest `Unschedulable`
//!   with a kube-scheduler-like message.
//!
//! Every decision is a pure planner over what the API shows plus a little memory; [`runner`]
//! watches (reflectors), runs the planners when something changes or a delay expires (all time
//! through [`crate::clock::Clock`], so a manual clock makes delays free), and writes the results.
//! Randomness (delays within ranges, vanishing, ids, IPs) comes from [`SimCkeConfig::seed`], drawn
//! per object and purpose so a run does not depend on the order events arrive in.
//!
//! Must not: use anything but the public Kubernetes API (no emulator internals), or depend on the
//! hub's crates beyond `crds` (the hub is what it tests).

pub mod binder;
pub mod config;
pub mod fit;
pub mod kubelet;
pub mod nodegroup;
pub mod objects;
pub mod quota;
pub mod runner;

use std::future::Future;

pub use config::{ControlPlane, DelayRange, GroupSelector, SimCkeConfig, VanishRule};
pub use quota::{OrgMember, OrgStats, OrganizationQuota, QuotaConfig, SimFlavor, Usage};
pub use runner::{SimCke, SimCkeHandle};

/// Errors of the simulated CKE (only start-up can fail; later API errors are logged and retried).
#[derive(Debug, thiserror::Error)]
pub enum CkeError {
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// An object the simulator built does not decode as its type (a bug).
    #[error("building {what}: {source}")]
    Build {
        /// What was being built.
        what: String,
        /// Cause.
        #[source]
        source: serde_json::Error,
    },
    /// The NodeGroup API is not served and could not be installed.
    #[error("the NodeGroup API (nodegroups.api.clever-cloud.com/v1) is not served after {0:?}")]
    CrdNotServed(std::time::Duration),
    /// A task of the simulator panicked or was aborted.
    #[error("simulated CKE task failed: {0}")]
    Task(String),
}

/// Runs a simulated CKE against `client` until `shutdown` completes, on the wall clock: the entry
/// point of `karpenter-hub sim-cke --kubeconfig F`.
///
/// Installs the stand-in NodeGroup CRD when none is served (`config.install_crd`), creates the
/// control-plane Nodes (`config.control_plane`), then runs the NodeGroup controller, the kubelet
/// stand-in and the binder as configured. Errors only if start-up fails; API errors afterwards are
/// logged and retried.
pub async fn run(
    client: kube::Client,
    config: SimCkeConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), CkeError> {
    SimCke::new(client, config).run(shutdown).await
}
