//! The reconcile's writes: the maintenance's owner reference (the Node),
//! the node's quarantine (each replace on the node as read) and its drain
//! started in the engine; on deletion the quarantine undone, the lease
//! released and the finalizers removed; the per-node leases other
//! remediation tools respect.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tokio::time::Instant;

use super::super::finalizer;
use super::decide::{
    LeaseState, begun_by_nmo, finalizers_after_leaving, owner_of, plan_drain, quarantine_spec,
};
use super::{LEASE_HOLDER, LEASE_SECONDS, NodeMaintenanceReconciler};
use crate::api::node_maintenance::{MaintenanceObject, parse_duration};
use crate::drain::node::{self as quarantine, Quarantine};
use crate::drain::{DrainOptions, DrainStatus};
use crate::error::{Error, Result};
use crate::runtime::lease::{KubeLeaseLock, LeaseLock, Observed, Written, holding_spec};
use crate::runtime::store::Key;
use crate::runtime::sync::lock;

/// The observed leases, whatever a panic elsewhere left behind.
fn lock_map(map: &Mutex<HashMap<String, Observed>>) -> std::sync::MutexGuard<'_, HashMap<String, Observed>> {
    lock(map)
}

impl<M: MaintenanceObject> NodeMaintenanceReconciler<M> {
    /// Owns the node, quarantines it and makes sure its drain runs (the
    /// drain's progress re-queues this maintenance). Returns the drain, and
    /// the maintenance's version if the owner reference was written now.
    pub(super) async fn start_drain(
        &self,
        api: &Api<M>,
        key: &Key<M>,
        obj: &M,
        node: &Node,
    ) -> Result<(DrainStatus, Option<String>)> {
        let node_name = obj.node_name();
        let owner = owner_of(obj);
        let written = self.set_owner_reference(api, obj, node).await?;
        let kubectl = plan_drain(obj.annotations());
        let spec = quarantine_spec(M::DRAIN_TAINT, kubectl.is_some());
        self.quarantine(node_name, &owner, &spec, begun_by_nmo(obj.finalizers()))
            .await?;
        let options = DrainOptions {
            timeout: obj.drain_timeout().and_then(parse_duration),
            on_timeout: obj.on_drain_timeout(),
            kubectl,
            ..DrainOptions::default()
        };
        let (queue, me) = (self.queue.clone(), key.clone());
        let drain = self.ctx.engine.ensure(
            node_name,
            &owner,
            options,
            Arc::new(move || queue.add(me.clone())),
        );
        Ok((drain, written))
    }

    /// Deleted: stop the drain, undo our changes, release the lease, let go
    /// (of the Node Maintenance Operator's finalizer too).
    pub(super) async fn leave(&self, api: &Api<M>, obj: &M, owner: &str, node_name: &str) -> Result<()> {
        self.ctx.engine.stop(node_name, owner);
        let nodes: Api<Node> = Api::all(self.ctx.client.clone());
        let by_nmo = begun_by_nmo(obj.finalizers());
        if let Some(node) = nodes.get_opt(node_name).await? {
            // A maintenance the Node Maintenance Operator began and deleted
            // before nodewarden took it over has no record: lifted whole, as
            // that operator would have.
            let restored = quarantine::undo(&node, owner).or_else(|| {
                by_nmo
                    .then(|| quarantine::lift_unrecorded(&node, &quarantine_spec(M::DRAIN_TAINT, false)))
                    .flatten()
            });
            if let Some(restored) = restored {
                self.ctx.leader.ensure_leader()?;
                nodes
                    .replace(node_name, &PostParams::default(), &restored)
                    .await?;
                if quarantine::uncordoned(&node, &restored) {
                    self.event(
                        &node.object_ref(&()),
                        EventType::Normal,
                        "UncordonNode",
                        &format!("node {node_name} uncordoned: maintenance {owner} ended"),
                    )
                    .await;
                }
            }
        }
        let holds_lease = (self.ctx.claims_of)(node_name)
            .iter()
            .any(|c| c.owner != owner && c.active && !c.deleting);
        if !holds_lease && plan_drain(obj.annotations()).is_none() {
            self.release_lease(node_name).await?;
        }
        // Both finalizers in one write: nodewarden's and the Node Maintenance Operator's.
        finalizer::replace(api, obj, &finalizers_after_leaving(obj.finalizers())).await?;
        self.ctx.release(owner);
        self.event(
            &obj.object_ref(&()),
            EventType::Normal,
            "RemovedMaintenance",
            &format!("node {node_name} left maintenance"),
        )
        .await;
        Ok(())
    }

    /// Returns the maintenance's new version when it wrote one.
    async fn set_owner_reference(&self, api: &Api<M>, obj: &M, node: &Node) -> Result<Option<String>> {
        let uid = node.metadata.uid.clone().unwrap_or_default();
        if obj.owner_references().iter().any(|r| r.uid == uid) {
            return Ok(None);
        }
        let mut refs = obj.owner_references().to_vec();
        refs.push(OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: node.name_any(),
            uid,
            ..Default::default()
        });
        let patch = json!({"metadata": {"ownerReferences": refs, "resourceVersion": obj.resource_version()}});
        let written = api
            .patch(&obj.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(written.resource_version())
    }

