//! Retiring a drained node: pods left on it evicted, a control-plane node's
//! etcd member removed, its leave tracked, then its instance and its Node
//! deleted.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, EvictParams, ListParams, ObjectMeta, PostParams, Preconditions};
use kube::runtime::events::EventType;

use super::NodeVersionReconciler;
use super::etcd_reach::{Listed, Reach};
use super::gather::annotation;
use crate::api::update::annotations::{GROUP_ANNOTATION, HEIR_ANNOTATION, IMAGE_ANNOTATION};
use crate::api::update::{NodeVersion, PendingNode, PendingNodeGoal, PendingNodeSpec};
use crate::controllers::replacement_trace::{
    FinishedReplacement, trace_delete_instance, trace_etcd_member, trace_replacement,
};
use crate::controllers::{delete_if_present, same_object};
use crate::error::{Error, Result};
use crate::etcd::{Decision, EtcdError, Member, Removed, decide, to_check};
use crate::runtime::store::ObjectKey;
use crate::telemetry::trace::{self, TraceParent};

/// How long a leaving instance is tracked.
const LEAVE_DEADLINE_SECS: i64 = 600;

/// The label kubeadm puts on control-plane nodes.
pub(super) const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";

/// The node's InternalIP, which its etcd member's peer URL carries.
pub(super) fn internal_ip(node: &Node) -> Option<IpAddr> {
    node.status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .find(|a| a.type_ == "InternalIP")
        .and_then(|a| a.address.parse().ok())
}

impl NodeVersionReconciler {
    /// Deletes a drained node's instance, then the node (the leaving
    /// instance is tracked first, so it is deleted even if we die now). A
    /// control-plane node loses its etcd member first; returns why it waits
    /// for that, if it does (then nothing else is done).
    pub(super) async fn retire(&self, nv: &NodeVersion, n: &Node) -> Result<Option<String>> {
        let node = n.name_any();
        let provider_id = n
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.clone())
            .unwrap_or_default();
        let group = annotation(n, GROUP_ANNOTATION).unwrap_or_default().to_string();
        let replacement = trace::from_annotations(n.metadata.annotations.as_ref());
        self.leader.ensure_leader()?;
        let began = std::time::Instant::now();
        self.evict_stragglers(&node).await?;
        if let Some(wait) = self.remove_etcd_member(nv, n, replacement.as_ref()).await? {
            return Ok(Some(wait));
        }
        let stragglers_checked = began.elapsed();
        self.track_leave(&node, &provider_id, &group).await?;
        let leave_tracked = began.elapsed();
        self.leader.ensure_leader()?;
        let deleting_instance = SystemTime::now();
        let known = match self.cloud.delete_node(&provider_id).await {
            Ok(()) => true,
            Err(e) if e.is_not_found() => false,
            Err(e) => return Err(e.into()),
        };
        let deleting_node = SystemTime::now();
        if let Some((tp, _)) = &replacement {
            trace_delete_instance(tp, deleting_instance, deleting_node, &provider_id, known);
        }
        let nv_name = nv.name_any();
        let finished = FinishedReplacement {
            donor: n,
            heir: annotation(n, HEIR_ANNOTATION).unwrap_or_default(),
            group: &group,
            role: self.role_of(&group),
            old_image: annotation(n, IMAGE_ANNOTATION).unwrap_or_default(),
            new_image: &nv.spec.image,
            nodeversion: &nv_name,
        };
        if let Some(trace) = &replacement
            && self.sent_roots.first_time(&trace.0)
        {
            trace_replacement(&finished, trace).await;
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: n.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        // A stale store can show a retired node once more: only the
        // call that deleted it finishes the replacement.
        let node_api: Api<Node> = Api::all(self.client.clone());
        if delete_if_present(&node_api, &node, &params).await? {
            self.retired.add(n);
            self.finish_replacement(nv, &finished, replacement.as_ref(), deleting_node);
        }
        // Where a retirement's time goes (each figure counts from its start).
        tracing::debug!(%node, ?stragglers_checked, ?leave_tracked, took = ?began.elapsed(), "retired");
        Ok(None)
    }

