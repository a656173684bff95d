//! The reconcile's writes: the hosts' claim labels (each patch conditioned
//! on the host's resourceVersion), the services' objects applied and those
//! no longer asked for deleted, and the finalizer.

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::super::{delete_if_present, same_object};
use super::decide::{self, ADOPTION_BLOCKED, Built, Failures, INFRA_FAILURE};
use super::{FINALIZER, MANAGED_BY, SipReconciler, claimed_by, host_id};
use crate::api::metal3::BareMetalHost;
use crate::api::sip::{ROLES, SIPCluster, ServiceEndpoint, labels};
use crate::controllers::finalizer;
use crate::error::{Error, Result};
use crate::runtime::store::Key;
use crate::sip::schedule::{ClusterPlan, HostState};
use crate::sip::services::{self, Existing, Owner, ServiceObjects};

/// The field manager of the service objects.
const MANAGER: &str = "nodewarden-sip";

/// How applying a service's objects went.
enum Applied {
    /// Written; the objects taken over from someone else (upstream SIP).
    Done(Vec<String>),
    /// Not written: what already there cannot be taken over, and why.
    Blocked(String),
}

impl SipReconciler {
    /// Releases, restates and claims, each a label patch conditioned on the
    /// host's resourceVersion. A claim that loses a race undoes this
    /// round's claims and the round is retried on fresh state.
    pub(super) async fn apply_hosts(&self, sip: &SIPCluster, plan: &ClusterPlan) -> Result<()> {
        let ns = sip.namespace().unwrap_or_default();
        let name = sip.name_any();
        let ours = Key::<SIPCluster>::new(Some(&ns), &name);
        for (p, role) in plan.roles.iter().zip(ROLES) {
            for (host, why) in &p.release {
                self.patch_host(host, Some(&ours), release_labels()).await?;
                self.event(
                    sip,
                    EventType::Normal,
                    "Released",
                    format!("{role} host {host} released: {why}"),
                );
            }
            for (host, state) in &p.restate {
                self.patch_host(host, Some(&ours), json!({ labels::STATE: state.as_str() }))
                    .await?;
            }
        }
        // Each host this round claimed, with the version its claim wrote.
        let mut claimed: Vec<(String, String)> = Vec::new();
        for (p, role) in plan.roles.iter().zip(ROLES) {
            for (host, state) in &p.claim {
                match self
                    .patch_host(host, None, claim_labels(&ours, role, *state))
                    .await
                {
                    Ok(version) => claimed.push((host.clone(), version)),
                    Err(e) => {
                        // Someone changed the host first (another cluster's
                        // claim): give back what this round took, each
                        // conditioned on the version its claim wrote.
                        for (taken, version) in &claimed {
                            let _ = self.release_claim(taken, version).await;
                        }
                        return Err(e);
                    }
                }
            }
            if !p.claim.is_empty() {
                let names: Vec<&str> = p.claim.iter().map(|(n, _)| n.as_str()).collect();
                self.event(
                    sip,
                    EventType::Normal,
                    "Claimed",
                    format!("{role} hosts claimed: {}", names.join(", ")),
                );
            }
        }
        Ok(())
    }

