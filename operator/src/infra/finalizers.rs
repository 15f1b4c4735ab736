//! The hub's termination finalizer (`karpenter.sh/termination`) on NodeClaims and Nodes: the guarded
//! merge patch that adds or removes it, and its release from the Nodes of a NodeGroup that is going,
//! which NodeClaim termination and garbage collection both carry out.
//!
//! Owns: those writes. Must not: decide when to release (termination's and garbage collection's
//! decisions do), or touch any other finalizer.

use crds::labels;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::json;

use crate::{decisions::ownership, infra::registry::Connection};

/// A merge patch adding or removing the termination finalizer, guarded by the object's
/// resourceVersion so a concurrent change to the list makes it fail and retry instead of being lost.
pub fn patch<K: Resource>(obj: &K, present: bool) -> serde_json::Value {
    let mut finalizers: Vec<String> =
        obj.finalizers().iter().filter(|f| *f != labels::TERMINATION_FINALIZER).cloned().collect();
    if present {
        finalizers.push(labels::TERMINATION_FINALIZER.to_string());
    }
    json!({"metadata": {"finalizers": finalizers, "resourceVersion": obj.resource_version()}})
}

/// Release the hub's finalizer on the Nodes of a NodeGroup that is going (clever-cloud.md §3.6:
/// waiting for the group to disappear first deadlocks with CKE's own finalizer). Used by
/// termination and by garbage collection after it reaps an orphan.
pub async fn release_from_nodes(conn: &Connection, group_name: &str) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(conn.client.clone());
    for node in conn.cache.nodes.state() {
        if ownership::is_node_of(&node, group_name)
            && node.finalizers().iter().any(|f| f == labels::TERMINATION_FINALIZER)
        {
            let patch = patch(node.as_ref(), false);
            match nodes.patch(&node.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
                // Gone or changed meanwhile: the next pass sees the new state.
                Ok(_) | Err(kube::Error::Api(_)) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}
