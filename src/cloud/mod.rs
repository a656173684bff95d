//! The cloud behind the nodes: the provider trait the rollout controller uses
//! to create, delete and inspect instances of scaling groups, and its
//! implementations.
//!
//! The trait is the one seam between nodewarden and an infrastructure API.
//! It follows what Constellation's node operator needs from GCP managed
//! instance groups, Azure scale sets and AWS auto scaling groups (its clients
//! are in `operators/constellation-node-operator/internal/cloud/` of
//! <https://github.com/edgelesssys/constellation>), so those providers — and
//! a bare-metal host provider, whose "groups" are host pools — can implement
//! it without changing it. Extension points are request structs and
//! [`CloudError::Unsupported`], never new trait parameters.
//!
//! - [`decorator`]: the base of the wrappers below: each states only what
//!   it does around a call.
//! - [`batch`]: a provider wrapper that answers the state reads made at once
//!   with one call, where the provider can.
//! - [`error`]: [`CloudError`], what every provider's failures map onto.
//! - [`metered`]: a provider wrapper that shares one rate limit and reports
//!   every call's latency and errors.
//! - [`retry`]: a provider wrapper that retries transient failures of reads.
//! - [`sim`]: the `sim` provider, an HTTP client of the `nodewarden-simcloud`
//!   binary; [`sim::wire`] is the protocol it speaks (the
//!   `nodewarden-simwire` crate). The simulator itself is the
//!   `nodewarden-simcloud` crate, which this library does not depend on.
//!
//! The cloud's vocabulary ([`ScalingGroup`], [`GroupRole`], [`InstanceState`])
//! is defined in `nodewarden-simwire`, because the sim-cloud's answers carry
//! it as it is, and re-exported here as the provider trait's.

pub mod aws;
pub mod azure;
pub mod batch;
pub mod decorator;
pub mod error;
pub mod form;
pub mod gcp;
pub mod http;
pub mod metered;
pub mod retry;
pub mod sim;

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

pub use decorator::CloudOperation;
pub use error::CloudError;
pub use nodewarden_simwire::{GroupRole, InstanceState, ScalingGroup};

/// What every provider call returns: a boxed future, so the trait stays
/// object-safe and is used as `Arc<dyn CloudProvider>`.
pub type CloudFuture<'a, T> = BoxFuture<'a, Result<T, CloudError>>;

/// An infrastructure API that runs nodes in scaling groups.
///
/// Nodes are named by their provider ID (the Node's `spec.providerID`, e.g.
/// `gce://project/zone/instance`, `aws:///zone/i-0abc`, `sim://group/instance`).
/// A provider is built for one cluster: listing groups returns that cluster's
/// groups only (Constellation lists them by cluster UID).
///
/// Calls do not retry inside: a failure comes back at once, and
/// [`CloudError::retryable`] tells the caller whether its own backoff should
/// try again. This keeps every retry visible in the work queue's metrics.
pub trait CloudProvider: Send + Sync {
    /// A short stable name for logs and metrics: `sim`, `gcp`, `aws`, ...
    fn name(&self) -> &str;

    /// Starts one new instance in a group. Returns as soon as the cloud
    /// accepted it: the instance is usually still `Creating`, and its Node
    /// joins later. Providers that can, honour `request.request_id` as an
    /// idempotency key (a repeated request returns the same instance), so a
    /// create whose answer was lost does not leak a second instance.
    fn create_node<'a>(&'a self, request: &'a CreateNodeRequest) -> CloudFuture<'a, CreatedNode>;

    /// Asks the cloud to delete an instance. Deleting an instance that is
    /// already terminating or terminated succeeds; one the cloud has no
    /// record of is [`CloudError::NotFound`].
    fn delete_node<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, ()>;

    /// The instance's state in the cloud.
    ///
    /// `Terminated` is returned only when the provider knows the instance
    /// existed and is gone. An instance the cloud has no record of is
    /// [`CloudError::NotFound`]: it may be gone long ago, or not visible yet
    /// (clouds are eventually consistent after a create). Constellation
    /// counted "not found" as Terminated and so reported nodes that did not
    /// exist yet as terminated; here the caller decides with what it knows
    /// (a Leave may count it as done, a Join must keep waiting).
    fn node_state<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, InstanceState>;

    /// How many instances [`node_states`](Self::node_states) asks about in
    /// one call to the cloud; 1 (the default) when it asks one by one.
    fn states_per_call(&self) -> usize {
        1
    }

    /// The states of `provider_ids`, in one call where the cloud can (see
    /// [`states_per_call`](Self::states_per_call)); at most that many IDs.
    /// An instance the cloud has no record of is left out of the answer
    /// (what [`node_state`](Self::node_state) calls NotFound).
    ///
    /// The default asks one by one.
    fn node_states<'a>(
        &'a self,
        provider_ids: &'a [String],
    ) -> CloudFuture<'a, BTreeMap<String, InstanceState>> {
        states_one_by_one(self, provider_ids)
    }

    /// The OS image the instance runs.
    fn node_image<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, String>;

    /// The ID of the scaling group the instance belongs to.
    fn node_group<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, String>;

    /// The image new instances of the group boot from (its instance template,
    /// launch template or scale set model).
    fn group_image<'a>(&'a self, group_id: &'a str) -> CloudFuture<'a, String>;

    /// Changes the image new instances of the group boot from. Existing
    /// instances keep theirs: replacing them is the rollout's job.
    fn set_group_image<'a>(&'a self, group_id: &'a str, image: &'a str) -> CloudFuture<'a, ()>;

    /// Every scaling group of this cluster.
    fn list_groups(&self) -> CloudFuture<'_, Vec<ScalingGroup>>;
}

/// [`CloudProvider::node_states`] by one [`CloudProvider::node_state`] call
/// per ID.
pub fn states_one_by_one<'a, P: CloudProvider + ?Sized>(
    provider: &'a P,
    provider_ids: &'a [String],
) -> CloudFuture<'a, BTreeMap<String, InstanceState>> {
    Box::pin(async move {
        let mut states = BTreeMap::new();
        for id in provider_ids {
            match provider.node_state(id).await {
                Ok(state) => {
                    states.insert(id.clone(), state);
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(states)
    })
}

/// A request for one new instance. A struct rather than parameters, so
/// providers can gain options (zone, machine type) without a new signature.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateNodeRequest {
    /// The scaling group to grow.
    pub group_id: String,
    /// An idempotency key chosen by the caller (for example the name of the
    /// PendingNode that tracks the join). `None`: every call creates anew.
    pub request_id: Option<String>,
}

impl CreateNodeRequest {
    /// A request for one instance in `group_id`, without an idempotency key.
    pub fn new(group_id: impl Into<String>) -> Self {
        CreateNodeRequest {
            group_id: group_id.into(),
            request_id: None,
        }
    }

    /// Makes the request idempotent under `request_id`.
    pub fn with_request_id(mut self, request_id: impl Into<String>) -> Self {
        self.request_id = Some(request_id.into());
        self
    }
}

/// A freshly created instance: what the caller needs to track its join.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CreatedNode {
    /// The name its Node will have once it joins.
    pub node_name: String,
    /// The `spec.providerID` its Node will carry.
    pub provider_id: String,
    /// The image it boots from, when the cloud's answer says: its Node then
    /// needs no image read when it joins (a call fewer per node, out of the
    /// ration a rollout at a high surge is paced by).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}