    /// Patches a host's labels if it still belongs to `owner` (None: free)
    /// in the cache, conditioned on that cached version; returns the version
    /// written. The round judged the host on an earlier read: the version
    /// alone would let the write through over whatever changed the host
    /// since (another cluster's claim), so its owner is checked too.
    async fn patch_host(
        &self,
        host: &str,
        owner: Option<&Key<SIPCluster>>,
        labels: serde_json::Value,
    ) -> Result<String> {
        let Some(current) = self.host(host) else {
            return Err(Error::NotFound {
                kind: "BareMetalHost",
                name: host.to_string(),
            });
        };
        decide::still_owned_by(&current, owner)?;
        self.ctx.leader.ensure_leader()?;
        let api: Api<BareMetalHost> =
            Api::namespaced(self.ctx.client.clone(), &current.namespace().unwrap_or_default());
        let patch = host_patch(labels, current.resource_version().as_deref());
        let written = api
            .patch(
                &current.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        Ok(written.resource_version().unwrap_or_default())
    }

    /// Undoes this round's own claim of `host`, if nothing wrote it since
    /// (the cache may not have seen the claim yet, so its version is the
    /// one the claim wrote).
    async fn release_claim(&self, host: &str, version: &str) -> Result<()> {
        let Some(current) = self.host(host) else {
            return Ok(());
        };
        self.ctx.leader.ensure_leader()?;
        let api: Api<BareMetalHost> =
            Api::namespaced(self.ctx.client.clone(), &current.namespace().unwrap_or_default());
        let patch = host_patch(release_labels(), Some(version));
        api.patch(
            &current.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
        Ok(())
    }

    /// Applies every service's objects `built` wants, taking over those
    /// already there (upstream SIP's), and deletes those of services no
    /// longer asked for. Returns the endpoints, or Ready's reason and what
    /// failed (naming the field or object), `built`'s failures first.
    pub(super) async fn apply_services(
        &self,
        sip: &SIPCluster,
        owner: &Owner,
        built: Built,
    ) -> std::result::Result<Vec<ServiceEndpoint>, Failures> {
        let Built {
            wanted,
            mut failures,
            kept,
        } = built;
        let mut endpoints = Vec::new();
        let uid = owner.reference.uid.clone();
        for (kind, objects) in wanted {
            let name = objects.deployment.name_any();
            match self.apply_objects(&owner.namespace, objects.clone(), &uid).await {
                Ok(Applied::Done(taken)) => {
                    if !taken.is_empty() {
                        self.event(
                            sip,
                            EventType::Normal,
                            "Adopted",
                            format!("{kind} {name}: took over {} as they are", taken.join(", ")),
                        );
                    }
                }
                Ok(Applied::Blocked(why)) => {
                    self.event(sip, EventType::Warning, "AdoptionBlocked", why.clone());
                    failures.push((ADOPTION_BLOCKED, format!("{kind} {name}: {why}")));
                    continue;
                }
                Err(e) => {
                    failures.push((INFRA_FAILURE, format!("{kind} {name}: {e}")));
                    continue;
                }
            }
            endpoints.push(ServiceEndpoint {
                kind: kind.to_string(),
                name,
                node_ports: objects.node_ports.clone(),
                backends: objects.backends.clone(),
            });
        }
        if let Err(e) = self.delete_unwanted(sip, &kept).await {
            failures.push((
                INFRA_FAILURE,
                format!("removing services no longer asked for: {e}"),
            ));
        }
        match failures.is_empty() {
            true => Ok(endpoints),
            false => Err(failures),
        }
    }

    /// Applies a service's objects over what is there, keeping what the API
    /// server holds immutable (`services::adopt`); what blocks that is
    /// returned, and nothing is written.
    async fn apply_objects(&self, ns: &str, mut o: ServiceObjects, uid: &str) -> Result<Applied> {
        let client = &self.ctx.client;
        let name = o.deployment.name_any();
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
        let svc: Api<Service> = Api::namespaced(client.clone(), ns);
        let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        let existing = Existing {
            deployment: deployments.get_opt(&name).await?,
            service: svc.get_opt(&name).await?,
            secret: secrets.get_opt(&name).await?,
            config_map: match &o.config_map {
                Some(_) => config_maps.get_opt(&name).await?,
                None => None,
            },
        };
        let taken = match services::adopt(&mut o, &existing, uid) {
            Ok(taken) => taken,
            Err(why) => return Ok(Applied::Blocked(why)),
        };
        self.ctx.leader.ensure_leader()?;
        let params = PatchParams::apply(MANAGER).force();
        secrets
            .patch(&o.secret.name_any(), &params, &Patch::Apply(&o.secret))
            .await?;
        if let Some(cm) = &o.config_map {
            config_maps
                .patch(&cm.name_any(), &params, &Patch::Apply(cm))
                .await?;
        }
        deployments
            .patch(&o.deployment.name_any(), &params, &Patch::Apply(&o.deployment))
            .await?;
        svc.patch(&o.service.name_any(), &params, &Patch::Apply(&o.service))
            .await?;
        Ok(Applied::Done(taken))
    }

    /// Deletes this cluster's service objects that are not in `keep`.
    async fn delete_unwanted(&self, sip: &SIPCluster, keep: &BTreeSet<String>) -> Result<()> {
        let ns = sip.namespace().unwrap_or_default();
        let lp = ListParams::default().labels(&format!(
            "{}={},{MANAGED_BY}",
            services::CLUSTER_LABEL,
            sip.name_any()
        ));
        let uid = sip.metadata.uid.clone();
        let owned = |m: &kube::api::ObjectMeta| {
            !keep.contains(m.name.as_deref().unwrap_or_default())
                && m.owner_references
                    .iter()
                    .flatten()
                    .any(|r| Some(&r.uid) == uid.as_ref())
        };
        let client = &self.ctx.client;
        self.delete_listed(&Api::<Deployment>::namespaced(client.clone(), &ns), &lp, &owned)
            .await?;
        self.delete_listed(&Api::<Service>::namespaced(client.clone(), &ns), &lp, &owned)
            .await?;
        self.delete_listed(&Api::<Secret>::namespaced(client.clone(), &ns), &lp, &owned)
            .await?;
        self.delete_listed(&Api::<ConfigMap>::namespaced(client.clone(), &ns), &lp, &owned)
            .await?;
        Ok(())
    }

    /// Deletes the objects `lp` lists that `unwanted` picks, each by its
    /// UID: a delete landing late, after the name was given to a new object
    /// (the service asked for again), is refused.
    async fn delete_listed<K>(
        &self,
        api: &Api<K>,
        lp: &ListParams,
        unwanted: &impl Fn(&kube::api::ObjectMeta) -> bool,
    ) -> Result<()>
    where
        K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        for o in api.list(lp).await?.items.iter().filter(|o| unwanted(o.meta())) {
            self.ctx.leader.ensure_leader()?;
            delete_if_present(api, &o.name_any(), &same_object(o.meta())).await?;
        }
        Ok(())
    }

    pub(super) async fn add_finalizer(&self, sip: &SIPCluster) -> Result<()> {
        self.ctx.leader.ensure_leader()?;
        finalizer::add(&self.sips_api(sip), sip, FINALIZER).await
    }

    /// A deleted SIPCluster: every host labelled for it is released; its
    /// services go with it (owner references); then the finalizer comes off.
    pub(super) async fn finalize(&self, sip: &SIPCluster) -> Result<()> {
        if !finalizer::holds(sip, FINALIZER) {
            return Ok(());
        }
        let key = Key::<SIPCluster>::new(sip.namespace().as_deref(), &sip.name_any());
        let _one_at_a_time = self.ctx.claiming.lock().await;
        for host in self.ctx.hosts.list() {
            if claimed_by(&host).as_ref() == Some(&key) {
                self.patch_host(&host_id(&host), Some(&key), release_labels())
                    .await?;
            }
        }
        self.ctx.leader.ensure_leader()?;
        finalizer::remove(&self.sips_api(sip), sip, FINALIZER).await
    }

    fn sips_api(&self, sip: &SIPCluster) -> Api<SIPCluster> {
        Api::namespaced(self.ctx.client.clone(), &sip.namespace().unwrap_or_default())
    }
}

/// The labels that claim a host for the SIPCluster `cluster`, as a `role`
/// host in `state`.
pub fn claim_labels(cluster: &Key<SIPCluster>, role: &str, state: HostState) -> serde_json::Value {
    let key = cluster.untyped();
    json!({
        labels::CLUSTER_NAMESPACE: key.namespace.as_deref().unwrap_or_default(),
        labels::CLUSTER_NAME: key.name,
        labels::NODE_TYPE: role,
        labels::STATE: state.as_str(),
    })
}

/// The merge patch that writes `labels` onto a host, conditioned on
/// `version`, the host's resourceVersion as judged: two clusters or two
/// leaders never both claim one host, and a claim or release landing late,
/// after the host changed, is refused (409).
pub fn host_patch(labels: serde_json::Value, version: Option<&str>) -> serde_json::Value {
    json!({"metadata": {"labels": labels, "resourceVersion": version}})
}

/// The merge patch that removes every claim label.
pub fn release_labels() -> serde_json::Value {
    json!({
        labels::CLUSTER_NAMESPACE: null,
        labels::CLUSTER_NAME: null,
        labels::NODE_TYPE: null,
        labels::STATE: null,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_names_the_cluster_and_is_written_on_the_version_judged() {
        let cluster = Key::<SIPCluster>::new(Some("ns"), "c");
        let patch = host_patch(claim_labels(&cluster, "worker", HostState::Standby), Some("9"));
        assert_eq!(patch["metadata"]["resourceVersion"], "9");
        let labels = &patch["metadata"]["labels"];
        assert_eq!(labels[labels::CLUSTER_NAMESPACE], "ns");
        assert_eq!(labels[labels::CLUSTER_NAME], "c");
        assert_eq!(labels[labels::NODE_TYPE], "worker");
        assert_eq!(labels[labels::STATE], "standby");
        let released = host_patch(release_labels(), Some("10"));
        assert!(released["metadata"]["labels"][labels::CLUSTER_NAME].is_null());
    }
}