    /// Cordon, taints and the exclude label, recorded on the node for undo.
    /// Of a maintenance the Node Maintenance Operator began, the quarantine
    /// it made is taken over: undone whole on deletion, as it would have.
    async fn quarantine(&self, node_name: &str, owner: &str, spec: &Quarantine, by_nmo: bool) -> Result<()> {
        let nodes: Api<Node> = Api::all(self.ctx.client.clone());
        let node = nodes.get(node_name).await?;
        let applied = if by_nmo {
            quarantine::take_over(&node, spec, owner)
        } else {
            quarantine::apply(&node, spec, owner)
        };
        match applied {
            Ok(Some(held)) => {
                self.ctx.leader.ensure_leader()?;
                // `held` carries the resourceVersion read above: a concurrent
                // change is a conflict and retried, never overwritten.
                nodes.replace(node_name, &PostParams::default(), &held).await?;
                Ok(())
            }
            Ok(None) => Ok(()),
            // Another maintenance took the node between the stores' view and
            // this read (two created at once, each first by the other's
            // missing claim): retried, so the next decision sees that claim
            // hold the node and reports this one as a duplicate. Waiting for
            // a change instead left it without a status (seeded random specs).
            Err(e) => Err(Error::Changed {
                kind: "Node",
                name: node_name.to_string(),
                reason: e.to_string(),
            }),
        }
    }

    /// The per-node lease `node-<name>` in the lease namespace.
    fn node_lease(&self, node_name: &str) -> KubeLeaseLock {
        KubeLeaseLock::new(
            self.ctx.client.clone(),
            &self.ctx.config.lease_namespace,
            &format!("node-{node_name}"),
        )
    }

    /// Takes or renews the node's lease. Another holder's lease counts as
    /// expired only its duration after this process saw it last change
    /// (the one Lease rule, see `runtime::lease`), never by the wall clock.
    pub(super) async fn take_lease(&self, node_name: &str) -> Result<LeaseState> {
        let lock = self.node_lease(node_name);
        let now = Instant::now();
        let fallback = Duration::from_secs(LEASE_SECONDS as u64);
        let Some(record) = lock.get().await? else {
            self.ensure_namespace(&self.ctx.config.lease_namespace).await?;
            let mut spec = holding_spec(
                &LeaseSpec::default(),
                LEASE_HOLDER,
                LEASE_SECONDS,
                Timestamp::now(),
            );
            spec.lease_transitions = Some(0);
            return Ok(match lock.create(spec).await? {
                Written::Done(_) => LeaseState::Ours,
                Written::Conflict => LeaseState::HeldBy("a writer that created it first".into()),
            });
        };
        let previous = lock_map(&self.ctx.observed_leases).remove(node_name);
        let observed = Observed::next(previous, record.spec, record.resource_version, now);
        let ours = observed.holder() == Some(LEASE_HOLDER);
        // Our own lease is renewed once half its duration has passed.
        let fresh = ours && now.saturating_duration_since(observed.at) < fallback / 2;
        if fresh || !observed.available_to(LEASE_HOLDER, fallback, now) {
            let state = if ours {
                LeaseState::Ours
            } else {
                LeaseState::HeldBy(observed.holder().unwrap_or_default().to_owned())
            };
            lock_map(&self.ctx.observed_leases).insert(node_name.to_owned(), observed);
            return Ok(state);
        }
        let spec = holding_spec(&observed.spec, LEASE_HOLDER, LEASE_SECONDS, Timestamp::now());
        match lock.update(&observed.resource_version, spec).await? {
            Written::Done(record) => {
                let mine = Observed::next(None, record.spec, record.resource_version, Instant::now());
                lock_map(&self.ctx.observed_leases).insert(node_name.to_owned(), mine);
                Ok(LeaseState::Ours)
            }
            Written::Conflict => Ok(LeaseState::HeldBy(
                observed
                    .holder()
                    .unwrap_or("a writer that changed it first")
                    .to_owned(),
            )),
        }
    }

    /// Deletes the node's lease if it is ours.
    async fn release_lease(&self, node_name: &str) -> Result<()> {
        lock_map(&self.ctx.observed_leases).remove(node_name);
        let lock = self.node_lease(node_name);
        let Some(record) = lock.get().await? else {
            return Ok(());
        };
        if record.spec.holder_identity.as_deref() == Some(LEASE_HOLDER) {
            lock.delete(&record.resource_version).await?;
        }
        Ok(())
    }

    async fn ensure_namespace(&self, ns: &str) -> Result<()> {
        let namespaces: Api<Namespace> = Api::all(self.ctx.client.clone());
        if namespaces.get_opt(ns).await?.is_some() {
            return Ok(());
        }
        let namespace = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(ns.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        match namespaces.create(&PostParams::default(), &namespace).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}
