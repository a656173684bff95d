//! A provider wrapper that measures every call: latency by operation and
//! failures by kind, for any [`CloudProvider`].

use std::sync::Arc;
use std::time::Instant;

use super::{
    CloudError, CloudFuture, CloudProvider, CreateNodeRequest, CreatedNode, InstanceState, ScalingGroup,
};
use crate::telemetry::Metrics;
use crate::telemetry::metrics::{CloudErrorLabels, CloudLabels};

pub struct MeteredCloud {
    inner: Arc<dyn CloudProvider>,
    metrics: Metrics,
}

impl MeteredCloud {
    pub fn new(inner: Arc<dyn CloudProvider>, metrics: Metrics) -> Self {
        MeteredCloud { inner, metrics }
    }

    fn measure<'a, T: Send + 'a>(
        &'a self,
        operation: &'static str,
        call: CloudFuture<'a, T>,
    ) -> CloudFuture<'a, T> {
        Box::pin(async move {
            let started = Instant::now();
            let result = call.await;
            let provider = self.inner.name().to_string();
            self.metrics
                .cloud_duration
                .get_or_create(&CloudLabels {
                    provider: provider.clone(),
                    operation: operation.to_string(),
                })
                .observe(started.elapsed().as_secs_f64());
            if let Err(e) = &result {
                self.record_error(provider, operation, e);
            }
            result
        })
    }

    fn record_error(&self, provider: String, operation: &str, error: &CloudError) {
        self.metrics
            .cloud_errors
            .get_or_create(&CloudErrorLabels {
                provider,
                operation: operation.to_string(),
                category: error.kind().to_string(),
            })
            .inc();
    }
}

impl CloudProvider for MeteredCloud {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn create_node<'a>(&'a self, request: &'a CreateNodeRequest) -> CloudFuture<'a, CreatedNode> {
        self.measure("create_node", self.inner.create_node(request))
    }

    fn delete_node<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, ()> {
        self.measure("delete_node", self.inner.delete_node(provider_id))
    }

    fn node_state<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, InstanceState> {
        self.measure("node_state", self.inner.node_state(provider_id))
    }

    fn node_image<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, String> {
        self.measure("node_image", self.inner.node_image(provider_id))
    }

    fn node_group<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, String> {
        self.measure("node_group", self.inner.node_group(provider_id))
    }

    fn group_image<'a>(&'a self, group_id: &'a str) -> CloudFuture<'a, String> {
        self.measure("group_image", self.inner.group_image(group_id))
    }

    fn set_group_image<'a>(&'a self, group_id: &'a str, image: &'a str) -> CloudFuture<'a, ()> {
        self.measure("set_group_image", self.inner.set_group_image(group_id, image))
    }

    fn list_groups(&self) -> CloudFuture<'_, Vec<ScalingGroup>> {
        self.measure("list_groups", self.inner.list_groups())
    }
}
