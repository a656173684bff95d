//! The Nodes of joined instances: kwok Nodes (kwok plays their kubelet and
//! marks them Ready) that look like what a real instance's kubelet registers.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeSpec, NodeStatus, NodeSystemInfo};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, PostParams};

use crate::model::JoinJob;
use nodewarden_simwire::GroupRole;
use nodewarden_simwire::provider_id;

/// The label naming a Node's scaling group.
pub const SCALING_GROUP_LABEL: &str = "nodewarden.dev/scaling-group";
/// kwok manages only Nodes with this annotation (value `fake`).
pub const KWOK_ANNOTATION: &str = "kwok.x-k8s.io/node";

fn role_label(role: GroupRole) -> &'static str {
    match role {
        GroupRole::ControlPlane => "node-role.kubernetes.io/control-plane",
        GroupRole::Worker => "node-role.kubernetes.io/worker",
    }
}

/// The Node an instance registers when it joins. The group's labels come
/// last, so a config can override the defaults (but not the group label).
pub fn node_for(job: &JoinJob) -> Node {
    let mut labels = BTreeMap::from([
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        ("kubernetes.io/arch".to_string(), "amd64".to_string()),
        ("type".to_string(), "kwok".to_string()),
        (role_label(job.role).to_string(), String::new()),
    ]);
    // A label value is at most 63 characters; config validation keeps
    // instance names within that, but a Node without the label beats none.
    if job.instance.len() <= 63 {
        labels.insert("kubernetes.io/hostname".into(), job.instance.clone());
    }
    labels.extend(job.labels.clone());
    labels.insert(SCALING_GROUP_LABEL.into(), job.group.clone());
    let resources = BTreeMap::from([
        ("cpu".to_string(), Quantity("32".into())),
        ("memory".to_string(), Quantity("256Gi".into())),
        ("pods".to_string(), Quantity("110".into())),
    ]);
    Node {
        metadata: ObjectMeta {
            name: Some(job.instance.clone()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([
                (KWOK_ANNOTATION.to_string(), "fake".to_string()),
                ("node.alpha.kubernetes.io/ttl".to_string(), "0".to_string()),
            ])),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(provider_id(&job.group, &job.instance)),
            ..NodeSpec::default()
        }),
        status: Some(NodeStatus {
            allocatable: Some(resources.clone()),
            capacity: Some(resources),
            node_info: Some(NodeSystemInfo {
                architecture: "amd64".into(),
                operating_system: "linux".into(),
                os_image: job.image.clone(),
                kubelet_version: "fake".into(),
                ..NodeSystemInfo::default()
            }),
            // As a kubelet registers: the instance's InternalIP and its
            // Hostname (kwok's node-initialize stage keeps the addresses
            // only when both are there, and replaces them otherwise).
            addresses: job.internal_ip.as_ref().map(|ip| {
                vec![
                    NodeAddress {
                        address: ip.clone(),
                        type_: "InternalIP".into(),
                    },
                    NodeAddress {
                        address: job.instance.clone(),
                        type_: "Hostname".into(),
                    },
                ]
            }),
            ..NodeStatus::default()
        }),
    }
}

/// Creates the instance's Node. A Node that already exists counts as created:
/// the sim-cloud may have died after creating it and before recording that.
pub async fn create(client: &Client, job: &JoinJob) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    match nodes.create(&PostParams::default(), &node_for(job)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_carries_provider_id_labels_and_image() {
        let job = JoinJob {
            instance: "g-00001".into(),
            group: "g".into(),
            role: GroupRole::ControlPlane,
            image: "img-7".into(),
            labels: BTreeMap::from([
                ("zone".to_string(), "a".to_string()),
                (SCALING_GROUP_LABEL.to_string(), "forged".to_string()),
            ]),
            internal_ip: Some("10.0.1.7".into()),
        };
        let node = node_for(&job);
        let labels = node.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels["node-role.kubernetes.io/control-plane"], "");
        assert_eq!(labels[SCALING_GROUP_LABEL], "g");
        assert_eq!(labels["zone"], "a");
        assert_eq!(labels["kubernetes.io/hostname"], "g-00001");
        let annotations = node.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(annotations[KWOK_ANNOTATION], "fake");
        assert_eq!(
            node.spec.and_then(|s| s.provider_id).as_deref(),
            Some("sim://g/g-00001")
        );
        let status = node.status.unwrap_or_default();
        let addresses = status.addresses.clone().unwrap_or_default();
        assert_eq!(
            (addresses[0].type_.as_str(), addresses[0].address.as_str()),
            ("InternalIP", "10.0.1.7")
        );
        assert_eq!(status.node_info.map(|i| i.os_image).as_deref(), Some("img-7"));
        assert_eq!(
            status.allocatable.unwrap_or_default()["memory"],
            Quantity("256Gi".into())
        );
    }
}
