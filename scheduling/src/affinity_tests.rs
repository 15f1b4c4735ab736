//! Required pod affinity to a pod's own label (karpenter-semantics §3.11, issue 13 item 11): a pod
//! that selects itself bootstraps a new domain when no matching pod is in a domain it allows, and
//! otherwise joins the matching pods' domains.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::model::{Operator, Pod};
use crate::solve;
use crate::testkit::*;
use crds::labels::{HOSTNAME, ZONE};

fn zone_pool() -> crate::model::Pool {
    let mut p = pool("default");
    p.instance_types = flavors_3_zones();
    p
}

/// A pod labelled `app=web` with required affinity to `app=web` on `key`, limited to `zones`
/// (none: any zone) by its node affinity.
fn web(name: &str, key: &str, zones: &[&str]) -> Pod {
    let mut p = with(pod(name, 100, 0), |c| {
        c.pod_affinity = vec![term(key, &[("app", "web")])];
        if !zones.is_empty() {
            c.required_terms = vec![vec![req(ZONE, Operator::In, zones)]];
        }
    });
    p.labels = labels_of(&[("app", "web")]);
    p
}

/// A pod with the same affinity but another label: it does not select itself.
fn client(name: &str, key: &str, zones: &[&str]) -> Pod {
    let mut p = web(name, key, zones);
    p.labels = labels_of(&[("app", "client")]);
    p
}

struct Case {
    name: &'static str,
    pods: Vec<Pod>,
    /// Zone of each pod's claim (by pod name); `None`: left pending.
    want: Vec<(&'static str, Option<&'static str>)>,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "the issue: two self-affine pods confined to different zones both schedule",
            pods: vec![web("in-a", ZONE, &["a"]), web("in-b", ZONE, &["b"])],
            want: vec![("in-a", Some("a")), ("in-b", Some("b"))],
        },
        Case {
            // As upstream: the pod's zone requirement says nothing of hostnames, so the first pod's
            // node is a domain it allows; it must join it, and that node is in the other zone.
            name: "on hostname the first pod's node is allowed to the second: no bootstrap, pending",
            pods: vec![web("in-a", HOSTNAME, &["a"]), web("in-b", HOSTNAME, &["b"])],
            want: vec![("in-a", Some("a")), ("in-b", None)],
        },
        Case {
            name: "a pod allowing the matching pods' zone joins it instead of bootstrapping",
            pods: vec![web("in-a", ZONE, &["a"]), web("a-or-b", ZONE, &["a", "b"])],
            want: vec![("in-a", Some("a")), ("a-or-b", Some("a"))],
        },
        Case {
            name: "a pod free of zone requirements, queued second, joins the first pod's zone",
            pods: vec![web("in-b", ZONE, &["b"]), web("later", ZONE, &[])],
            want: vec![("in-b", Some("b")), ("later", Some("b"))],
        },
        Case {
            name: "a pod that does not select itself never bootstraps: its zone has no matching pod",
            pods: vec![web("in-a", ZONE, &["a"]), client("client-b", ZONE, &["b"])],
            want: vec![("in-a", Some("a")), ("client-b", None)],
        },
        Case {
            name: "a pod that does not select itself joins the matching pods' zone",
            pods: vec![web("in-a", ZONE, &["a"]), client("client", ZONE, &[])],
            want: vec![("in-a", Some("a")), ("client", Some("a"))],
        },
    ]
}

#[test]
fn self_affine_pods_bootstrap_a_domain_their_requirements_allow() {
    for case in cases() {
        let i = input(vec![zone_pool()], case.pods);
        let d = solve(&i);
        let s = summary(&i, &d);
        for (pod, zone) in &case.want {
            let claim = s.claim_pods.iter().position(|c| c.iter().any(|p| p == pod));
            match zone {
                None => assert!(claim.is_none() && s.unschedulable.contains(&pod.to_string()), "{}: {pod}", case.name),
                Some(z) => {
                    let c = claim.unwrap_or_else(|| panic!("{}: {pod} not placed ({:?})", case.name, d.unschedulable));
                    let zones: Vec<&String> = d.new_claims[c]
                        .requirements
                        .iter()
                        .filter(|r| r.key == ZONE)
                        .flat_map(|r| r.values.iter())
                        .collect();
                    assert_eq!(zones, vec![z], "{}: zone of {pod}", case.name);
                }
            }
        }
    }
}
