//! What nodewarden reads of a Node, for every part that reads one: its
//! readiness, and what the cache keeps of it.

use k8s_openapi::api::core::v1::{Node, NodeStatus};

/// Is the Node's Ready condition True?
pub fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The transform for Nodes: the cache keeps what a controller reads —
/// metadata (without managedFields and the last-applied annotation), the
/// whole spec, and of the status only the Ready condition. Addresses,
/// capacity, images, nodeInfo, volumes and the other conditions are dropped:
/// they are most of a Node's size, and at thousands of Nodes most of the
/// process's memory. A controller that writes a whole Node back reads it
/// fresh first (the cached metadata lacks the last-applied annotation); the
/// status of a PUT to the Node itself is ignored (status is a subresource).
pub fn strip_node(mut node: Node) -> Node {
    node.metadata.managed_fields = None;
    if let Some(annotations) = node.metadata.annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
    node.status = node.status.map(|status| NodeStatus {
        conditions: status
            .conditions
            .map(|cs| cs.into_iter().filter(|c| c.type_ == "Ready").collect()),
        ..Default::default()
    });
    node
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Node;
    use serde_json::json;

    use super::{node_is_ready, strip_node};

    #[test]
    fn a_cached_node_keeps_what_controllers_read() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {
                "name": "n1", "uid": "u1", "resourceVersion": "7",
                "labels": {"pool": "a"},
                "annotations": {"keep": "me", "kubectl.kubernetes.io/last-applied-configuration": "{}"},
                "managedFields": [{"manager": "kubelet"}],
            },
            "spec": {"providerID": "sim://g/1", "unschedulable": true, "taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {
                "conditions": [
                    {"type": "MemoryPressure", "status": "False"},
                    {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                ],
                "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
                "capacity": {"cpu": "4"},
                "nodeInfo": {"osImage": "img", "kubeletVersion": "v1.36.0", "machineID": "m", "systemUUID": "s",
                    "bootID": "b", "kernelVersion": "k", "containerRuntimeVersion": "c", "kubeProxyVersion": "",
                    "operatingSystem": "linux", "architecture": "amd64"},
                "images": [{"names": ["a"], "sizeBytes": 1}],
            },
        }))
        .expect("a node");
        let kept = strip_node(node.clone());
        assert_eq!(kept.metadata.labels, node.metadata.labels);
        assert_eq!(kept.metadata.uid, node.metadata.uid);
        assert_eq!(kept.metadata.resource_version, node.metadata.resource_version);
        assert_eq!(kept.metadata.managed_fields, None);
        let annotations = kept.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(annotations.keys().collect::<Vec<_>>(), ["keep"]);
        assert_eq!(kept.spec, node.spec, "the whole spec stays");
        let status = kept.status.clone().unwrap_or_default();
        let types: Vec<&str> = status
            .conditions
            .iter()
            .flatten()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(types, ["Ready"]);
        assert!(node_is_ready(&kept));
        assert_eq!(status.addresses, None);
        assert_eq!(status.capacity, None);
        assert_eq!(status.node_info, None);
        assert_eq!(status.images, None);
    }
}
