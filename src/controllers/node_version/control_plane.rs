//! The control plane's in-place upgrade, before nodes are replaced, as
//! Constellation does it: a `spec.kubernetesClusterVersion` the API server
//! does not serve yet is sent, with the upgradable components of
//! `spec.kubernetesComponentsReference`, to the upgrade-agent on the
//! control-plane node (its socket mounted into the pod), which runs
//! `kubeadm upgrade`. `status.activeclusterversionupgrade` is true while it
//! runs. Unlike upstream, the call runs beside the reconcile (kubeadm takes
//! minutes), a failure is reported and tried again (upstream leaves the flag
//! set for good), and nodes are replaced only once the control plane is
//! upgraded (a kubelet newer than its API server is outside the skew policy).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::EventType;

use super::NodeVersionReconciler;
use crate::api::update::NodeVersion;
use crate::error::Result;
use crate::runtime::store::Key;
use crate::upgrade_agent::proto::{COMPONENTS_KEY, parse_components, upgradable};
use crate::upgrade_agent::{AgentClient, ExecuteUpdateRequest};

/// How long after a failed try the next one starts.
pub const RETRY_AFTER: Duration = Duration::from_secs(60);
/// How often a running upgrade is looked at (its end also queues the NodeVersion).
const RECHECK: Duration = Duration::from_secs(5);

/// Where one NodeVersion's control-plane upgrade stands in this replica.
#[derive(Clone, Debug, PartialEq)]
pub enum Run {
    /// The agent runs it.
    Running(String),
    /// The agent upgraded to this version.
    Succeeded(String),
    /// The try for `version` failed at `at`.
    Failed {
        version: String,
        why: String,
        at: Instant,
    },
}

/// The runs of this replica, by NodeVersion.
#[derive(Debug, Default)]
pub struct Runs(Mutex<HashMap<String, Run>>);

impl Runs {
    fn get(&self, name: &str) -> Option<Run> {
        crate::runtime::sync::lock(&self.0).get(name).cloned()
    }

    fn set(&self, name: &str, run: Run) {
        crate::runtime::sync::lock(&self.0).insert(name.to_string(), run);
    }
}

/// What a pass does about the control plane.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// No version asked, or no agent: nothing (the flag is left as it is).
    Untouched,
    /// The control plane is on the version (served, or upgraded by the
    /// agent): nodes are replaced.
    Done,
    /// Send this version to the agent now; nodes wait.
    Start(String),
    /// The agent runs; nodes wait.
    Running,
    /// The last try failed; tried again after `retry_in`; nodes wait.
    Failed { why: String, retry_in: Duration },
}

/// Whether two Kubernetes versions are the same release (`v` and build
/// metadata aside: `v1.31.12+k3s1` is `1.31.12`).
pub fn same_version(a: &str, b: &str) -> bool {
    let core = |v: &str| {
        v.trim()
            .trim_start_matches('v')
            .split('+')
            .next()
            .unwrap_or_default()
            .to_string()
    };
    core(a) == core(b)
}

/// Whether the verdict on `wanted` needs the API server's version: not
/// while this replica's run for it goes on, nor once that run succeeded
/// (either decides alone), so a pass then reads no `/version`.
pub fn needs_served(wanted: Option<&str>, run: Option<&Run>) -> bool {
    let Some(wanted) = wanted.filter(|w| !w.is_empty()) else {
        return false;
    };
    match run {
        Some(Run::Running(_)) => false,
        Some(Run::Succeeded(v)) => !same_version(v, wanted),
        _ => true,
    }
}

/// The verdict on `wanted` (spec.kubernetesClusterVersion) while the API
/// server serves `served` (None: not read, see [`needs_served`]) and this
/// replica's last run is `run`.
pub fn decide(wanted: Option<&str>, served: Option<&str>, run: Option<&Run>, now: Instant) -> Verdict {
    let Some(wanted) = wanted.filter(|w| !w.is_empty()) else {
        return Verdict::Untouched;
    };
    match run {
        Some(Run::Running(_)) => Verdict::Running,
        _ if served.is_some_and(|s| same_version(s, wanted)) => Verdict::Done,
        Some(Run::Succeeded(v)) if same_version(v, wanted) => Verdict::Done,
        Some(Run::Failed { version, why, at }) if same_version(version, wanted) => {
            match (*at + RETRY_AFTER).checked_duration_since(now) {
                Some(retry_in) if !retry_in.is_zero() => Verdict::Failed {
                    why: why.clone(),
                    retry_in,
                },
                _ => Verdict::Start(wanted.to_string()),
            }
        }
        _ => Verdict::Start(wanted.to_string()),
    }
}

