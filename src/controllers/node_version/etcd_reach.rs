//! Which etcd a control-plane node's retirement talks to: the endpoints
//! given, or etcd found on the control plane as Constellation finds it (the
//! control-plane nodes' InternalIPs, the control plane's certificates), for
//! a node that runs a member. Where that member cannot be reached, the
//! retirement waits with what to set: never a node retired with its member.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::EventType;

use super::NodeVersionReconciler;
use super::retire::{CONTROL_PLANE_LABEL, internal_ip};
use crate::api::update::NodeVersion;
use crate::error::Result;
use crate::etcd::access::unreachable_advice;
use crate::etcd::placement::{etcd_members, static_etcd_pods_for};
use crate::etcd::{Discovery, EtcdClient, EtcdSetup};

/// Nodes read fresh, by name, with their InternalIP (None: they have none).
pub(super) type Listed = BTreeMap<String, Option<IpAddr>>;

/// How a retirement reaches the node's etcd member.
pub(super) enum Reach {
    /// The node runs no member (external etcd): nothing to remove.
    NoMember,
    /// Through this client. `found`: how the member was found on the node,
    /// when etcd was found rather than given (then a failure to reach it
    /// holds the retirement with advice rather than failing the pass).
    /// `listed`: the InternalIPs of the nodes read to find etcd, so the
    /// member's and the heir's addresses need no read of their own.
    Client {
        client: Arc<EtcdClient>,
        found: Option<String>,
        listed: Option<Listed>,
    },
    /// Not now: why (already reported).
    Wait(String),
}

impl NodeVersionReconciler {
    /// How the retirement of control-plane node `n` reaches its member.
    pub(super) async fn reach_etcd(&self, nv: &NodeVersion, n: &Node) -> Result<Reach> {
        match &self.etcd {
            EtcdSetup::External => Ok(Reach::NoMember),
            EtcdSetup::Endpoints(client) => Ok(Reach::Client {
                client: client.clone(),
                found: None,
                listed: None,
            }),
            EtcdSetup::Discover(discovery) => self.discover_etcd(nv, n, discovery).await,
        }
    }

    /// etcd on the control plane: `n`'s member as its static pod (or the
    /// placement) says, reached on the managed control-plane nodes'
    /// InternalIPs, read fresh (the store keeps no addresses).
    async fn discover_etcd(&self, nv: &NodeVersion, n: &Node, discovery: &Discovery) -> Result<Reach> {
        let node = n.name_any();
        let nodes: Api<Node> = Api::all(self.client.clone());
        // The control plane only (looked at again every few seconds while a
        // retirement waits), and the node itself if its role is only its group's.
        let mut params = self.node_source.list_params();
        params.label_selector = Some(match params.label_selector.take() {
            Some(selector) => format!("{selector},{CONTROL_PLANE_LABEL}"),
            None => CONTROL_PLANE_LABEL.to_string(),
        });
        let mut control_plane: Vec<Node> = nodes.list(&params).await?.items;
        if !control_plane.iter().any(|c| c.name_any() == node)
            && let Some(itself) = nodes.get_opt(&node).await?
        {
            control_plane.push(itself);
        }
        let names: BTreeSet<String> = control_plane.iter().map(|c| c.name_any()).collect();
        let pods = static_etcd_pods_for(&self.client, discovery.placement).await?;
        let Some(found) = etcd_members(discovery.placement, &names, &pods).remove(&node) else {
            return Ok(Reach::NoMember);
        };
        let listed: Listed = control_plane
            .iter()
            .map(|c| (c.name_any(), internal_ip(c)))
            .collect();
        let ips: Vec<IpAddr> = listed.values().flatten().copied().collect();
        match discovery.client(&ips) {
            Ok(client) => Ok(Reach::Client {
                client: Arc::new(client),
                found: Some(found),
                listed: Some(listed),
            }),
            Err(e) => Ok(Reach::Wait(self.hold_unreachable(
                nv,
                &node,
                &found,
                &e.to_string(),
            ))),
        }
    }

    /// Reports that `node`'s member (known by `found`) cannot be reached
    /// (`why`): a Warning Event with what to set; returns the message the
    /// Degraded condition carries.
    pub(super) fn hold_unreachable(&self, nv: &NodeVersion, node: &str, found: &str, why: &str) -> String {
        let advice = unreachable_advice(node, found, why);
        tracing::warn!(%node, %why, "etcd cannot be reached: the control-plane node is not retired");
        self.event(nv, EventType::Warning, "EtcdUnreachable", advice.clone());
        advice
    }
}
