//! The operator under test, run in-process for one test and scoped to it.

use std::time::Duration;

use super::cluster::{control_plane, install_crds};
use super::env::TestEnv;

/// An operator run in-process for one test, scoped to the test's nodes and
/// objects (its run label), with a leader lease in the test's namespace.
pub struct RunningOperator {
    pub shutdown: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl TestEnv {
    pub async fn start_operator(
        &self,
        maintenance: nodewarden::controllers::node_maintenance::MaintenanceConfig,
    ) -> RunningOperator {
        self.start_operator_with(maintenance, None, "operator").await
    }

    /// An operator with a cloud (rolling replacement) and an identity of its
    /// own (several may run, as replicas of one deployment).
    pub async fn start_operator_with(
        &self,
        maintenance: nodewarden::controllers::node_maintenance::MaintenanceConfig,
        cloud: Option<std::sync::Arc<dyn nodewarden::cloud::CloudProvider>>,
        identity: &str,
    ) -> RunningOperator {
        let config = self.operator_config(maintenance, cloud, identity);
        self.start_operator_from(config).await
    }

    /// An operator with exactly `config` (see [`TestEnv::operator_config`]).
    pub async fn start_operator_from(&self, config: nodewarden::operator::OperatorConfig) -> RunningOperator {
        crate::init_test_logging();
        install_crds(&self.client).await;
        let client = control_plane().client().await;
        let shutdown = tokio_util::sync::CancellationToken::new();
        let stop = shutdown.clone();
        let task = tokio::spawn(async move {
            if let Err(e) = nodewarden::operator::run(client, config, stop).await {
                panic!("the operator failed: {e}");
            }
        });
        RunningOperator { shutdown, task }
    }
}

impl TestEnv {
    /// The operator's configuration for this test: its run's nodes and
    /// objects, a Lease in its namespace with short timings, 8 workers.
    pub fn operator_config(
        &self,
        maintenance: nodewarden::controllers::node_maintenance::MaintenanceConfig,
        cloud: Option<std::sync::Arc<dyn nodewarden::cloud::CloudProvider>>,
        identity: &str,
    ) -> nodewarden::operator::OperatorConfig {
        let mut leader = nodewarden::runtime::leader::LeaderElectionConfig::new(
            self.namespace.clone(),
            "nodewarden",
            format!("{}-{identity}", self.id),
        );
        leader.lease_duration = Duration::from_secs(3);
        leader.renew_deadline = Duration::from_secs(2);
        leader.retry_period = Duration::from_millis(500);
        nodewarden::operator::OperatorConfig {
            leader,
            http_addr: "127.0.0.1:0".parse().expect("an address"),
            node_selector: Some(self.run_selector()),
            object_selector: Some(self.run_selector()),
            maintenance,
            workers: 8,
            cloud,
            cloud_ration: Default::default(),
            etcd: Default::default(),
            upgrade_agent: None,
            discover_scaling_groups: None,
            admission: None,
            webhook_limits: Default::default(),
            // Every test's operator serves SIPClusters: install_crds installs metal3's API.
            bare_metal: nodewarden::controllers::BareMetal::On,
            rollout: Default::default(),
            plans: nodewarden::controllers::plan::PlanConfig {
                channel_poll: Duration::from_secs(2),
                recheck: Duration::from_secs(2),
                settle: Duration::from_secs(3),
                jobs: nodewarden::upgrade::job::JobDefaults {
                    backoff_limit: 0,
                    ..Default::default()
                },
                ..Default::default()
            },
        }
    }
}

impl RunningOperator {
    /// Whether the operator still runs (it did not fail or panic).
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }

    /// Graceful stop (as on SIGTERM).
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(20), self.task).await;
    }
}
