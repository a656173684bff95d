//! The Job that upgrades one node: upstream's name, labels, node affinity,
//! host mounts and SYSTEM_UPGRADE_* environment, so existing upgrade images
//! run unchanged. Cordon and drain are not in it: nodewarden does them
//! before the Job exists, with its own drain (PodDisruptionBudgets honoured).

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, DownwardAPIVolumeFile, DownwardAPIVolumeSource, EnvVar, EnvVarSource,
    HostPathVolumeSource, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ObjectFieldSelector, PodAffinityTerm, PodAntiAffinity, PodSpec, PodTemplateSpec, SecretVolumeSource,
    SecurityContext, Toleration, Volume, VolumeMount, WindowsSecurityContextOptions,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference,
};

use super::labels;
use crate::api::plan::{ContainerSpec, Plan, node_label};

/// What the operator decides about every Job (flags).
#[derive(Clone, Debug)]
pub struct JobDefaults {
    /// activeDeadlineSeconds when the plan sets none (upstream: 600).
    pub active_deadline_secs: i64,
    /// Retries of a failed pod before the Job fails (upstream: 2).
    pub backoff_limit: i32,
    /// How long a finished Job stays (upstream: 900 s).
    pub ttl_after_finished_secs: i32,
    /// The most activeDeadlineSeconds any Job gets (0: no maximum); a plan
    /// with no deadline gets this one (upstream's
    /// SYSTEM_UPGRADE_JOB_ACTIVE_DEADLINE_SECONDS_MAX).
    pub active_deadline_max_secs: i64,
    /// The Jobs' `upgrade.cattle.io/controller` label (upstream's
    /// controller name, `system-upgrade-controller` in its manifests):
    /// tools and selectors that find upgrade Jobs by it keep finding them.
    pub controller_name: String,
    /// The Jobs' podReplacementPolicy (upstream: TerminatingOrFailed).
    pub pod_replacement_policy: String,
    /// Whether the upgrade container is privileged when the plan gives no
    /// securityContext (upstream: true).
    pub privileged: bool,
    /// The containers' imagePullPolicy (upstream: IfNotPresent).
    pub image_pull_policy: String,
}

impl Default for JobDefaults {
    fn default() -> Self {
        JobDefaults {
            active_deadline_secs: 600,
            backoff_limit: 2,
            ttl_after_finished_secs: 900,
            active_deadline_max_secs: 0,
            controller_name: UPSTREAM_CONTROLLER.into(),
            pod_replacement_policy: "TerminatingOrFailed".into(),
            privileged: true,
            image_pull_policy: "IfNotPresent".into(),
        }
    }
}

/// The System Upgrade Controller's name in its own manifests: the
/// default `upgrade.cattle.io/controller` label of the Jobs.
pub const UPSTREAM_CONTROLLER: &str = "system-upgrade-controller";

/// The value of `kubernetes.io/hostname` the Job is pinned to.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// The node label naming its operating system.
const OS_LABEL: &str = "kubernetes.io/os";

/// What a Job needs to know of the node it runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobNode {
    /// The node's name.
    pub name: String,
    /// Its `kubernetes.io/hostname` label (its name when it has none).
    pub hostname: String,
    /// A Windows node: the containers run as host processes.
    pub windows: bool,
}

impl JobNode {
    /// The node as its Job sees it.
    pub fn of(node: &k8s_openapi::api::core::v1::Node) -> JobNode {
        let name = node.metadata.name.clone().unwrap_or_default();
        let labels = node.metadata.labels.as_ref();
        let label = |k: &str| labels.and_then(|l| l.get(k)).cloned();
        JobNode {
            hostname: label(HOSTNAME_LABEL).unwrap_or_else(|| name.clone()),
            windows: label(OS_LABEL).as_deref() == Some("windows"),
            name,
        }
    }
}

/// The Job's name: `apply-<plan>-on-<node up to its first dot>-with-<hash>`, cut to 63.
pub fn job_name(plan: &str, node: &str, hash: &str) -> String {
    let short = node.split('.').next().unwrap_or(node);
    super::safe_concat_name(&["apply", plan, "on", short, "with", hash])
}

