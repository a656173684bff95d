//! SIPCluster controller: chooses each role's BareMetalHosts, keeps that
//! set healthy as hosts fail, and runs the cluster's support services.
//!
//! gather (the hosts labelled for the cluster and the free ones, from the
//! shared cache) → plan (`sip::schedule`, pure) → steps (label writes,
//! each conditioned on the host's resourceVersion, so two clusters or two
//! leaders never claim one host) → services (server-side apply, owned by
//! the SIPCluster) → status. The labels are the record: nothing about which
//! host belongs where lives only in memory or in the status.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{EventType, Recorder};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use super::App;
use super::replacement_trace::TRACE_FLUSH_TIMEOUT;
use crate::api::conditions::set_condition;
use crate::api::metal3::BareMetalHost;
use crate::api::sip::{ChosenHost, ROLES, SIPCluster, SIPClusterStatus, ServiceEndpoint, labels};
use crate::drain::pods::selector_matches;
use crate::error::{Error, Result};
use crate::runtime::controller::{Action, Reconciler};
use crate::runtime::leader::LeaderHandle;
use crate::runtime::manager::{Manager, always};
use crate::runtime::store::{Key, ObjectKey, Store};
use crate::sip::hosts;
use crate::sip::schedule::{self, Candidate, ClusterPlan, HostState, Member, RoleView, RoleWants};
use crate::sip::services::{self, Backend, BmcHost, Existing, Owner, ServiceObjects};
use crate::sip::template::{Template, TemplateError};
use crate::telemetry::metrics::{Metrics, SipRoleLabels};
use crate::telemetry::trace::{self, SpanRecord, TraceParent};

/// Upstream's finalizer, so SIPClusters written for upstream keep working.
pub const FINALIZER: &str = "sip.airship.airshipit.org/finalizer";

/// How often a SIPCluster is looked at again without a change (services
/// drift, a missing Secret created).
const RECHECK: Duration = Duration::from_secs(30);

/// How soon a SIPCluster that is not Ready is looked at again.
const NOT_READY_RECHECK: Duration = Duration::from_secs(5);

/// The field manager of the service objects.
const MANAGER: &str = "nodewarden-sip";

/// Registers the SIPCluster controller. BareMetalHosts are watched:
/// a claimed host's change wakes its cluster, a free host's every cluster.
pub fn register(manager: &mut Manager, app: &App) {
    let mut c = manager.controller::<SIPCluster>("sipcluster", &app.objects);
    let clusters = c.store();
    let all = clusters.clone();
    c.watches(
        &app.objects,
        always(),
        move |h: &BareMetalHost| match claimed_by(h) {
            Some(key) => vec![key],
            None => all.keys(),
        },
    );
    let hosts = c.reads::<BareMetalHost>(&app.objects);
    c.on_failure(app.report_failures());
    c.register(SipReconciler {
        ctx: Arc::new(SipContext {
            client: app.client.clone(),
            leader: app.leader.clone(),
            recorder: app.recorder.clone(),
            metrics: app.metrics.clone(),
            hosts,
            claiming: tokio::sync::Mutex::new(()),
        }),
    });
}

/// The SIPCluster a host is labelled for.
fn claimed_by(host: &BareMetalHost) -> Option<Key<SIPCluster>> {
    let l = host.metadata.labels.as_ref()?;
    Some(Key::new(
        Some(l.get(labels::CLUSTER_NAMESPACE)?),
        l.get(labels::CLUSTER_NAME)?,
    ))
}

/// A host's id in plans and status: `namespace/name` (hosts may live in
/// several namespaces).
fn host_id(host: &BareMetalHost) -> String {
    format!("{}/{}", host.namespace().unwrap_or_default(), host.name_any())
}

/// The name part of a host id (what services call the host).
fn short_name(id: &str) -> &str {
    id.rsplit_once('/').map_or(id, |(_, n)| n)
}

fn is_free(host: &BareMetalHost) -> bool {
    host.labels().get(labels::CLUSTER_NAME).is_none()
}

/// Whether `host`, as read now, still belongs to `owner` (None: free), as
/// the round that decides to write it judged it.
fn still_owned_by(host: &BareMetalHost, owner: Option<&Key<SIPCluster>>) -> Result<()> {
    let now = claimed_by(host);
    let free_now = is_free(host);
    let as_judged = match owner {
        None => free_now,
        Some(key) => now.as_ref() == Some(key),
    };
    if as_judged {
        return Ok(());
    }
    let expected = owner.map_or("free".to_string(), |k| format!("claimed by {k}"));
    let found = match now {
        Some(k) => format!("claimed by {k}"),
        None if free_now => "free".to_string(),
        None => "labelled without a cluster namespace".to_string(),
    };
    Err(Error::Changed {
        kind: "BareMetalHost",
        name: host_id(host),
        reason: format!("expected {expected}, found {found}"),
    })
}

