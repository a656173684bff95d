//! SIPCluster controller: chooses each role's BareMetalHosts, keeps that
//! set healthy as hosts fail, and runs the cluster's support services.
//!
//! A reconcile, by phase: gather (the hosts labelled for the cluster and the
//! free ones, from the shared cache; the hosts' Secrets; the templates) →
//! decide (`sip::schedule`'s plan, the services' objects, Ready: pure) → act
//! (label writes, each conditioned on the host's resourceVersion, so two
//! clusters or two leaders never claim one host; the services by server-side
//! apply, owned by the SIPCluster) → report (status, metrics, traces,
//! Events). The labels are the record: nothing about which host belongs
//! where lives only in memory or in the status.

mod act;
mod decide;
mod gather;
pub mod metrics;
mod report;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use kube::api::Api;
use kube::runtime::events::{EventType, Recorder};
use kube::{Client, ResourceExt};

use super::{App, finalizer};
use crate::api::metal3::BareMetalHost;
use crate::api::sip::{SIPCluster, ServiceEndpoint, labels};
use crate::error::{Error, Result};
use crate::runtime::controller::{Action, Reconciler};
use crate::runtime::leader::LeaderHandle;
use crate::runtime::manager::{ControllerBuilder, Manager, Source, always, changed};
use crate::runtime::store::{Key, Store};
use crate::sip::schedule::{self, ClusterPlan, HostState};
use crate::sip::services;
use decide::{Failures, TEMPLATE_NOT_RENDERED};
use gather::HostDetails;
use metrics::SipMetrics;

pub use act::{claim_labels, host_patch, release_labels};

/// Upstream's finalizer, so SIPClusters written for upstream keep working.
pub const FINALIZER: &str = "sip.airship.airshipit.org/finalizer";

/// How soon a Ready SIPCluster is looked at again without a change. What it
/// makes (its service objects), its hosts and its template ConfigMaps are
/// watched; the hosts' networkData and BMC Secrets and the jump hosts' key
/// Secrets are only read: any Secret may be one, and a watch of every
/// Secret of the cluster would cache every credential in it. A change of
/// theirs shows this late (or at the next change of the SIPCluster).
const RESYNC: Duration = Duration::from_secs(600);

/// How soon a SIPCluster that is not Ready is looked at again: what it
/// waits for may come without an event (a Secret created, an object
/// another controller holds let go).
const NOT_READY_RECHECK: Duration = Duration::from_secs(5);

/// The label of every service object nodewarden made (beside
/// [`services::CLUSTER_LABEL`]).
const MANAGED_BY: &str = "app.kubernetes.io/managed-by=nodewarden";

/// How often metal3's API is looked for while it is not installed
/// (`--sip auto`).
pub const METAL3_RETRY: Duration = Duration::from_secs(30);

/// Registers the SIPCluster controller. BareMetalHosts are watched:
/// a claimed host's change wakes its cluster, a free host's every cluster.
/// The service objects wake the SIPCluster that controls them, and a
/// template ConfigMap the SIPClusters of its namespace that render with it.
/// With `--sip auto` metal3's API may come later: the controller starts
/// once it is served.
pub fn register(manager: &mut Manager, app: &App) {
    if app.bare_metal == super::BareMetal::WhenInstalled {
        manager.optional::<BareMetalHost>(&app.objects, METAL3_RETRY);
    }
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
    watch_services(&mut c);
    watch_templates(&mut c, &clusters);
    c.on_failure(app.report_failures());
    c.register(SipReconciler {
        ctx: Arc::new(SipContext {
            client: app.client.clone(),
            leader: app.leader.clone(),
            recorder: app.recorder.clone(),
            metrics: SipMetrics::register(&app.metrics),
            hosts,
            claiming: tokio::sync::Mutex::new(()),
        }),
    });
}

/// Each service object deleted or changed behind the controller's back
/// wakes its SIPCluster, which applies it again at once. Only the objects
/// nodewarden made are watched (their labels select them), not every
/// Deployment, Service, Secret and ConfigMap of the cluster.
fn watch_services(c: &mut ControllerBuilder<'_, SIPCluster>) {
    let made = Source::labelled(Some(format!("{MANAGED_BY},{}", services::CLUSTER_LABEL)));
    // A Deployment's status moves with its pods: only its spec (the
    // generation), labels and owners are what nodewarden wrote.
    let written = |d: &Deployment| {
        let m = &d.metadata;
        (m.generation, m.labels.clone(), m.owner_references.clone())
    };
    c.owns::<Deployment>(&made, changed(written));
    // Every update of these is of what was written: a Secret and a
    // ConfigMap have no status, a NodePort Service none that changes.
    c.owns::<Service>(&made, always());
    c.owns::<Secret>(&made, always());
    c.owns::<ConfigMap>(&made, always());
}