/// The name of the Job that runs a plan's `prepare` on a node before it
/// is cordoned or drained.
pub fn prepare_job_name(plan: &str, node: &str, hash: &str) -> String {
    let short = node.split('.').next().unwrap_or(node);
    super::safe_concat_name(&["prepare", plan, "on", short, "with", hash])
}

/// On a Job: how long it stays once finished (upstream's annotation).
pub const TTL_ANNOTATION: &str = "upgrade.cattle.io/ttl-seconds-after-finished";

/// On a prepare Job: which step of the node's upgrade it runs.
pub const STEP_LABEL: &str = "nodewarden.dev/step";

/// The Job that runs the plan's `prepare` container on `node`, before the
/// node is cordoned or drained (upstream's order: prepare, drain, upgrade).
/// It is the upgrade Job with `prepare` as its one container.
pub fn prepare_job(
    plan: &Plan,
    node: &JobNode,
    version: &str,
    hash: &str,
    defaults: &JobDefaults,
) -> Option<Job> {
    let prepare = plan.spec.prepare.as_ref()?;
    let mut job = upgrade_job(plan, node, version, hash, defaults);
    let name = plan.metadata.name.clone().unwrap_or_default();
    job.metadata.name = Some(prepare_job_name(&name, &node.name, hash));
    for labels in [
        job.metadata.labels.as_mut(),
        job.spec
            .as_mut()
            .and_then(|s| s.template.metadata.as_mut())
            .and_then(|m| m.labels.as_mut()),
    ]
    .into_iter()
    .flatten()
    {
        labels.insert(STEP_LABEL.into(), "prepare".into());
    }
    let shared = Shared::new(plan, node, version, hash, defaults);
    if let Some(pod) = job.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
        pod.init_containers = None;
        pod.containers = vec![container("prepare", prepare, &shared)];
    }
    Some(job)
}

/// The annotation a Job carries with the digest of the pod template it was
/// made with ([`template_digest`]).
pub const TEMPLATE_DIGEST_ANNOTATION: &str = "nodewarden.dev/template-digest";

/// A digest of what a Job runs (its pod template as built, before the API
/// server's defaults): a Job whose digest differs from the one the plan
/// renders now was made from an earlier spec (upstream's apply replaces
/// such a Job; its name, from the plan's hash, stays the same).
pub fn template_digest(job: &Job) -> String {
    use sha2::{Digest, Sha256};
    let template = job.spec.as_ref().map(|s| &s.template);
    let bytes = serde_json::to_vec(&template).unwrap_or_default();
    let digest = Sha256::digest(bytes);
    digest.iter().take(12).map(|b| format!("{b:02x}")).collect()
}

/// Notes `job`'s [`template_digest`] on it.
pub fn stamp_template_digest(job: &mut Job) {
    let digest = template_digest(job);
    job.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(TEMPLATE_DIGEST_ANNOTATION.into(), digest);
}

/// Whether `existing` (a Job of the cluster) was made from another template
/// than `wanted` renders now. A Job without the annotation (made by an
/// earlier nodewarden, or by upstream's controller) is taken as current.
pub fn made_from_another_template(existing: &Job, wanted: &Job) -> bool {
    let recorded = existing
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(TEMPLATE_DIGEST_ANNOTATION));
    recorded.is_some_and(|d| *d != template_digest(wanted))
}