struct SipContext {
    client: Client,
    leader: LeaderHandle,
    recorder: Recorder,
    metrics: Metrics,
    hosts: Store<BareMetalHost>,
    /// One cluster claims at a time in this replica (upstream's serial
    /// processing); the resourceVersion preconditions guard across replicas.
    claiming: tokio::sync::Mutex<()>,
}

struct SipReconciler {
    ctx: Arc<SipContext>,
}

impl Reconciler for SipReconciler {
    type Object = SIPCluster;
    type Error = Error;

    async fn reconcile(&self, key: &Key<SIPCluster>, sip: Option<Arc<SIPCluster>>) -> Result<Action> {
        let Some(sip) = sip else {
            let k = key.untyped();
            self.ctx
                .metrics
                .forget_sip(k.namespace.as_deref().unwrap_or_default(), &k.name);
            return Ok(Action::Done);
        };
        if sip.metadata.deletion_timestamp.is_some() {
            self.finalize(&sip).await?;
            return Ok(Action::Done);
        }
        if !sip.finalizers().iter().any(|f| f == FINALIZER) {
            return self.add_finalizer(&sip).await.map(|_| Action::Done);
        }
        let started = SystemTime::now();
        let plan = {
            let _one_at_a_time = self.ctx.claiming.lock().await;
            let view = self.gather(&sip);
            let from_upstream = self.holds_hosts_from_upstream(key);
            let initial =
                |s: &SIPCluster| !from_upstream && s.status.as_ref().is_none_or(|s| s.hosts.is_empty());
            let mut plan = schedule::plan_cluster(&view, initial(&sip));
            if plan.held_back && plan.roles.iter().any(|p| !p.release.is_empty()) {
                // Giving hosts back is only right for a cluster that never had
                // them: make sure on a fresh read, not a cached status.
                let api: Api<SIPCluster> =
                    Api::namespaced(self.ctx.client.clone(), &sip.namespace().unwrap_or_default());
                let fresh = api.get(&sip.name_any()).await?;
                plan = schedule::plan_cluster(&view, initial(&fresh));
            }
            self.apply_hosts(&sip, &plan).await?;
            plan
        };
        let labelled = SystemTime::now();
        let members = result_hosts(&plan);
        let details = self.host_details(&sip, &members).await;
        let services = self.apply_services(&sip, &members, &details).await;
        let topology = self.topologies(&sip, &members);
        let status = status_for(&sip, &plan, &members, &details, &topology, &services);
        let ready = crate::api::conditions::is_true(&status.conditions, "Ready");
        self.write_status(&sip, status).await?;
        let times = Times {
            started,
            labelled,
            done: SystemTime::now(),
        };
        self.after(&sip, &plan, &times).await;
        // Not ready: a missing Secret or host may appear without an event here.
        Ok(Action::RequeueAfter(if ready {
            RECHECK
        } else {
            NOT_READY_RECHECK
        }))
    }
}

/// Every host the plan leaves the cluster with: (name, role, state).
fn result_hosts(plan: &ClusterPlan) -> Vec<(String, String, HostState)> {
    plan.roles
        .iter()
        .zip(ROLES)
        .flat_map(|(p, role)| {
            p.result
                .iter()
                .map(move |(n, s)| (n.clone(), role.to_string(), *s))
        })
        .collect()
}

/// What the services need of a host: its addresses and its BMC.
#[derive(Clone, Debug, Default)]
struct HostDetails {
    /// Network id → address.
    addresses: BTreeMap<String, String>,
    /// BMC management address, user, password.
    bmc: Option<(String, String, String)>,
    /// Why a record could not be read.
    problems: Vec<String>,
}

impl SipReconciler {
    /// Whether the cluster holds hosts upstream SIP claimed (they carry no
    /// state label): such a cluster had its hosts, whatever its status
    /// lists, and keeps them.
    fn holds_hosts_from_upstream(&self, key: &Key<SIPCluster>) -> bool {
        self.ctx
            .hosts
            .list()
            .iter()
            .any(|h| claimed_by(h).as_ref() == Some(key) && h.labels().get(labels::STATE).is_none())
    }

