//! Each registration Secret's kubeconfig, hardened once per Secret version (its UID and
//! resourceVersion): the registry's placement, the connection task and its re-read after a 401
//! share the result, and a reconnect does not parse again.
//!
//! Owns: the one parse of a version, and the latest version of each registration. Parses run one
//! at a time (under the lock), so however many Secrets arrive together, the memory of one parse is
//! what the hub spends at once. Must not: keep the kubeconfig's bytes (only the hardened result,
//! whose credentials kube holds in `secrecy` wrappers).

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, PoisonError},
};

use k8s_openapi::api::core::v1::Secret;

use super::{ClusterKey, KUBECONFIG_KEY};
use crate::infra::kubeconfig::{self, HardenedKubeconfig, KubeconfigRejected, Policy};

/// A kubeconfig as hardened: usable, or refused with the reason.
pub(crate) type Parsed = Arc<Result<HardenedKubeconfig, KubeconfigRejected>>;

/// The latest version parsed of each registration.
#[derive(Default)]
pub(crate) struct Parses {
    latest: Mutex<BTreeMap<ClusterKey, Version>>,
}

struct Version {
    uid: String,
    resource_version: String,
    /// `None`: the Secret has no key `value`.
    parsed: Option<Parsed>,
}

impl Parses {
    /// The kubeconfig of `secret` (registration `key`) hardened under `policy`: parsed now if this
    /// version was not, else the earlier result (the same `Arc`).
    pub(crate) fn get(&self, key: &ClusterKey, secret: &Secret, policy: Policy) -> Option<Parsed> {
        let uid = secret.metadata.uid.clone().unwrap_or_default();
        let resource_version = secret.metadata.resource_version.clone().unwrap_or_default();
        let mut latest = self.latest.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(v) = latest.get(key)
            && !resource_version.is_empty()
            && v.uid == uid
            && v.resource_version == resource_version
        {
            return v.parsed.clone();
        }
        let parsed = secret
            .data
            .as_ref()
            .and_then(|d| d.get(KUBECONFIG_KEY))
            .map(|bytes| Arc::new(kubeconfig::harden(&bytes.0, policy)));
        latest.insert(key.clone(), Version { uid, resource_version, parsed: parsed.clone() });
        parsed
    }

    /// `key` is no longer registered.
    pub(crate) fn forget(&self, key: &ClusterKey) {
        self.latest.lock().unwrap_or_else(PoisonError::into_inner).remove(key);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn secret(uid: &str, version: &str, value: &str) -> Secret {
        Secret {
            metadata: kube::api::ObjectMeta {
                uid: Some(uid.into()),
                resource_version: Some(version.into()),
                ..Default::default()
            },
            data: Some(
                [(KUBECONFIG_KEY.to_string(), k8s_openapi::ByteString(value.as_bytes().to_vec()))]
                    .into_iter()
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn a_secret_version_is_parsed_once_and_a_new_version_or_secret_again() {
        let parses = Parses::default();
        let key = ClusterKey::new("team-a", "prod");
        let first = parses.get(&key, &secret("u1", "10", "not: [yaml"), Policy::default()).unwrap();
        assert!(first.is_err());
        let again = parses.get(&key, &secret("u1", "10", "not: [yaml"), Policy::default()).unwrap();
        assert!(Arc::ptr_eq(&first, &again), "the same version is not parsed twice");
        let newer = parses.get(&key, &secret("u1", "11", "not: [yaml"), Policy::default()).unwrap();
        assert!(!Arc::ptr_eq(&first, &newer));
        // The Secret deleted and created again (a new UID) may reuse nothing.
        let recreated = parses.get(&key, &secret("u2", "11", "not: [yaml"), Policy::default()).unwrap();
        assert!(!Arc::ptr_eq(&newer, &recreated));
        parses.forget(&key);
        let after = parses.get(&key, &secret("u2", "11", "not: [yaml"), Policy::default()).unwrap();
        assert!(!Arc::ptr_eq(&recreated, &after));
    }
}