    /// Removes the etcd member of control-plane node `n` (the one whose
    /// peer URL is on the node's InternalIP), when the rules allow it now
    /// (`etcd::decide`). Returns why the retirement waits, if it does. A
    /// node with no member (external etcd, or removed by an earlier pass)
    /// is retired as it is.
    async fn remove_etcd_member(
        &self,
        nv: &NodeVersion,
        n: &Node,
        replacement: Option<&(TraceParent, Option<SystemTime>)>,
    ) -> Result<Option<String>> {
        let group = annotation(n, GROUP_ANNOTATION).unwrap_or_default();
        if !n.labels().contains_key(CONTROL_PLANE_LABEL) && self.role_of(group) != "control-plane" {
            return Ok(None);
        }
        let (etcd, found, listed) = match self.reach_etcd(nv, n).await? {
            Reach::NoMember => return Ok(None),
            Reach::Wait(why) => return Ok(Some(why)),
            Reach::Client {
                client,
                found,
                listed,
            } => (client, found, listed),
        };
        let node = n.name_any();
        let (ip, heir) = match self.peer_ips(nv, n, listed.as_ref()).await? {
            Ok(ips) => ips,
            Err(why) => return Ok(Some(why)),
        };
        let _turn = self.etcd_turn.lock().await;
        let started = SystemTime::now();
        let members = match (etcd.members().await, &found) {
            (Ok(members), _) => members,
            // Found, not given: a stacked member nodewarden cannot reach
            // holds the node with what to set.
            (Err(e), Some(found)) => {
                return Ok(Some(self.hold_unreachable(nv, &node, found, &e.to_string())));
            }
            (Err(e), None) => return Err(e.into()),
        };
        let health = etcd.health_of(&to_check(ip, &members)).await;
        let (member, outcome) = match decide(ip, heir, &members, &health) {
            Decision::Wait(blocked) => {
                let why = format!("node {node} waits for the removal of its etcd member: {blocked}");
                tracing::warn!(%node, %ip, %blocked, "etcd member removal waits");
                self.event(nv, EventType::Warning, "EtcdMemberRemovalBlocked", why.clone());
                return Ok(Some(why));
            }
            Decision::NoMember => {
                self.tell_no_member(nv, &node, ip);
                (None, "no member")
            }
            Decision::Remove(member) => {
                self.leader.ensure_leader()?;
                let removed = match etcd.remove_member(member.id).await {
                    Err(EtcdError::ClusterUnhealthy(answer)) => {
                        let why = format!(
                            "node {node} waits for the removal of its etcd member {}: etcd refused it ({answer}): a member is down, or joined moments ago",
                            member.label()
                        );
                        self.event(nv, EventType::Warning, "EtcdMemberRemovalBlocked", why.clone());
                        return Ok(Some(why));
                    }
                    removed => removed?,
                };
                let outcome = self.tell_removed(nv, &node, ip, &member, removed);
                (Some(member), outcome)
            }
        };
        if let Some((tp, _)) = replacement {
            trace_etcd_member(tp, started, &node, ip, member.as_ref(), outcome).await;
        }
        Ok(None)
    }

    /// The InternalIPs of control-plane node `n` and of its heir (None
    /// without one), as `listed` has them when it names them (nodes read
    /// fresh to find etcd), else read fresh: the store keeps no addresses
    /// (`strip_node`). Err: why the retirement waits (`n` has no
    /// InternalIP, so no member can be told to be its).
    async fn peer_ips(
        &self,
        nv: &NodeVersion,
        n: &Node,
        listed: Option<&Listed>,
    ) -> Result<std::result::Result<(IpAddr, Option<IpAddr>), String>> {
        let node = n.name_any();
        let nodes = Api::<Node>::all(self.client.clone());
        let listed_ip = |name: &str| listed.and_then(|l| l.get(name)).copied();
        let ip = match listed_ip(&node) {
            Some(ip) => ip,
            None => internal_ip(&nodes.get(&node).await?),
        };
        let Some(ip) = ip else {
            let why = format!(
                "node {node} has no InternalIP, so its etcd member cannot be told: it is not retired"
            );
            tracing::warn!(%node, "{why}");
            self.event(nv, EventType::Warning, "EtcdMemberRemovalBlocked", why.clone());
            return Ok(Err(why));
        };
        let heir = match annotation(n, HEIR_ANNOTATION) {
            Some(heir) => match listed_ip(heir) {
                Some(ip) => ip,
                None => nodes.get_opt(heir).await?.as_ref().and_then(internal_ip),
            },
            None => None,
        };
        Ok(Ok((ip, heir)))
    }