    /// Each role's wants, hosts and free candidates, from the cache.
    fn gather(&self, sip: &SIPCluster) -> Vec<RoleView> {
        let ns = sip.namespace().unwrap_or_default();
        let name = sip.name_any();
        let hosts = self.ctx.hosts.list();
        let mine = |h: &BareMetalHost| {
            h.labels().get(labels::CLUSTER_NAMESPACE) == Some(&ns)
                && h.labels().get(labels::CLUSTER_NAME) == Some(&name)
        };
        ROLES
            .iter()
            .map(|role| {
                let set = sip.spec.nodes.get(*role);
                let key = set.and_then(|s| s.topology_key.clone());
                let count = set.and_then(|s| s.count).unwrap_or_default();
                let selected = |h: &BareMetalHost| {
                    let empty = BTreeMap::new();
                    let l = h.metadata.labels.as_ref().unwrap_or(&empty);
                    set.is_some_and(|s| {
                        s.label_selector
                            .as_ref()
                            .is_none_or(|sel| selector_matches(sel, l))
                    })
                };
                let topology = |h: &BareMetalHost| key.as_ref().and_then(|k| h.labels().get(k).cloned());
                let members = hosts
                    .iter()
                    .filter(|h| {
                        mine(h) && h.labels().get(labels::NODE_TYPE).map(String::as_str) == Some(*role)
                    })
                    .map(|h| Member {
                        name: host_id(h),
                        state: HostState::from_label(h.labels().get(labels::STATE).map(String::as_str)),
                        topology: topology(h),
                        unusable: h
                            .unusable()
                            .or_else(|| (!selected(h)).then(|| format!("no longer selected for {role}"))),
                    })
                    .collect();
                let free = hosts
                    .iter()
                    .filter(|h| is_free(h) && h.unusable().is_none() && selected(h))
                    .map(|h| Candidate {
                        name: host_id(h),
                        topology: topology(h),
                    })
                    .collect();
                RoleView {
                    wants: RoleWants {
                        role: role.to_string(),
                        active: usize::try_from(count.active).unwrap_or(0),
                        standby: usize::try_from(count.standby).unwrap_or(0),
                        topology_key: key,
                    },
                    members,
                    free,
                }
            })
            .collect()
    }

    /// Each host's value of its role's topologyKey.
    fn topologies(
        &self,
        sip: &SIPCluster,
        members: &[(String, String, HostState)],
    ) -> BTreeMap<String, String> {
        members
            .iter()
            .filter_map(|(id, role, _)| {
                let key = sip.spec.nodes.get(role)?.topology_key.as_ref()?;
                let value = self.host(id)?.labels().get(key)?.clone();
                Some((id.clone(), value))
            })
            .collect()
    }