/// The Job applying `plan` at `version`/`hash` on `node`. A plan's
/// `prepare` runs in a Job of its own before ([`prepare_job`]), so it is
/// not repeated here.
pub fn upgrade_job(plan: &Plan, node: &JobNode, version: &str, hash: &str, defaults: &JobDefaults) -> Job {
    let name = plan.metadata.name.clone().unwrap_or_default();
    let spec = &plan.spec;
    let exclusive = spec.exclusive.unwrap_or(false).to_string();
    let job_labels = job_labels(plan, &node.name, version, hash, &defaults.controller_name);
    let mut ttl = defaults.ttl_after_finished_secs;
    // Keep the finished Job past postCompleteDelay, plus a minute (upstream's rule).
    if let Some(delay) = spec.post_complete_delay.as_deref().and_then(parse_go_duration) {
        ttl = ttl.max(delay.as_secs() as i32 + 60);
    }
    let deadline = active_deadline(spec.job_active_deadline_secs, defaults);
    let anti_affinity_on = if spec.exclusive.unwrap_or(false) {
        (labels::EXCLUSIVE, exclusive)
    } else {
        (labels::PLAN, name.clone())
    };
    // Upstream copies the plan's annotations (not its own cattle.io/ or
    // kubectl's) to the Job and pod, and notes the TTL on the Job.
    let copied: BTreeMap<String, String> = plan
        .metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| !k.contains("cattle.io/") && !k.contains("kubectl.kubernetes.io/"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut job_annotations = copied.clone();
    job_annotations.insert(TTL_ANNOTATION.into(), ttl.to_string());
    let upgrade = container(
        "upgrade",
        &spec.upgrade,
        &Shared::new(plan, node, version, hash, defaults),
    );
    Job {
        metadata: ObjectMeta {
            name: Some(job_name(&name, &node.name, hash)),
            namespace: plan.metadata.namespace.clone(),
            labels: Some(job_labels.clone()),
            annotations: Some(job_annotations),
            owner_references: owner(plan).map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(defaults.backoff_limit),
            ttl_seconds_after_finished: Some(ttl),
            active_deadline_seconds: deadline,
            pod_replacement_policy: Some(defaults.pod_replacement_policy.clone()),
            completions: Some(1),
            parallelism: Some(1),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(job_labels),
                    annotations: (!copied.is_empty()).then_some(copied),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    host_ipc: Some(true),
                    host_pid: Some(true),
                    host_network: Some(true),
                    dns_policy: Some("ClusterFirstWithHostNet".into()),
                    priority_class_name: spec.priority_class_name.clone(),
                    service_account_name: spec.service_account_name.clone(),
                    affinity: Some(affinity(&node.hostname, anti_affinity_on)),
                    tolerations: Some(tolerations(&spec.tolerations)),
                    restart_policy: Some("Never".into()),
                    volumes: Some(volumes(plan)),
                    image_pull_secrets: (!spec.image_pull_secrets.is_empty())
                        .then(|| spec.image_pull_secrets.clone()),
                    containers: vec![upgrade],
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// activeDeadlineSeconds as upstream sets it: the plan's (0: none; unset
/// or negative: the default), clamped to the maximum when one is set
/// (which also replaces "none").
fn active_deadline(plan: Option<i64>, defaults: &JobDefaults) -> Option<i64> {
    let wanted = match plan {
        Some(0) => None,
        Some(s) if s > 0 => Some(s),
        _ => Some(defaults.active_deadline_secs),
    };
    match (wanted, defaults.active_deadline_max_secs) {
        (_, max) if max <= 0 => wanted,
        (None, max) => Some(max),
        (Some(s), max) => Some(s.min(max)),
    }
}

/// Upstream's labels (controller, plan, node, version, hash, exclusive)
/// plus the plan's own.
fn job_labels(
    plan: &Plan,
    node: &str,
    version: &str,
    hash: &str,
    controller: &str,
) -> BTreeMap<String, String> {
    let name = plan.metadata.name.clone().unwrap_or_default();
    let mut all = BTreeMap::from([
        (labels::CONTROLLER.to_string(), controller.to_string()),
        (
            labels::EXCLUSIVE.to_string(),
            plan.spec.exclusive.unwrap_or(false).to_string(),
        ),
        (labels::NODE.to_string(), node.to_string()),
        (labels::PLAN.to_string(), name.clone()),
        (labels::VERSION.to_string(), label_value(version)),
        (node_label(&name), hash.to_string()),
    ]);
    all.extend(inherited_labels(plan));
    all
}

/// The plan's own labels that its Jobs and NodeMaintenances carry too
/// (upstream's rule: none of the `cattle.io/` ones), so selectors that pick
/// the plan pick what it makes.
pub fn inherited_labels(plan: &Plan) -> BTreeMap<String, String> {
    plan.metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| !k.contains("cattle.io/"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The plan as the Jobs' controlling owner: deleting the plan deletes them.
fn owner(plan: &Plan) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: "upgrade.cattle.io/v1".into(),
        kind: "Plan".into(),
        name: plan.metadata.name.clone()?,
        uid: plan.metadata.uid.clone()?,
        controller: Some(true),
        block_owner_deletion: Some(false),
    })
}

/// Pinned to the node; never two of this plan's (or of any exclusive plan's) pods on one node.
fn affinity(hostname: &str, anti: (&str, String)) -> Affinity {
    Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![NodeSelectorRequirement {
                        key: HOSTNAME_LABEL.into(),
                        operator: "In".into(),
                        values: Some(vec![hostname.to_string()]),
                    }]),
                    ..Default::default()
                }],
            }),
            ..Default::default()
        }),
        pod_anti_affinity: Some(PodAntiAffinity {
            required_during_scheduling_ignored_during_execution: Some(vec![PodAffinityTerm {
                label_selector: Some(LabelSelector {
                    match_expressions: Some(vec![LabelSelectorRequirement {
                        key: anti.0.to_string(),
                        operator: "In".into(),
                        values: Some(vec![anti.1]),
                    }]),
                    ..Default::default()
                }),
                topology_key: HOSTNAME_LABEL.into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The node is cordoned (and, when drained, tainted by its
/// NodeMaintenance) while the Job runs: tolerate that, plus the plan's own.
fn tolerations(extra: &[Toleration]) -> Vec<Toleration> {
    let no_schedule = |key: &str| Toleration {
        key: Some(key.into()),
        operator: Some("Exists".into()),
        effect: Some("NoSchedule".into()),
        ..Default::default()
    };
    let mut all = vec![
        no_schedule("node.kubernetes.io/unschedulable"),
        no_schedule(crate::drain::node::DRAIN_TAINT),
    ];
    all.extend(extra.iter().cloned());
    all
}

fn volumes(plan: &Plan) -> Vec<Volume> {
    let mut volumes = vec![
        Volume {
            name: "host-root".into(),
            host_path: Some(HostPathVolumeSource {
                path: "/".into(),
                type_: Some("Directory".into()),
            }),
            ..Default::default()
        },
        Volume {
            name: "pod-info".into(),
            downward_api: Some(DownwardAPIVolumeSource {
                default_mode: Some(0o644),
                items: Some(
                    [
                        ("labels", "metadata.labels"),
                        ("annotations", "metadata.annotations"),
                    ]
                    .into_iter()
                    .map(|(path, field)| DownwardAPIVolumeFile {
                        path: path.into(),
                        field_ref: Some(ObjectFieldSelector {
                            api_version: Some("v1".into()),
                            field_path: field.into(),
                        }),
                        ..Default::default()
                    })
                    .collect(),
                ),
            }),
            ..Default::default()
        },
    ];
    for s in &plan.spec.secrets {
        volumes.push(Volume {
            name: secret_volume(&s.name),
            secret: Some(SecretVolumeSource {
                secret_name: Some(s.name.clone()),
                default_mode: s.default_mode,
                optional: Some(s.ignore_updates.unwrap_or(false)),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    let containers = plan
        .spec
        .prepare
        .iter()
        .chain(std::iter::once(&plan.spec.upgrade));
    let mut seen = std::collections::BTreeSet::new();
    for v in containers.flat_map(|c| c.volumes.iter()) {
        if seen.insert(v.name.clone()) {
            volumes.push(Volume {
                name: v.name.clone(),
                host_path: Some(HostPathVolumeSource {
                    path: v.source.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
    }
    volumes
}

/// Where a Secret is mounted (upstream's rule): its absolute `path`, else
/// under `/run/system-upgrade/secrets/` (by `path`, or by name when empty).
pub fn secret_path(name: &str, path: &str) -> String {
    match path {
        "" => format!("/run/system-upgrade/secrets/{name}"),
        p if p.starts_with('/') => p.to_string(),
        p => format!("/run/system-upgrade/secrets/{}", p.trim_start_matches("./")),
    }
}

fn secret_volume(name: &str) -> String {
    super::safe_concat_name(&["secret", name])
}

/// Host root at /host, the pod's labels and annotations, the plan's Secrets.
fn base_mounts(plan: &Plan) -> Vec<VolumeMount> {
    let mut mounts = vec![
        VolumeMount {
            name: "host-root".into(),
            mount_path: "/host".into(),
            ..Default::default()
        },
        VolumeMount {
            name: "pod-info".into(),
            mount_path: "/run/system-upgrade/pod".into(),
            read_only: Some(true),
            ..Default::default()
        },
    ];
    mounts.extend(plan.spec.secrets.iter().map(|s| VolumeMount {
        name: secret_volume(&s.name),
        mount_path: secret_path(&s.name, &s.path),
        read_only: Some(true),
        ..Default::default()
    }));
    mounts
}

fn plan_env(plan: &str, version: &str, hash: &str) -> Vec<EnvVar> {
    let field = |name: &str, path: &str| EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let value = |name: &str, v: &str| EnvVar {
        name: name.into(),
        value: Some(v.into()),
        ..Default::default()
    };
    vec![
        field("SYSTEM_UPGRADE_NODE_NAME", "spec.nodeName"),
        field("SYSTEM_UPGRADE_POD_NAME", "metadata.name"),
        field("SYSTEM_UPGRADE_POD_UID", "metadata.uid"),
        value("SYSTEM_UPGRADE_PLAN_NAME", plan),
        value("SYSTEM_UPGRADE_PLAN_LATEST_HASH", hash),
        value("SYSTEM_UPGRADE_PLAN_LATEST_VERSION", version),
    ]
}

/// What every container of a node's Job shares.
struct Shared<'a> {
    version: &'a str,
    env: Vec<EnvVar>,
    mounts: Vec<VolumeMount>,
    windows: bool,
    defaults: &'a JobDefaults,
}

impl<'a> Shared<'a> {
    fn new(plan: &Plan, node: &JobNode, version: &'a str, hash: &str, defaults: &'a JobDefaults) -> Self {
        let name = plan.metadata.name.as_deref().unwrap_or_default();
        Shared {
            version,
            env: plan_env(name, version, hash),
            mounts: base_mounts(plan),
            windows: node.windows,
            defaults,
        }
    }
}

/// One container, with upstream's security context: the upgrade
/// container takes the plan's, else on Windows a host process as SYSTEM,
/// else privileged (unless turned off) with CAP_SYS_BOOT; `prepare` a host
/// process on Windows (the plan's is overridden there, as upstream does),
/// else only the plan's.
fn container(name: &str, spec: &ContainerSpec, shared: &Shared) -> Container {
    let privileged = || SecurityContext {
        privileged: Some(shared.defaults.privileged),
        capabilities: Some(Capabilities {
            add: Some(vec!["CAP_SYS_BOOT".into()]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let host_process = || SecurityContext {
        windows_options: Some(WindowsSecurityContextOptions {
            host_process: Some(true),
            run_as_user_name: Some("NT AUTHORITY\\SYSTEM".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let security_context = match (name, shared.windows) {
        ("upgrade", true) => Some(spec.security_context.clone().unwrap_or_else(host_process)),
        ("upgrade", false) => Some(spec.security_context.clone().unwrap_or_else(privileged)),
        (_, true) => Some(host_process()),
        (_, false) => spec.security_context.clone(),
    };
    let mut all_env = shared.env.clone();
    all_env.extend(spec.envs.iter().cloned());
    let mut all_mounts = shared.mounts.clone();
    all_mounts.extend(spec.volumes.iter().map(|v| VolumeMount {
        name: v.name.clone(),
        mount_path: v.destination.clone(),
        ..Default::default()
    }));
    Container {
        name: name.into(),
        image: Some(with_tag(&spec.image, shared.version)),
        command: (!spec.command.is_empty()).then(|| spec.command.clone()),
        args: (!spec.args.is_empty()).then(|| spec.args.clone()),
        env: Some(all_env),
        env_from: (!spec.env_from.is_empty()).then(|| spec.env_from.clone()),
        volume_mounts: Some(all_mounts),
        image_pull_policy: Some(shared.defaults.image_pull_policy.clone()),
        security_context,
        ..Default::default()
    }
}

/// `image` with `version` as its tag when it has neither tag nor digest.
pub fn with_tag(image: &str, version: &str) -> String {
    let last = image.rsplit('/').next().unwrap_or(image);
    if last.contains(':') || image.contains('@') || version.is_empty() {
        image.to_string()
    } else {
        format!("{image}:{version}")
    }
}

/// A version as a label value (63 characters of `[A-Za-z0-9._-]`).
fn label_value(version: &str) -> String {
    let cleaned: String = version
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    cleaned
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// A Go duration (`1h30m`, `90s`, `500ms`, `0`); None when it is not one
/// (a sign included: a negative delay is refused, not read).
pub fn parse_go_duration(s: &str) -> Option<std::time::Duration> {
    match s.trim() {
        "0" => Some(std::time::Duration::ZERO),
        other => crate::api::node_maintenance::parse_duration(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::plan::{PlanSpec, SecretSpec, VolumeSpec};
    use kube::ResourceExt;

    fn plan() -> Plan {
        let mut p = Plan::new(
            "k3s-server",
            PlanSpec {
                concurrency: Some(1),
                version: Some("v1.30.1-k3s1".into()),
                upgrade: ContainerSpec {
                    image: "rancher/k3s-upgrade".into(),
                    volumes: vec![VolumeSpec {
                        name: "run".into(),
                        source: "/run".into(),
                        destination: "/run".into(),
                    }],
                    ..Default::default()
                },
                secrets: vec![SecretSpec {
                    name: "creds".into(),
                    path: "/creds".into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
        );
        p.metadata.namespace = Some("system-upgrade".into());
        p.metadata.uid = Some("uid-1".into());
        p
    }

    fn linux(name: &str, hostname: &str) -> JobNode {
        JobNode {
            name: name.into(),
            hostname: hostname.into(),
            windows: false,
        }
    }

    #[test]
    fn the_job_is_upstreams() {
        let hash = "a".repeat(56);
        let job = upgrade_job(
            &plan(),
            &linux("worker-1.example", "worker-1"),
            "v1.30.1-k3s1",
            &hash,
            &JobDefaults::default(),
        );
        let name = job.metadata.name.clone().unwrap_or_default();
        assert!(
            name.starts_with("apply-k3s-server-on-worker-1-with-aaaa") && name.len() <= 63,
            "{name}"
        );
        let labels = job.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get("upgrade.cattle.io/plan").map(String::as_str),
            Some("k3s-server")
        );
        assert_eq!(
            labels.get("upgrade.cattle.io/node").map(String::as_str),
            Some("worker-1.example")
        );
        assert_eq!(labels.get("plan.upgrade.cattle.io/k3s-server"), Some(&hash));
        assert_eq!(
            labels.get("upgrade.cattle.io/controller").map(String::as_str),
            Some("system-upgrade-controller")
        );
        let spec = job.spec.expect("a spec");
        assert_eq!(spec.active_deadline_seconds, Some(600));
        assert_eq!(
            spec.pod_replacement_policy.as_deref(),
            Some("TerminatingOrFailed")
        );
        let pod = spec.template.spec.expect("a pod spec");
        assert_eq!(pod.host_pid, Some(true));
        let c = &pod.containers[0];
        assert_eq!(c.image.as_deref(), Some("rancher/k3s-upgrade:v1.30.1-k3s1"));
        let env: Vec<&str> = c.env.iter().flatten().map(|e| e.name.as_str()).collect();
        for want in [
            "SYSTEM_UPGRADE_NODE_NAME",
            "SYSTEM_UPGRADE_PLAN_LATEST_HASH",
            "SYSTEM_UPGRADE_PLAN_LATEST_VERSION",
        ] {
            assert!(env.contains(&want), "{want} in {env:?}");
        }
        let mounts: Vec<&str> = c
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| m.mount_path.as_str())
            .collect();
        assert_eq!(mounts, vec!["/host", "/run/system-upgrade/pod", "/creds", "/run"]);
        let sc = c.security_context.clone().unwrap_or_default();
        assert_eq!(sc.privileged, Some(true));
        let terms = pod
            .affinity
            .and_then(|a| a.node_affinity)
            .and_then(|n| n.required_during_scheduling_ignored_during_execution);
        let values = terms.map(|t| {
            t.node_selector_terms[0]
                .match_expressions
                .clone()
                .unwrap_or_default()[0]
                .values
                .clone()
        });
        assert_eq!(values, Some(Some(vec!["worker-1".to_string()])));
        assert_eq!(
            job.metadata.owner_references.map(|o| o[0].uid.clone()),
            Some("uid-1".into())
        );
    }

    #[test]
    fn annotations_secrets_and_prepare_as_upstream() {
        let mut p = plan();
        p.metadata.annotations = Some(BTreeMap::from([
            ("example.com/owner".to_string(), "ops".to_string()),
            (
                "upgrade.cattle.io/digest".to_string(),
                "spec.upgrade.image".to_string(),
            ),
            (
                "kubectl.kubernetes.io/last-applied-configuration".to_string(),
                "{}".to_string(),
            ),
        ]));
        p.spec.prepare = Some(ContainerSpec {
            image: "rancher/k3s-upgrade".into(),
            args: vec!["prepare".into(), "k3s-server".into()],
            ..Default::default()
        });
        let d = JobDefaults::default();
        let job = upgrade_job(&p, &linux("n1", "n1"), "v1", "h", &d);
        let annotations = job.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations,
            BTreeMap::from([
                ("example.com/owner".to_string(), "ops".to_string()),
                (TTL_ANNOTATION.to_string(), "900".to_string()),
            ])
        );
        let template = job.spec.clone().expect("a spec").template;
        let pod_annotations = template.metadata.and_then(|m| m.annotations).unwrap_or_default();
        assert_eq!(pod_annotations.keys().collect::<Vec<_>>(), ["example.com/owner"]);
        let pod = template.spec.expect("a pod");
        assert!(pod.init_containers.is_none(), "prepare runs in a Job of its own");
        let prep = prepare_job(&p, &linux("n1", "n1"), "v1", "h", &d).expect("a prepare Job");
        let prep_pod = prep.spec.expect("a spec").template.spec.expect("a pod");
        assert_eq!(prep_pod.containers[0].name, "prepare");
        assert_eq!(
            prep_pod.containers[0].security_context, None,
            "not privileged by default"
        );
        assert!(
            pod.containers[0]
                .security_context
                .as_ref()
                .and_then(|c| c.privileged)
                == Some(true)
        );
        let table = [
            ("creds", "/creds", "/creds"),
            ("creds", "creds", "/run/system-upgrade/secrets/creds"),
            ("creds", "sub/dir", "/run/system-upgrade/secrets/sub/dir"),
            ("creds", "", "/run/system-upgrade/secrets/creds"),
        ];
        for (name, path, want) in table {
            assert_eq!(secret_path(name, path), want, "{path:?}");
        }
    }

    #[test]
    fn deadlines_and_tags() {
        // (plan's deadline, the maximum, the Job's)
        for (secs, max, want) in [
            (None, 0, Some(600)),
            (Some(0), 0, None),
            (Some(30), 0, Some(30)),
            (Some(-1), 0, Some(600)),
            (Some(0), 300, Some(300)),
            (None, 300, Some(300)),
            (Some(30), 300, Some(30)),
            (Some(3600), 300, Some(300)),
        ] {
            let d = JobDefaults {
                active_deadline_max_secs: max,
                ..JobDefaults::default()
            };
            let mut p = plan();
            p.spec.job_active_deadline_secs = secs;
            let job = upgrade_job(&p, &linux("n", "n"), "v1", "h", &d);
            assert_eq!(
                job.spec.and_then(|s| s.active_deadline_seconds),
                want,
                "{secs:?} max {max}"
            );
        }
        let table = [
            ("rancher/k3os", "v0.9.0", "rancher/k3os:v0.9.0"),
            ("rancher/k3os:v1", "v0.9.0", "rancher/k3os:v1"),
            ("registry:5000/k3os", "v2", "registry:5000/k3os:v2"),
            ("k3os@sha256:abc", "v2", "k3os@sha256:abc"),
        ];
        for (image, version, want) in table {
            assert_eq!(with_tag(image, version), want);
        }
    }

    #[test]
    fn the_operators_job_settings_apply() {
        let d = JobDefaults {
            privileged: false,
            image_pull_policy: "Always".into(),
            ttl_after_finished_secs: 60,
            controller_name: "suc-east".into(),
            pod_replacement_policy: "Failed".into(),
            ..JobDefaults::default()
        };
        let job = upgrade_job(&plan(), &linux("n", "n"), "v1", "h", &d);
        assert_eq!(
            job.labels()
                .get("upgrade.cattle.io/controller")
                .map(String::as_str),
            Some("suc-east")
        );
        let spec = job.spec.expect("a spec");
        assert_eq!(spec.ttl_seconds_after_finished, Some(60));
        assert_eq!(spec.pod_replacement_policy.as_deref(), Some("Failed"));
        let c = &spec.template.spec.expect("a pod").containers[0];
        assert_eq!(c.image_pull_policy.as_deref(), Some("Always"));
        assert_eq!(
            c.security_context.as_ref().and_then(|s| s.privileged),
            Some(false)
        );
    }

    #[test]
    fn windows_nodes_run_host_processes() {
        let windows = JobNode::of(&k8s_openapi::api::core::v1::Node {
            metadata: ObjectMeta {
                name: Some("win-1".into()),
                labels: Some(BTreeMap::from([
                    ("kubernetes.io/os".to_string(), "windows".to_string()),
                    (HOSTNAME_LABEL.to_string(), "WIN-1".to_string()),
                ])),
                ..Default::default()
            },
            ..Default::default()
        });
        assert_eq!(
            windows,
            JobNode {
                name: "win-1".into(),
                hostname: "WIN-1".into(),
                windows: true
            }
        );
        let mut p = plan();
        p.spec.prepare = Some(ContainerSpec {
            image: "prep".into(),
            security_context: Some(SecurityContext {
                privileged: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        });
        let d = JobDefaults::default();
        let context = |job: Job| {
            job.spec
                .and_then(|s| s.template.spec)
                .and_then(|p| p.containers[0].security_context.clone())
                .unwrap_or_default()
        };
        let host_process = |c: &SecurityContext| {
            c.windows_options
                .as_ref()
                .map(|w| (w.host_process, w.run_as_user_name.clone()))
        };
        let want = Some((Some(true), Some("NT AUTHORITY\\SYSTEM".to_string())));
        let upgrade = context(upgrade_job(&p, &windows, "v1", "h", &d));
        assert_eq!(host_process(&upgrade), want);
        assert_eq!(upgrade.privileged, None);
        let prepare = context(prepare_job(&p, &windows, "v1", "h", &d).expect("a prepare Job"));
        assert_eq!(host_process(&prepare), want, "Windows overrides the plan's");
        // A plan's own upgrade securityContext wins, on Windows too.
        p.spec.upgrade.security_context = Some(SecurityContext::default());
        let upgrade = context(upgrade_job(&p, &windows, "v1", "h", &d));
        assert_eq!(upgrade, SecurityContext::default());
    }

    #[test]
    fn go_durations() {
        let table = [
            ("90s", Some(90.0)),
            ("1h30m", Some(5400.0)),
            ("500ms", Some(0.5)),
            ("0", Some(0.0)),
            ("-5s", None),
            ("5", None),
            ("", None),
        ];
        for (s, want) in table {
            assert_eq!(parse_go_duration(s).map(|d| d.as_secs_f64()), want, "{s}");
        }
    }
}
