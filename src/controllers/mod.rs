//! One controller per file (a large one a directory, a module per phase:
//! `node_version`); each splits pure decisions from thin IO, and
//! declares in its `register` function what it reconciles, watches and reads.
//! Adding a controller is a new file here plus one line in [`register_all`].

pub mod autoscaling_strategy;
pub mod finalizer;
pub mod joining_node;
pub mod no_cloud;
pub mod node_maintenance;
pub mod node_version;
pub mod pending_node;
pub mod plan;
pub mod replacement_trace;
pub mod scaling_group;
pub mod sip_cluster;
#[cfg(test)]
mod write_guards;

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, NodeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;
use kube::api::{Api, DeleteParams, ObjectMeta, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use crate::cloud::CloudProvider;
use crate::drain::DrainEngine;
use crate::runtime::controller::{FailureReporter, Object, Predicate};
use crate::runtime::error::Category;
use crate::runtime::leader::LeaderHandle;
use crate::runtime::manager::{Manager, Source};
use crate::runtime::reflector::Event as StoreEvent;
use crate::telemetry::Metrics;

/// Whether the SIPCluster controller runs (`--sip`): it needs metal3's
/// BareMetalHost API.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BareMetal {
    /// Not served.
    #[default]
    Off,
    /// Served; metal3's API must be installed (/readyz waits for it).
    On,
    /// Served once metal3's API is installed, also when that happens after
    /// the start: until then SIPClusters wait and /readyz does not.
    WhenInstalled,
}

/// What every controller may need besides its stores.
#[derive(Clone)]
pub struct App {
    /// The API client.
    pub client: Client,
    /// This replica's leadership: checked right before anything disruptive.
    pub leader: LeaderHandle,
    /// The process's metrics.
    pub metrics: Metrics,
    /// Publishes Events as this replica.
    pub recorder: Recorder,
    /// The Nodes this operator manages.
    pub nodes: Source,
    /// The nodewarden objects this operator handles.
    pub objects: Source,
    /// The cloud that replaces nodes; None: no rolling replacement.
    pub cloud: Option<Arc<dyn CloudProvider>>,
    /// etcd, whose members retired control-plane nodes lose.
    pub etcd: crate::etcd::EtcdSetup,
    /// Constellation's upgrade-agent (None: not mounted).
    pub upgrade_agent: Option<crate::upgrade_agent::AgentClient>,
    /// NodeMaintenance settings.
    pub maintenance: node_maintenance::MaintenanceConfig,
    /// Plan settings.
    pub plans: plan::PlanConfig,
    /// The rollout settings a NodeVersion that leaves a field out gets.
    pub rollout: crate::api::update::Rollout,
    /// Whether SIPClusters are served (over metal3's BareMetalHosts).
    pub bare_metal: BareMetal,
    /// The drains this replica runs (NodeMaintenances' and so rollouts').
    pub drains: DrainEngine,
}

impl App {
    /// The context of the controllers a Manager runs.
    pub fn new(manager: &Manager, metrics: Metrics) -> Self {
        let leader = manager.leader();
        let reporter = Reporter {
            controller: "nodewarden".into(),
            instance: Some(leader.identity().to_string()),
        };
        App {
            client: manager.client().clone(),
            recorder: Recorder::new(manager.client().clone(), reporter),
            leader,
            metrics,
            nodes: Source::all(),
            objects: Source::all(),
            cloud: None,
            etcd: Default::default(),
            upgrade_agent: None,
            maintenance: Default::default(),
            plans: Default::default(),
            rollout: Default::default(),
            bare_metal: BareMetal::Off,
            drains: DrainEngine::new(manager.client().clone(), manager.leader()),
        }
    }

    /// A failed reconcile becomes a Warning Event on its object, with the
    /// error's category as reason and its message as note.
    pub fn report_failures<K: Object>(&self) -> FailureReporter<K> {
        let recorder = self.recorder.clone();
        Arc::new(move |object: &K, category: Category, message: &str| {
            let event = event(EventType::Warning, &category.to_string(), "Reconcile", message);
            spawn_event(&recorder, event, object.object_ref(&()));
        })
    }
}

/// An Event: its type, reason, the action it concerns and a note cut to
/// 1024 characters (the events API refuses longer ones).
pub fn event(type_: EventType, reason: &str, action: &str, note: &str) -> Event {
    Event {
        type_,
        reason: reason.into(),
        note: Some(note.chars().take(1024).collect()),
        action: action.into(),
        secondary: None,
    }
}

/// Publishes `event` on `reference` in the background: an Event that cannot
/// be written is logged, never a reason to fail or slow a reconcile.
pub fn spawn_event(
    recorder: &Recorder,
    event: Event,
    reference: k8s_openapi::api::core::v1::ObjectReference,
) {
    let recorder = recorder.clone();
    tokio::spawn(async move {
        if let Err(e) = recorder.publish(&event, &reference).await {
            tracing::debug!(error = %e, reason = %event.reason, "publishing an event failed");
        }
    });
}

/// Registers every controller that `app` can run: maintenance and upgrade
/// plans always, the rolling replacement when a cloud is configured (else
/// NodeVersions are told that none is).
pub fn register_all(manager: &mut Manager, app: &App) {
    manager.transform::<Node>(crate::node::strip_node);
    node_maintenance::register(manager, app);
    plan::register(manager, app);
    if app.bare_metal != BareMetal::Off {
        sip_cluster::register(manager, app);
    }
    if app.cloud.is_some() {
        node_version::register(manager, app);
        pending_node::register(manager, app);
        scaling_group::register(manager, app);
        autoscaling_strategy::register(manager, app);
        joining_node::register(manager, app);
    } else {
        no_cloud::register(manager, app);
    }
}

/// What of a Node the controllers act on: labels, annotations, spec
/// (cordon, taints, provider ID), readiness and deletion. A status heartbeat
/// or an image list change is none of it.
type NodeView<'a> = (
    Option<&'a BTreeMap<String, String>>,
    Option<&'a BTreeMap<String, String>>,
    Option<&'a NodeSpec>,
    Option<&'a Time>,
    bool,
);

fn node_view(node: &Node) -> NodeView<'_> {
    (
        node.metadata.labels.as_ref(),
        node.metadata.annotations.as_ref(),
        node.spec.as_ref(),
        node.metadata.deletion_timestamp.as_ref(),
        crate::node::node_is_ready(node),
    )
}

/// Lets through only the Node changes that matter (see [`node_view`]).
pub fn node_changed() -> Predicate<Node> {
    Arc::new(|event: &StoreEvent<Node>| match event {
        StoreEvent::Updated { old, new } => node_view(old) != node_view(new),
        StoreEvent::Added(_) | StoreEvent::Deleted(_) => true,
    })
}

/// Deletes `name`; an object that is already gone counts as deleted.
/// Returns whether this call deleted it (false: it was gone already).
pub async fn delete_if_present<K>(
    api: &Api<K>,
    name: &str,
    params: &DeleteParams,
) -> crate::error::Result<bool>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Delete parameters that delete only the object `meta` describes: its UID
/// as precondition. A delete that lands late, after its name went to a new
/// object, answers 409 instead of deleting that one (see `write_guards`).
pub fn same_object(meta: &ObjectMeta) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: meta.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    }
}

/// Delete parameters that delete the object `meta` describes only as it
/// was read: its UID and resourceVersion as preconditions (409 otherwise).
pub fn same_version(meta: &ObjectMeta) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
        }),
        ..Default::default()
    }
}