/// A template ConfigMap (upstream's name, in a SIPCluster's namespace)
/// wakes the SIPClusters of its namespace that render a load balancer with
/// it: a user who edits a template sees it applied at once, not at the next
/// resync. Each watch is of one name across namespaces, so only these
/// ConfigMaps are cached, not every ConfigMap of the cluster.
fn watch_templates(c: &mut ControllerBuilder<'_, SIPCluster>, clusters: &Store<SIPCluster>) {
    for (name, _) in [services::CONTROL_PLANE_TEMPLATE, services::WORKER_TEMPLATE] {
        let clusters = clusters.clone();
        let source = Source {
            field_selector: Some(format!("metadata.name={name}")),
            ..Source::default()
        };
        c.watches(&source, always(), move |cm: &ConfigMap| {
            let ns = cm.namespace();
            let renders = |s: &SIPCluster| s.namespace() == ns && decide::renders_with(s, name);
            clusters
                .list()
                .iter()
                .filter(|s| renders(s))
                .filter_map(|s| Key::of(s.as_ref()))
                .collect()
        });
    }
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

fn is_free(host: &BareMetalHost) -> bool {
    host.labels().get(labels::CLUSTER_NAME).is_none()
}

struct SipContext {
    client: Client,
    leader: LeaderHandle,
    recorder: Recorder,
    metrics: SipMetrics,
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
        if !finalizer::holds(sip.as_ref(), FINALIZER) {
            return self.add_finalizer(&sip).await.map(|_| Action::Done);
        }
        let started = SystemTime::now();
        let plan = self.schedule_hosts(key, &sip).await?;
        let labelled = SystemTime::now();
        let members = decide::result_hosts(&plan);
        let details = self.host_details(&members).await;
        let services = self.run_services(&sip, &members, &details).await;
        let topology = self.topologies(&sip, &members);
        let status = report::status_for(&sip, &plan, &members, &details, &topology, &services);
        let ready = crate::api::conditions::is_true(&status.conditions, "Ready");
        self.write_status(&sip, status).await?;
        let times = report::Times {
            started,
            labelled,
            done: SystemTime::now(),
        };
        self.publish_round(&sip, &plan, &times).await;
        Ok(Action::RequeueAfter(if ready {
            RESYNC
        } else {
            NOT_READY_RECHECK
        }))
    }
}

impl SipReconciler {
    /// The hosts' plan, written: gathered from the cache, decided, and the
    /// label writes made, one cluster at a time in this replica.
    async fn schedule_hosts(&self, key: &Key<SIPCluster>, sip: &SIPCluster) -> Result<ClusterPlan> {
        let _one_at_a_time = self.ctx.claiming.lock().await;
        let view = self.role_views(sip);
        let from_upstream = self.holds_hosts_from_upstream(key);
        let mut plan = schedule::plan_cluster(&view, decide::is_initial(sip, from_upstream));
        if decide::gives_hosts_back(&plan) {
            // Giving hosts back is only right for a cluster that never had
            // them: make sure on a fresh read, not a cached status.
            let api: Api<SIPCluster> =
                Api::namespaced(self.ctx.client.clone(), &sip.namespace().unwrap_or_default());
            let fresh = api.get(&sip.name_any()).await?;
            plan = schedule::plan_cluster(&view, decide::is_initial(&fresh, from_upstream));
        }
        self.apply_hosts(sip, &plan).await?;
        Ok(plan)
    }

    /// The services: their inputs read, their objects built, applied (and
    /// those no longer asked for deleted). Returns the endpoints, or Ready's
    /// reason and what failed (naming the field or object).
    async fn run_services(
        &self,
        sip: &SIPCluster,
        members: &[(String, String, HostState)],
        details: &BTreeMap<String, HostDetails>,
    ) -> std::result::Result<Vec<ServiceEndpoint>, Failures> {
        let owner = decide::owner(sip)?;
        let inputs = self.service_inputs(sip).await;
        let built = decide::build_services(sip, &owner, members, details, &inputs);
        for (_, why) in built.failures.iter().filter(|(r, _)| *r == TEMPLATE_NOT_RENDERED) {
            self.event(sip, EventType::Warning, TEMPLATE_NOT_RENDERED, why.clone());
        }
        self.apply_services(sip, &owner, built).await
    }
}