/// What a pass takes from the control plane's upgrade.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct ControlPlane {
    /// `status.activeclusterversionupgrade` to write (None: as it is).
    pub active: Option<bool>,
    /// Nodes wait for the control plane.
    pub hold: bool,
    /// Why the upgrade failed (Degraded).
    pub failed: Option<String>,
    /// When to look again.
    pub recheck: Option<Duration>,
}

impl ControlPlane {
    fn of(verdict: &Verdict) -> ControlPlane {
        match verdict {
            Verdict::Untouched => ControlPlane::default(),
            Verdict::Done => ControlPlane {
                active: Some(false),
                ..Default::default()
            },
            Verdict::Start(_) | Verdict::Running => ControlPlane {
                active: Some(true),
                hold: true,
                failed: None,
                recheck: Some(RECHECK),
            },
            Verdict::Failed { why, retry_in } => ControlPlane {
                active: Some(false),
                hold: true,
                failed: Some(why.clone()),
                recheck: Some(*retry_in),
            },
        }
    }
}

impl NodeVersionReconciler {
    /// Gathers (the API server's version), decides, and starts the agent's
    /// run when due; returns what the pass takes from it.
    pub(super) async fn upgrade_control_plane(&self, nv: &NodeVersion) -> Result<ControlPlane> {
        let Some(agent) = self.upgrade_agent.clone() else {
            return Ok(ControlPlane::default());
        };
        let wanted = Some(nv.spec.kubernetes_cluster_version.as_str()).filter(|w| !w.is_empty());
        if wanted.is_none() {
            return Ok(ControlPlane::default());
        }
        let run = self.control_plane_runs.get(&nv.name_any());
        let served = match needs_served(wanted, run.as_ref()) {
            true => Some(self.client.apiserver_version().await?.git_version),
            false => None,
        };
        let verdict = decide(wanted, served.as_deref(), run.as_ref(), Instant::now());
        if let Verdict::Start(version) = &verdict {
            let request = self.update_request(nv, version).await?;
            // kubeadm on the node is the one write no fence can take back.
            self.leader.ensure_leader()?;
            let served = served.as_deref().unwrap_or("another version");
            self.start_run(nv, agent, version, served, request);
        }
        Ok(ControlPlane::of(&verdict))
    }

    /// The request for `version`: the upgradable components of the
    /// NodeVersion's components ConfigMap in kube-system (none without one).
    async fn update_request(&self, nv: &NodeVersion, version: &str) -> Result<ExecuteUpdateRequest> {
        let mut components = Vec::new();
        let reference = nv.spec.kubernetes_components_reference.as_str();
        if !reference.is_empty() {
            let maps: Api<ConfigMap> = Api::namespaced(self.client.clone(), "kube-system");
            let listed = maps
                .get_opt(reference)
                .await?
                .and_then(|cm| cm.data)
                .and_then(|d| d.get(COMPONENTS_KEY).cloned());
            if let Some(json) = listed {
                components = upgradable(&parse_components(&json)?);
            }
        }
        Ok(ExecuteUpdateRequest {
            wanted_kubernetes_version: version.to_string(),
            kubernetes_components: components,
        })
    }