    /// Releases, restates and claims, each a label patch conditioned on the
    /// host's resourceVersion. A claim that loses a race undoes this
    /// round's claims and the round is retried on fresh state.
    async fn apply_hosts(&self, sip: &SIPCluster, plan: &ClusterPlan) -> Result<()> {
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

    fn host(&self, id: &str) -> Option<Arc<BareMetalHost>> {
        let (ns, name) = id.split_once('/')?;
        self.ctx.hosts.get(&ObjectKey::new(Some(ns), name))
    }

    /// Patches a host's labels on the resourceVersion the cache holds.
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
        still_owned_by(&current, owner)?;
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

    /// Addresses from each host's networkData Secret; BMC address and
    /// credentials from its BMC Secret.
    async fn host_details(
        &self,
        _sip: &SIPCluster,
        members: &[(String, String, HostState)],
    ) -> BTreeMap<String, HostDetails> {
        let mut out = BTreeMap::new();
        for (id, _, _) in members {
            let Some(host) = self.host(id) else {
                continue;
            };
            out.insert(id.clone(), self.details_of(&host).await);
        }
        out
    }

    async fn details_of(&self, host: &BareMetalHost) -> HostDetails {
        let host_ns = host.namespace().unwrap_or_default();
        let mut d = HostDetails::default();
        if let Some(nd) = &host.spec.network_data {
            let ns = nd.namespace.clone().unwrap_or_else(|| host_ns.clone());
            match self.secret(&ns, &nd.name).await {
                Ok(s) => match secret_value(&s, "networkData").map(|v| hosts::addresses(&v)) {
                    Some(Ok(a)) => d.addresses = a,
                    Some(Err(e)) => d.problems.push(format!("{}: {e}", host.name_any())),
                    None => d.problems.push(format!(
                        "{}: Secret {ns}/{} has no networkData",
                        host.name_any(),
                        nd.name
                    )),
                },
                Err(e) => d.problems.push(format!("{}: networkData {e}", host.name_any())),
            }
        }
        if let Some(bmc) = &host.spec.bmc {
            let ip = hosts::management_address(&bmc.address).unwrap_or_default();
            match self.secret(&host_ns, &bmc.credentials_name).await {
                Ok(s) => {
                    let get = |k| {
                        secret_value(&s, k)
                            .map(|v| String::from_utf8_lossy(&v).into_owned())
                            .unwrap_or_default()
                    };
                    d.bmc = Some((ip, get("username"), get("password")));
                }
                Err(e) => d
                    .problems
                    .push(format!("{}: BMC credentials {e}", host.name_any())),
            }
        }
        d
    }

    async fn secret(&self, ns: &str, name: &str) -> std::result::Result<Secret, String> {
        let api: Api<Secret> = Api::namespaced(self.ctx.client.clone(), ns);
        match api.get_opt(name).await {
            Ok(Some(s)) => Ok(s),
            Ok(None) => Err(format!("Secret {ns}/{name} not found")),
            Err(e) => Err(format!("Secret {ns}/{name}: {e}")),
        }
    }

    /// Applies every service's objects, taking over those already there
    /// (upstream SIP's), and deletes those of services no longer asked
    /// for. Returns the endpoints, or Ready's reason and what failed
    /// (naming the field or object).
    async fn apply_services(
        &self,
        sip: &SIPCluster,
        members: &[(String, String, HostState)],
        details: &BTreeMap<String, HostDetails>,
    ) -> std::result::Result<Vec<ServiceEndpoint>, Failures> {
        let ns = sip.namespace().unwrap_or_default();
        let owner = Owner {
            name: sip.name_any(),
            namespace: ns.clone(),
            reference: sip
                .controller_owner_ref(&())
                .ok_or_else(|| vec![(INFRA_FAILURE, "the SIPCluster has no uid".to_string())])?,
        };
        let mut keys = Vec::new();
        for (i, jh) in sip.spec.services.jump_host.iter().enumerate() {
            keys.push(match self.secret(&ns, &jh.node_ssh_private_keys).await {
                Ok(secret) => Ok(secret.data.unwrap_or_default().into_keys().collect()),
                Err(e) => Err(format!("spec.services.jumpHost[{i}].nodeSSHPrivateKeys: {e}")),
            });
        }
        let templates = Templates {
            control_plane: self.template(&ns, services::CONTROL_PLANE_TEMPLATE).await,
            worker: self.template(&ns, services::WORKER_TEMPLATE).await,
        };
        let Built {
            wanted,
            mut failures,
            kept,
        } = build_services(sip, &owner, members, details, &keys, &templates);
        for (_, why) in failures.iter().filter(|(r, _)| *r == TEMPLATE_NOT_RENDERED) {
            self.event(sip, EventType::Warning, TEMPLATE_NOT_RENDERED, why.clone());
        }
        let mut endpoints = Vec::new();
        let uid = owner.reference.uid.clone();
        for (kind, objects) in wanted {
            let name = objects.deployment.name_any();
            match self.apply_objects(&ns, objects.clone(), &uid).await {
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

    /// A load balancer's template from upstream's ConfigMap (None: there is
    /// none, nodewarden's configuration serves), or why it cannot be used.
    async fn template(
        &self,
        ns: &str,
        (name, key): (&str, &str),
    ) -> Option<std::result::Result<Template, String>> {
        let api: Api<ConfigMap> = Api::namespaced(self.ctx.client.clone(), ns);
        let found = api.get_opt(name).await;
        parse_template(ns, name, key, found.map_err(|e| e.to_string()))
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
            "{}={},app.kubernetes.io/managed-by=nodewarden",
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
            super::delete_if_present(api, &o.name_any(), &super::same_object(o.meta())).await?;
        }
        Ok(())
    }

    async fn write_status(&self, sip: &SIPCluster, status: SIPClusterStatus) -> Result<()> {
        if sip.status.as_ref() == Some(&status) {
            return Ok(());
        }
        self.ctx.leader.ensure_leader()?;
        let mut updated = sip.clone();
        updated.status = Some(status);
        let api: Api<SIPCluster> =
            Api::namespaced(self.ctx.client.clone(), &sip.namespace().unwrap_or_default());
        api.replace_status(&sip.name_any(), &PostParams::default(), &updated)
            .await?;
        Ok(())
    }

    /// Once written: a trace per replaced host, the metrics, the Events.
    async fn after(&self, sip: &SIPCluster, plan: &ClusterPlan, times: &Times) {
        let ns = sip.namespace().unwrap_or_default();
        let name = sip.name_any();
        let mut traced = false;
        for (p, role) in plan.roles.iter().zip(ROLES) {
            let wanted = sip
                .spec
                .nodes
                .get(role)
                .and_then(|s| s.count)
                .map(|c| usize::try_from(c.active + c.standby).unwrap_or(0))
                .unwrap_or(0);
            let count = |s: HostState| p.result.iter().filter(|(_, x)| *x == s).count();
            self.ctx.metrics.set_sip_hosts(
                &ns,
                &name,
                role,
                [
                    ("active", count(HostState::Active)),
                    ("standby", count(HostState::Standby)),
                    ("wanted", wanted),
                ],
            );
            for (old, new) in &p.replaced {
                self.ctx
                    .metrics
                    .sip_host_replacements
                    .get_or_create(&SipRoleLabels {
                        cluster_namespace: ns.clone(),
                        cluster: name.clone(),
                        role: role.to_string(),
                    })
                    .inc();
                let promoted = new
                    .as_ref()
                    .is_some_and(|n| p.restate.iter().any(|(r, _)| r == n));
                let tp = TraceParent::new_root();
                let phase = if promoted { "promote standby" } else { "claim host" };
                // The labels are written in one pass (releases first), then
                // the services: the phases share those two intervals.
                let Times {
                    started,
                    labelled,
                    done,
                } = *times;
                trace::emit_phase(&tp, SpanRecord::new("release failed host", started, labelled));
                trace::emit_phase(&tp, SpanRecord::new(phase, started, labelled));
                trace::emit_phase(&tp, SpanRecord::new("update services", labelled, done));
                trace::emit_root(
                    &tp,
                    SpanRecord::new("replace host", times.started, times.done)
                        .attr("nodewarden.sipcluster", format!("{ns}/{name}"))
                        .attr("nodewarden.role", role)
                        .attr("nodewarden.host.old", old.clone())
                        .attr("nodewarden.host.new", new.clone().unwrap_or_default()),
                );
                traced = true;
                let note = match new {
                    Some(n) => format!("{role} host {old} failed: {n} serves in its place"),
                    None => format!("{role} host {old} failed and no host can replace it"),
                };
                self.event(sip, EventType::Warning, "HostReplaced", note);
            }
        }
        if traced {
            trace::flush(TRACE_FLUSH_TIMEOUT).await;
        }
    }

    fn event(&self, sip: &SIPCluster, type_: EventType, reason: &str, note: String) {
        let event = super::event(type_, reason, "Schedule", &note);
        super::spawn_event(&self.ctx.recorder, event, sip.object_ref(&()));
    }

    async fn add_finalizer(&self, sip: &SIPCluster) -> Result<()> {
        self.ctx.leader.ensure_leader()?;
        let mut finalizers = sip.finalizers().to_vec();
        finalizers.push(FINALIZER.into());
        let patch =
            json!({"metadata": {"finalizers": finalizers, "resourceVersion": sip.resource_version()}});
        let api: Api<SIPCluster> =
            Api::namespaced(self.ctx.client.clone(), &sip.namespace().unwrap_or_default());
        api.patch(&sip.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// A deleted SIPCluster: every host labelled for it is released; its
    /// services go with it (owner references); then the finalizer comes off.
    async fn finalize(&self, sip: &SIPCluster) -> Result<()> {
        if !sip.finalizers().iter().any(|f| f == FINALIZER) {
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
        let finalizers: Vec<String> = sip
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect();
        let patch =
            json!({"metadata": {"finalizers": finalizers, "resourceVersion": sip.resource_version()}});
        let api: Api<SIPCluster> =
            Api::namespaced(self.ctx.client.clone(), &sip.namespace().unwrap_or_default());
        match api
            .patch(&sip.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// Ready's reason when a service could not be applied.
const INFRA_FAILURE: &str = "InfraServiceFailure";
/// Ready's reason when an object already there cannot be taken over.
const ADOPTION_BLOCKED: &str = "AdoptionBlocked";
/// Ready's reason when a load balancer's template cannot be rendered.
const TEMPLATE_NOT_RENDERED: &str = "TemplateNotRendered";

/// What failed with the services: (Ready's reason, what, naming it).
type Failures = Vec<(&'static str, String)>;

/// How applying a service's objects went.
enum Applied {
    /// Written; the objects taken over from someone else (upstream SIP).
    Done(Vec<String>),
    /// Not written: what already there cannot be taken over, and why.
    Blocked(String),
}

/// The load balancers' templates (None: nodewarden's configuration).
struct Templates {
    control_plane: Option<std::result::Result<Template, String>>,
    worker: Option<std::result::Result<Template, String>>,
}

/// A template from a ConfigMap as read (None: not there), or why it cannot
/// be used, naming the ConfigMap. There is no fallback to nodewarden's own
/// configuration once a ConfigMap is there: the user asked for theirs.
fn parse_template(
    ns: &str,
    name: &str,
    key: &str,
    found: std::result::Result<Option<ConfigMap>, String>,
) -> Option<std::result::Result<Template, String>> {
    let cm = match found {
        Ok(None) => return None,
        Ok(Some(cm)) => cm,
        Err(e) => return Some(Err(format!("ConfigMap {ns}/{name}: {e}"))),
    };
    let Some(source) = cm.data.as_ref().and_then(|d| d.get(key)) else {
        return Some(Err(format!("ConfigMap {ns}/{name} has no key {key}")));
    };
    Some(Template::parse(source).map_err(|e| format!("ConfigMap {ns}/{name} key {key}: {e}")))
}

/// The services to apply, what failed, and the names whose objects stay
/// (those applied, and those of a service that failed here, which keeps
/// what it had).
struct Built {
    wanted: Vec<(&'static str, ServiceObjects)>,
    failures: Failures,
    kept: BTreeSet<String>,
}

impl Built {
    /// A load balancer's objects, or it is left out (keeping what it had)
    /// and why is told.
    fn load_balancer(
        &mut self,
        kind: &'static str,
        name: String,
        objects: std::result::Result<ServiceObjects, String>,
    ) {
        match objects {
            Ok(o) => self.wanted.push((kind, o)),
            Err(e) => self
                .failures
                .push((TEMPLATE_NOT_RENDERED, format!("{kind} {name}: {e}"))),
        }
        self.kept.insert(name);
    }
}

/// A load balancer built with its template, if any; what fails names the
/// ConfigMap and key.
fn with_template(
    ns: &str,
    template: &Option<std::result::Result<Template, String>>,
    (cm, key): (&str, &str),
    build: impl FnOnce(Option<&Template>) -> std::result::Result<ServiceObjects, TemplateError>,
) -> std::result::Result<ServiceObjects, String> {
    match template {
        None => build(None).map_err(|e| e.to_string()),
        Some(Ok(t)) => build(Some(t)).map_err(|e| format!("ConfigMap {ns}/{cm} key {key}: {e}")),
        Some(Err(e)) => Err(e.clone()),
    }
}

/// Every service's objects (pure): the load balancers' backends are the
/// role's active hosts, the jump host lists every host with its BMC.
/// `keys`: per jump host, the names in its key Secret or why there are none
/// (that jump host is left out and the reason returned); `templates`: the
/// load balancers' templates, if any (one that fails leaves its load
/// balancer out, and says why).
fn build_services(
    sip: &SIPCluster,
    owner: &Owner,
    members: &[(String, String, HostState)],
    details: &BTreeMap<String, HostDetails>,
    keys: &[std::result::Result<Vec<String>, String>],
    templates: &Templates,
) -> Built {
    let address = |id: &str, interface: &Option<String>| {
        interface
            .as_ref()
            .and_then(|i| details.get(id).and_then(|d| d.addresses.get(i).cloned()))
    };
    let backends = |role: &str, interface: &Option<String>| -> Vec<Backend> {
        members
            .iter()
            .filter(|(_, r, s)| r == role && *s == HostState::Active)
            .map(|(n, _, _)| Backend {
                name: short_name(n).to_string(),
                ip: address(n, interface),
            })
            .collect()
    };
    let s = &sip.spec.services;
    let mut built = Built {
        wanted: Vec::new(),
        failures: Vec::new(),
        kept: BTreeSet::new(),
    };
    let ns = &owner.namespace;
    for (i, lb) in s.load_balancer_control_plane.iter().enumerate() {
        let b = backends("ControlPlane", &lb.common.node_interface_id);
        let name = services::instance_name("loadbalancer-controlplane", owner, i);
        let t = &templates.control_plane;
        let objects = with_template(ns, t, services::CONTROL_PLANE_TEMPLATE, |t| {
            services::load_balancer_control_plane(owner, i, lb, &b, t)
        });
        built.load_balancer("loadBalancerControlPlane", name, objects);
    }
    for (i, lb) in s.load_balancer_worker.iter().enumerate() {
        let b = backends("Worker", &lb.common.node_interface_id);
        let name = services::instance_name("loadbalancer-worker", owner, i);
        let objects = with_template(ns, &templates.worker, services::WORKER_TEMPLATE, |t| {
            services::load_balancer_worker(owner, i, lb, &b, t)
        });
        built.load_balancer("loadBalancerWorker", name, objects);
    }
    for ((i, jh), keys) in s.jump_host.iter().enumerate().zip(keys) {
        // A jump host whose key Secret is missing keeps what it had.
        built.kept.insert(services::instance_name("jumphost", owner, i));
        let keys = match keys {
            Ok(k) => k,
            Err(e) => {
                built.failures.push((INFRA_FAILURE, e.clone()));
                continue;
            }
        };
        let hosts: Vec<BmcHost> = members
            .iter()
            .filter_map(|(n, _, _)| {
                let (bmc_ip, username, password) = details.get(n)?.bmc.clone()?;
                Some(BmcHost {
                    name: short_name(n).to_string(),
                    ip: address(n, &jh.common.node_interface_id),
                    bmc_ip,
                    username,
                    password,
                })
            })
            .collect();
        built
            .wanted
            .push(("jumpHost", services::jump_host(owner, i, jh, &hosts, keys)));
    }
    built
}

/// When a reconcile started, finished its label writes, finished.
#[derive(Clone, Copy)]
struct Times {
    started: SystemTime,
    labelled: SystemTime,
    done: SystemTime,
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

fn secret_value(secret: &Secret, key: &str) -> Option<Vec<u8>> {
    if let Some(v) = secret.data.as_ref().and_then(|d| d.get(key)) {
        return Some(v.0.clone());
    }
    secret
        .string_data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|v| v.clone().into_bytes())
}

/// The status: hosts, services, counts and Ready with upstream's reasons.
fn status_for(
    sip: &SIPCluster,
    plan: &ClusterPlan,
    members: &[(String, String, HostState)],
    details: &BTreeMap<String, HostDetails>,
    topology: &BTreeMap<String, String>,
    services: &std::result::Result<Vec<ServiceEndpoint>, Failures>,
) -> SIPClusterStatus {
    let mut status = sip.status.clone().unwrap_or_default();
    let generation = sip.metadata.generation;
    status.observed_generation = generation;
    // The address shown is the one on the services' interface.
    let s = &sip.spec.services;
    let interface = s
        .load_balancer_control_plane
        .iter()
        .map(|x| &x.common)
        .chain(s.load_balancer_worker.iter().map(|x| &x.common))
        .chain(s.jump_host.iter().map(|x| &x.common))
        .find_map(|c| c.node_interface_id.clone());
    status.hosts = members
        .iter()
        .map(|(id, role, state)| ChosenHost {
            name: id.clone(),
            role: role.clone(),
            state: state.as_str().into(),
            topology: topology.get(id).cloned(),
            ip: interface
                .as_ref()
                .and_then(|i| details.get(id).and_then(|d| d.addresses.get(i).cloned())),
        })
        .collect();
    status.services = services.clone().unwrap_or_default();
    let summary = |role: &str| {
        let set = sip.spec.nodes.get(role)?;
        let c = set.count.unwrap_or_default();
        let of = |s: HostState| members.iter().filter(|(_, r, x)| r == role && *x == s).count();
        Some(format!(
            "{}/{} (+{}/{})",
            of(HostState::Active),
            c.active,
            of(HostState::Standby),
            c.standby
        ))
    };
    status.control_plane = summary("ControlPlane");
    status.workers = summary("Worker");
    let shortfalls: Vec<&str> = plan.roles.iter().filter_map(|p| p.shortfall.as_deref()).collect();
    let problems: Vec<&String> = details.values().flat_map(|d| d.problems.iter()).collect();
    let (ok, reason, message) = if !shortfalls.is_empty() {
        let held = if plan.held_back {
            "; no host claimed until all fit"
        } else {
            ""
        };
        (false, "Unschedulable", format!("{}{held}", shortfalls.join("; ")))
    } else if let Err(failures) = services {
        // The most telling reason: a takeover or template problem the
        // user must resolve before a plain infrastructure failure.
        let reason = [ADOPTION_BLOCKED, TEMPLATE_NOT_RENDERED]
            .into_iter()
            .find(|r| failures.iter().any(|(f, _)| f == r))
            .unwrap_or(INFRA_FAILURE);
        let words: Vec<&str> = failures.iter().map(|(_, m)| m.as_str()).collect();
        (false, reason, words.join("; "))
    } else if !problems.is_empty() {
        let p: Vec<&str> = problems.iter().map(|s| s.as_str()).collect();
        (
            false,
            "InfraServiceFailure",
            format!("host records: {}", p.join("; ")),
        )
    } else {
        (
            true,
            "ReconciliationSucceeded",
            format!(
                "{} hosts chosen, {} services running",
                members.len(),
                status.services.len()
            ),
        )
    };
    set_condition(
        &mut status.conditions,
        "Ready",
        ok,
        reason,
        message,
        generation,
        Timestamp::now(),
    );
    status
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

    fn host(cluster: Option<(&str, &str)>) -> BareMetalHost {
        let mut labels = serde_json::Map::new();
        if let Some((ns, name)) = cluster {
            labels.insert(labels::CLUSTER_NAMESPACE.into(), ns.into());
            labels.insert(labels::CLUSTER_NAME.into(), name.into());
        }
        serde_json::from_value(json!({
            "apiVersion": "metal3.io/v1alpha1",
            "kind": "BareMetalHost",
            "metadata": {"name": "h", "namespace": "metal", "labels": labels},
            "spec": {},
        }))
        .expect("a host")
    }

    /// A host is written only as the round judged it: a claim needs it free
    /// still, a restate or release needs it still the cluster's — never
    /// another cluster's that claimed it since.
    #[test]
    fn a_host_is_written_only_as_it_was_judged() {
        let alpha = Key::<SIPCluster>::new(Some("sip"), "alpha");
        let beta = Key::<SIPCluster>::new(Some("sip"), "beta");
        // (what, host now, owner the round judged, written)
        let cases = [
            ("claim of a free host", host(None), None, true),
            (
                "claim of a host alpha took since",
                host(Some(("sip", "alpha"))),
                None,
                false,
            ),
            (
                "alpha restates its own host",
                host(Some(("sip", "alpha"))),
                Some(&alpha),
                true,
            ),
            (
                "alpha releases a host beta holds now",
                host(Some(("sip", "beta"))),
                Some(&alpha),
                false,
            ),
            (
                "alpha releases a host released since",
                host(None),
                Some(&alpha),
                false,
            ),
            (
                "same name, other namespace",
                host(Some(("other", "alpha"))),
                Some(&alpha),
                false,
            ),
            ("beta's own", host(Some(("sip", "beta"))), Some(&beta), true),
        ];
        for (what, h, owner, written) in cases {
            let result = still_owned_by(&h, owner);
            assert_eq!(result.is_ok(), written, "{what}: {result:?}");
            if let Err(e) = result {
                assert_eq!(e.category(), crate::error::Category::Conflict, "{what}");
                assert!(e.to_string().contains("metal/h"), "{what}: {e}");
            }
        }
    }

    /// (the ConfigMap as read, the template used or what is said).
    #[test]
    fn a_template_configmap_is_used_or_named_never_passed_over() {
        let cm = |data: serde_json::Value| -> Option<ConfigMap> {
            Some(
                serde_json::from_value(json!({"metadata": {"name": "loadbalancerworker"}, "data": data}))
                    .expect("a cm"),
            )
        };
        let key = "loadBalancerWorker.cfg";
        type Read = std::result::Result<Option<ConfigMap>, String>;
        type Case<'a> = (&'a str, Read, Option<std::result::Result<(), &'a str>>);
        let cases: [Case; 5] = [
            ("none there: nodewarden's own", Ok(None), None),
            ("a template", Ok(cm(json!({key: "bind *:{{ 1 }}"}))), Some(Ok(()))),
            (
                "without the key",
                Ok(cm(json!({"other": "x"}))),
                Some(Err(
                    "ConfigMap sip/loadbalancerworker has no key loadBalancerWorker.cfg",
                )),
            ),
            (
                "an unsupported construct",
                Ok(cm(json!({key: "x\n{{ len .Servers }}"}))),
                Some(Err(
                    "ConfigMap sip/loadbalancerworker key loadBalancerWorker.cfg: line 2: the function `len`",
                )),
            ),
            (
                "not readable",
                Err("403 Forbidden".into()),
                Some(Err("ConfigMap sip/loadbalancerworker: 403 Forbidden")),
            ),
        ];
        for (what, found, want) in cases {
            let got = parse_template("sip", "loadbalancerworker", key, found);
            match (got, want) {
                (None, None) | (Some(Ok(_)), Some(Ok(()))) => {}
                (Some(Err(e)), Some(Err(w))) => assert!(e.starts_with(w), "{what}: {e}"),
                (got, _) => panic!("{what}: {got:?}"),
            }
        }
    }
}