    /// Says that no etcd member is on `node`'s `ip`: the node is retired as it is.
    fn tell_no_member(&self, nv: &NodeVersion, node: &str, ip: IpAddr) {
        tracing::info!(%node, %ip, "no etcd member on the node: external etcd, or removed already");
        self.event(
            nv,
            EventType::Normal,
            "NoEtcdMember",
            format!(
                "no etcd member has a peer URL on {ip} (node {node}): etcd runs elsewhere or the member was removed already; the node is retired"
            ),
        );
    }

    /// Says that `node`'s etcd `member` is gone; returns the outcome its
    /// trace records.
    fn tell_removed(
        &self,
        nv: &NodeVersion,
        node: &str,
        ip: IpAddr,
        member: &Member,
        removed: Removed,
    ) -> &'static str {
        let (outcome, note) = match removed {
            Removed::Now => ("removed", "removed"),
            Removed::Already => ("removed already", "was removed already"),
        };
        tracing::info!(%node, %ip, member = %member.label(), outcome, "etcd member removed");
        self.event(
            nv,
            EventType::Normal,
            "EtcdMemberRemoved",
            format!("etcd member {} of node {node} {note}", member.label()),
        );
        outcome
    }

    /// The last look before a drained node goes: a pod bound after the drain
    /// ended (a scheduler whose cache had not seen the cordon yet, say after
    /// an API server restart) would go down with the Node. Such pods are
    /// evicted (budgets still apply) and the node is retired on a later
    /// pass, once none is left. The pods are those the drain's own watch
    /// shows, while it is connected; else they are listed, read fresh (a
    /// read that waits up to 0.1 s for the API server's pod cache).
    async fn evict_stragglers(&self, node: &str) -> Result<()> {
        use crate::drain::pods::classify;
        let left: Vec<Arc<Pod>> = match self.drains.pods_since_success(node) {
            Some(watched) => watched,
            None => {
                let pods: Api<Pod> = Api::all(self.client.clone());
                let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
                pods.list(&on_node)
                    .await?
                    .items
                    .into_iter()
                    .filter(|p| classify(p).evicted())
                    .map(Arc::new)
                    .collect()
            }
        };
        if left.is_empty() {
            return Ok(());
        }
        for p in left.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &p.namespace().unwrap_or_default());
            // This pod, not one made since under its name (a StatefulSet's
            // on another node). A budget refusing (429) is retried with the
            // reconcile.
            let params = EvictParams {
                delete_options: Some(same_object(&p.metadata)),
                ..Default::default()
            };
            if let Err(e) = api.evict(&p.name_any(), &params).await {
                tracing::debug!(pod = %p.name_any(), error = %e, "evicting a pod left on a drained node");
            }
        }
        Err(Error::PodsLeft {
            node: node.to_string(),
            pods: left
                .iter()
                .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
                .collect(),
        })
    }

    async fn track_leave(&self, node: &str, provider_id: &str, group: &str) -> Result<()> {
        let pending: Api<PendingNode> = Api::all(self.client.clone());
        let name = format!("leave-{node}");
        if self.pending.get(&ObjectKey::cluster(&name)).is_some() {
            return Ok(());
        }
        let deadline = Timestamp::now()
            .checked_add(SignedDuration::from_secs(LEAVE_DEADLINE_SECS))
            .unwrap_or(Timestamp::now());
        let labels = self
            .pending
            .list()
            .iter()
            .find(|p| p.spec.group_id == group)
            .map(|p| p.labels().clone())
            .unwrap_or_default();
        let pn = PendingNode {
            metadata: ObjectMeta {
                name: Some(name),
                labels: Some(labels),
                ..Default::default()
            },
            spec: PendingNodeSpec {
                provider_id: provider_id.to_string(),
                group_id: group.to_string(),
                node_name: node.to_string(),
                goal: Some(PendingNodeGoal::Leave),
                deadline: Some(Time(deadline)),
            },
            status: None,
        };
        match pending.create(&PostParams::default(), &pn).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}
