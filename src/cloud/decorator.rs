//! The base of every provider wrapper: a [`Decorator`] names the provider
//! it wraps and what it does around each call, and is a [`CloudProvider`]
//! by that alone. A wrapper states only what it changes — metering every
//! call, retrying reads, batching state reads — instead of restating all
//! of the trait's methods to pass the rest through.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{CloudFuture, CloudProvider, CreateNodeRequest, CreatedNode, InstanceState, ScalingGroup};

/// A cloud provider call, the `operation` label of the cloud metrics: one
/// per method of `CloudProvider`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum CloudOperation {
    /// `create_node`
    CreateNode,
    /// `delete_node`
    DeleteNode,
    /// `node_state`
    NodeState,
    /// `node_states` (many instances in one call)
    NodeStates,
    /// `node_image`
    NodeImage,
    /// `node_group`
    NodeGroup,
    /// `group_image`
    GroupImage,
    /// `set_group_image`
    SetGroupImage,
    /// `list_groups`
    ListGroups,
}

impl CloudOperation {
    /// The label text: the `CloudProvider` method's name.
    pub fn as_str(self) -> &'static str {
        match self {
            CloudOperation::CreateNode => "create_node",
            CloudOperation::DeleteNode => "delete_node",
            CloudOperation::NodeState => "node_state",
            CloudOperation::NodeStates => "node_states",
            CloudOperation::NodeImage => "node_image",
            CloudOperation::NodeGroup => "node_group",
            CloudOperation::GroupImage => "group_image",
            CloudOperation::SetGroupImage => "set_group_image",
            CloudOperation::ListGroups => "list_groups",
        }
    }
}

crate::telemetry::metrics::label_value_from_as_str!(CloudOperation);

/// A provider that wraps another (see the module docs).
pub trait Decorator: Send + Sync {
    /// The provider this one wraps.
    fn inner(&self) -> &Arc<dyn CloudProvider>;

    /// One call of the inner provider, made by `call`. A decorator may make
    /// it more than once (to retry) or time it; the default makes it once.
    fn around<'a, T: Send + 'a>(
        &'a self,
        operation: CloudOperation,
        call: impl Fn() -> CloudFuture<'a, T> + Send + 'a,
    ) -> CloudFuture<'a, T> {
        let _ = operation;
        call()
    }

    /// [`CloudProvider::node_state`]: the inner one's, around. (Named apart
    /// from the provider's method, so calls on a decorator are unambiguous.)
    fn state<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, InstanceState> {
        self.around(CloudOperation::NodeState, move || {
            self.inner().node_state(provider_id)
        })
    }

    /// [`CloudProvider::node_states`]: the inner one's, around.
    fn states<'a>(&'a self, provider_ids: &'a [String]) -> CloudFuture<'a, BTreeMap<String, InstanceState>> {
        self.around(CloudOperation::NodeStates, move || {
            self.inner().node_states(provider_ids)
        })
    }
}

impl<D: Decorator> CloudProvider for D {
    fn name(&self) -> &str {
        self.inner().name()
    }

    fn create_node<'a>(&'a self, request: &'a CreateNodeRequest) -> CloudFuture<'a, CreatedNode> {
        self.around(CloudOperation::CreateNode, move || {
            self.inner().create_node(request)
        })
    }

    fn delete_node<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, ()> {
        self.around(CloudOperation::DeleteNode, move || {
            self.inner().delete_node(provider_id)
        })
    }

    fn node_state<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, InstanceState> {
        Decorator::state(self, provider_id)
    }

    fn states_per_call(&self) -> usize {
        self.inner().states_per_call()
    }

    fn node_states<'a>(
        &'a self,
        provider_ids: &'a [String],
    ) -> CloudFuture<'a, BTreeMap<String, InstanceState>> {
        Decorator::states(self, provider_ids)
    }

    fn node_image<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, String> {
        self.around(CloudOperation::NodeImage, move || {
            self.inner().node_image(provider_id)
        })
    }

    fn node_group<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, String> {
        self.around(CloudOperation::NodeGroup, move || {
            self.inner().node_group(provider_id)
        })
    }

    fn group_image<'a>(&'a self, group_id: &'a str) -> CloudFuture<'a, String> {
        self.around(CloudOperation::GroupImage, move || {
            self.inner().group_image(group_id)
        })
    }

    fn set_group_image<'a>(&'a self, group_id: &'a str, image: &'a str) -> CloudFuture<'a, ()> {
        self.around(CloudOperation::SetGroupImage, move || {
            self.inner().set_group_image(group_id, image)
        })
    }

    fn list_groups(&self) -> CloudFuture<'_, Vec<ScalingGroup>> {
        self.around(CloudOperation::ListGroups, move || self.inner().list_groups())
    }
}
