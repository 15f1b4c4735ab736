//! Resource requests of a pod, with Kubernetes' rules (karpenter-semantics §3.8): init containers,
//! sidecars (init containers with `restartPolicy: Always`), pod-level requests, in-place resize,
//! overhead, limits standing in for missing requests, plus `pods: 1`.
//!
//! Owns the arithmetic over one PodSpec. Must not decide where a pod goes.

use std::collections::BTreeMap;

use crds::quantity::{CPU, EPHEMERAL_STORAGE, MEMORY, PODS, QuantityError, Resources, parse_quantity};
use k8s_openapi::api::core::v1::{Container, PodSpec, PodStatus, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// A quantity of a container that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{container}: {field}.{resource}: {source}")]
pub struct RequestError {
    /// `containers[app]`, `initContainers[setup]`, `overhead`, `resources` (pod level).
    pub container: String,
    /// `requests` or `limits`.
    pub field: &'static str,
    /// Resource name.
    pub resource: String,
    /// What is wrong.
    pub source: QuantityError,
}

/// Per-resource amounts: millicores for `cpu`, units (bytes, counts) for everything else.
type Amounts = BTreeMap<String, i64>;

fn read(
    list: Option<&BTreeMap<String, Quantity>>,
    container: &str,
    field: &'static str,
) -> Result<Amounts, RequestError> {
    let mut out = Amounts::new();
    for (name, q) in list.into_iter().flatten() {
        let parsed = parse_quantity(q.0.trim()).map_err(|source| RequestError {
            container: container.to_string(),
            field,
            resource: name.clone(),
            source,
        })?;
        out.insert(name.clone(), if name == CPU { parsed.as_millis() } else { parsed.as_units() });
    }
    Ok(out)
}

/// Requests of one resource requirement block, limits standing in for missing requests.
fn effective(r: Option<&ResourceRequirements>, container: &str) -> Result<Amounts, RequestError> {
    let mut requests = read(r.and_then(|r| r.requests.as_ref()), container, "requests")?;
    for (name, amount) in read(r.and_then(|r| r.limits.as_ref()), container, "limits")? {
        requests.entry(name).or_insert(amount);
    }
    Ok(requests)
}

fn add(into: &mut Amounts, other: &Amounts) {
    for (k, v) in other {
        let e = into.entry(k.clone()).or_insert(0);
        *e = e.saturating_add(*v);
    }
}

fn max_into(into: &mut Amounts, other: &Amounts) {
    for (k, v) in other {
        let e = into.entry(k.clone()).or_insert(0);
        *e = (*e).max(*v);
    }
}

fn container_requests(c: &Container, kind: &str, status: Option<&PodStatus>) -> Result<Amounts, RequestError> {
    let label = format!("{kind}[{}]", c.name);
    let mut amounts = effective(c.resources.as_ref(), &label)?;
    // In-place resize: what the kubelet allocated counts when it is more than the spec.
    let statuses = status.and_then(|s| if kind == "containers" { s.container_statuses.as_ref() } else { None });
    if let Some(cs) = statuses.into_iter().flatten().find(|cs| cs.name == c.name) {
        let allocated = read(cs.allocated_resources.as_ref(), &label, "allocatedResources")?;
        max_into(&mut amounts, &allocated);
    }
    Ok(amounts)
}

/// Effective requests of a pod: the four node resources, and the extended resources it asks for
/// (non-zero only).
pub fn pod_requests(
    spec: &PodSpec,
    status: Option<&PodStatus>,
) -> Result<(Resources, BTreeMap<String, i64>), RequestError> {
    let mut regular = Amounts::new();
    for c in &spec.containers {
        add(&mut regular, &container_requests(c, "containers", status)?);
    }
    let mut sidecars = Amounts::new();
    let mut init_max = Amounts::new();
    for c in spec.init_containers.iter().flatten() {
        let req = container_requests(c, "initContainers", status)?;
        if c.restart_policy.as_deref() == Some("Always") {
            add(&mut sidecars, &req);
            max_into(&mut init_max, &sidecars);
        } else {
            let mut with_sidecars = req;
            add(&mut with_sidecars, &sidecars);
            max_into(&mut init_max, &with_sidecars);
        }
    }
    add(&mut regular, &sidecars);
    let mut total = regular;
    max_into(&mut total, &init_max);
    // Pod-level requests replace the container aggregate for the resources they name.
    if let Some(pod_level) = spec.resources.as_ref() {
        for (k, v) in effective(Some(pod_level), "resources")? {
            total.insert(k, v);
        }
    }
    add(&mut total, &read(spec.overhead.as_ref(), "overhead", "overhead")?);
    let get = |k: &str| total.get(k).copied().unwrap_or(0);
    let resources = Resources {
        cpu_millis: get(CPU),
        memory_bytes: get(MEMORY),
        ephemeral_storage_bytes: get(EPHEMERAL_STORAGE),
        pods: 1,
    };
    let extended = total
        .iter()
        .filter(|(k, v)| ![CPU, MEMORY, EPHEMERAL_STORAGE, PODS].contains(&k.as_str()) && **v != 0)
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    Ok((resources, extended))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn rr(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Option<ResourceRequirements> {
        let map = |l: &[(&str, &str)]| {
            if l.is_empty() {
                None
            } else {
                Some(l.iter().map(|(k, v)| (k.to_string(), Quantity(v.to_string()))).collect())
            }
        };
        Some(ResourceRequirements { requests: map(requests), limits: map(limits), ..Default::default() })
    }

    fn container(name: &str, requests: &[(&str, &str)]) -> Container {
        Container { name: name.into(), resources: rr(requests, &[]), ..Default::default() }
    }

    fn sidecar(name: &str, requests: &[(&str, &str)]) -> Container {
        Container { restart_policy: Some("Always".into()), ..container(name, requests) }
    }

    #[test]
    fn init_container_max_wins_over_the_sum() {
        // #72: init 6 CPU, app 1 CPU → 6 CPU.
        let spec = PodSpec {
            containers: vec![container("app", &[("cpu", "1")])],
            init_containers: Some(vec![container("init", &[("cpu", "6")])]),
            ..Default::default()
        };
        let (r, _) = pod_requests(&spec, None).unwrap();
        assert_eq!(r.cpu_millis, 6000);
        assert_eq!(r.pods, 1);
    }

    #[test]
    fn sidecars_declared_before_an_init_container_add_to_it() {
        // #73: 1-CPU sidecar, then a 4-CPU init container, and a 1-CPU app → max(1+1, 4+1) = 5.
        let spec = PodSpec {
            containers: vec![container("app", &[("cpu", "1")])],
            init_containers: Some(vec![sidecar("proxy", &[("cpu", "1")]), container("init", &[("cpu", "4")])]),
            ..Default::default()
        };
        assert_eq!(pod_requests(&spec, None).unwrap().0.cpu_millis, 5000);
    }

    #[test]
    fn overhead_is_added() {
        // #74: containers 3.8 CPU + overhead 250m.
        let spec = PodSpec {
            containers: vec![container("a", &[("cpu", "1800m")]), container("b", &[("cpu", "2")])],
            overhead: Some([("cpu".to_string(), Quantity("250m".into()))].into()),
            ..Default::default()
        };
        assert_eq!(pod_requests(&spec, None).unwrap().0.cpu_millis, 4050);
    }

    #[test]
    fn limits_stand_in_for_missing_requests() {
        // #75.
        let spec = PodSpec {
            containers: vec![Container { name: "a".into(), resources: rr(&[], &[("cpu", "2")]), ..Default::default() }],
            ..Default::default()
        };
        assert_eq!(pod_requests(&spec, None).unwrap().0.cpu_millis, 2000);
    }

    #[test]
    fn pod_level_requests_replace_the_container_sum() {
        let spec = PodSpec {
            containers: vec![container("a", &[("cpu", "1"), ("memory", "1Gi")])],
            resources: rr(&[("cpu", "3")], &[]),
            ..Default::default()
        };
        let (r, _) = pod_requests(&spec, None).unwrap();
        assert_eq!(r.cpu_millis, 3000);
        assert_eq!(r.memory_bytes, 1 << 30);
    }

    #[test]
    fn extended_resources_and_errors_name_the_container() {
        let spec = PodSpec {
            containers: vec![container("gpu", &[("nvidia.com/gpu", "1")]), container("bad", &[("memory", "1GB")])],
            ..Default::default()
        };
        let err = pod_requests(&spec, None).unwrap_err();
        assert!(err.to_string().contains("containers[bad]: requests.memory"), "{err}");
        let spec = PodSpec { containers: vec![container("gpu", &[("nvidia.com/gpu", "1")])], ..Default::default() };
        assert_eq!(pod_requests(&spec, None).unwrap().1.get("nvidia.com/gpu"), Some(&1));
    }
}