    /// The agent's run in the background; its end is recorded and queues
    /// the NodeVersion.
    fn start_run(
        &self,
        nv: &NodeVersion,
        agent: AgentClient,
        version: &str,
        served: &str,
        request: ExecuteUpdateRequest,
    ) {
        let name = nv.name_any();
        self.control_plane_runs
            .set(&name, Run::Running(version.to_string()));
        self.event(
            nv,
            EventType::Normal,
            "ControlPlaneUpgradeStarted",
            format!(
                "the API server serves {served}: the upgrade-agent ({}) upgrades the control plane to {version} ({} components) before nodes are replaced",
                agent.socket().display(),
                request.kubernetes_components.len()
            ),
        );
        let (runs, queue, recorder) = (
            self.control_plane_runs.clone(),
            self.queue.clone(),
            self.recorder.clone(),
        );
        let (version, object) = (version.to_string(), kube::Resource::object_ref(nv, &()));
        tokio::spawn(async move {
            let began = Instant::now();
            let result = agent.execute_update(&request).await;
            let (run, type_, reason, note) = match result {
                Ok(()) => (
                    Run::Succeeded(version.clone()),
                    EventType::Normal,
                    "ControlPlaneUpgraded",
                    format!(
                        "the control plane was upgraded to {version} in {:.0} s",
                        began.elapsed().as_secs_f64()
                    ),
                ),
                Err(e) => (
                    Run::Failed {
                        version: version.clone(),
                        why: e.to_string(),
                        at: Instant::now(),
                    },
                    EventType::Warning,
                    "ControlPlaneUpgradeFailed",
                    format!(
                        "upgrading the control plane to {version}: {e}; tried again in {} s",
                        RETRY_AFTER.as_secs()
                    ),
                ),
            };
            tracing::info!(%version, ?run, "control-plane upgrade ended");
            runs.set(&object.name.clone().unwrap_or_default(), run);
            let event = crate::controllers::event(type_, reason, "Rollout", &note);
            crate::controllers::spawn_event(&recorder, event, object.clone());
            queue.add(Key::<NodeVersion>::cluster(&object.name.unwrap_or_default()));
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_control_plane_is_upgraded_before_nodes_are_replaced() {
        let now = Instant::now();
        let failed = |ago: u64| Run::Failed {
            version: "v1.31.12".into(),
            why: "kubeadm failed".into(),
            at: now - Duration::from_secs(ago),
        };
        let start = Verdict::Start("v1.31.12".into());
        // (what, wanted, served, this replica's last run, whether /version
        // is read, verdict)
        type Row = (
            &'static str,
            Option<&'static str>,
            &'static str,
            Option<Run>,
            bool,
            Verdict,
        );
        #[rustfmt::skip]
        let table: Vec<Row> = vec![
            ("no version asked", None, "v1.30.4", None, false, Verdict::Untouched),
            ("an empty version", Some(""), "v1.30.4", None, false, Verdict::Untouched),
            ("served already", Some("v1.31.12"), "v1.31.12", None, true, Verdict::Done),
            ("served, build metadata aside", Some("v1.31.12"), "v1.31.12+k3s1", None, true, Verdict::Done),
            ("another version served: start", Some("v1.31.12"), "v1.30.4", None, true, start.clone()),
            ("running", Some("v1.31.12"), "v1.30.4", Some(Run::Running("v1.31.12".into())), false, Verdict::Running),
            ("running, served meanwhile: its end is waited for", Some("v1.31.12"), "v1.31.12", Some(Run::Running("v1.31.12".into())), false, Verdict::Running),
            ("the agent succeeded: done, whatever an API server answers", Some("v1.31.12"), "v1.30.4", Some(Run::Succeeded("v1.31.12".into())), false, Verdict::Done),
            ("succeeded, build metadata aside", Some("v1.31.12+k3s1"), "v1.30.4", Some(Run::Succeeded("v1.31.12".into())), false, Verdict::Done),
            ("succeeded for an older ask: start", Some("v1.31.12"), "v1.30.4", Some(Run::Succeeded("v1.30.9".into())), true, start.clone()),
            ("succeeded for an older ask, the new one served", Some("v1.31.12"), "v1.31.12", Some(Run::Succeeded("v1.30.9".into())), true, Verdict::Done),
            ("failed moments ago: wait", Some("v1.31.12"), "v1.30.4", Some(failed(10)), true, Verdict::Failed { why: "kubeadm failed".into(), retry_in: RETRY_AFTER - Duration::from_secs(10) }),
            ("failed, served meanwhile: done", Some("v1.31.12"), "v1.31.12", Some(failed(10)), true, Verdict::Done),
            ("failed a while ago: again", Some("v1.31.12"), "v1.30.4", Some(failed(61)), true, start.clone()),
            ("failed for another version: start", Some("v1.32.0"), "v1.30.4", Some(failed(1)), true, Verdict::Start("v1.32.0".into())),
        ];
        for (what, wanted, served, run, reads, want) in table {
            assert_eq!(
                needs_served(wanted, run.as_ref()),
                reads,
                "{what}: reads /version"
            );
            // A pass that does not read /version decides without it.
            let served = reads.then_some(served);
            assert_eq!(decide(wanted, served, run.as_ref(), now), want, "{what}");
        }
        assert!(ControlPlane::of(&Verdict::Running).hold);
        assert_eq!(ControlPlane::of(&Verdict::Running).active, Some(true));
        assert_eq!(
            ControlPlane::of(&Verdict::Done),
            ControlPlane {
                active: Some(false),
                ..Default::default()
            }
        );
        let failed = ControlPlane::of(&Verdict::Failed {
            why: "x".into(),
            retry_in: Duration::from_secs(3),
        });
        assert_eq!(
            (failed.active, failed.hold, failed.failed.as_deref()),
            (Some(false), true, Some("x"))
        );
        assert_eq!(ControlPlane::of(&Verdict::Untouched), ControlPlane::default());
    }
}
