//! GCP in tests: the Compute fake (`e2e/gcefake`, built once into the
//! cache, its wire format Google's own generated Go types), managed instance
//! groups made through the Compute API as an installer makes them, and a
//! joiner that plays the kubelets: each RUNNING instance of the cluster
//! becomes a kwok Node with its provider ID and image after a boot delay,
//! and its Node goes when the instance does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use nodewarden::cloud::GroupRole;
use nodewarden::cloud::gcp::api::{Compute, Operation};
use nodewarden::cloud::gcp::credentials::Source;
use nodewarden::cloud::gcp::{GcpConfig, ids};
use nodewarden_simcloud::model::JoinJob;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::RUN_LABEL;
use super::fake_process::FakeProcess;

/// The project of the tests (the fake accepts any).
pub const PROJECT: &str = "nodewarden-test";
/// The fake's project number, as `created-by` names the project.
pub const PROJECT_NUMBER: &str = "123456789012";

/// The fake's binary: `e2e/gcefake/build.sh` builds it on first use.
pub fn gcefake() -> &'static Path {
    static BIN: LazyLock<PathBuf> = LazyLock::new(|| super::fake_process::build("gcefake"));
    &BIN
}

/// A Compute fake of one test, stopped on drop.
pub struct GceFake {
    process: FakeProcess,
    pub endpoint: String,
}

impl GceFake {
    /// A fake that checks no token.
    pub fn start() -> GceFake {
        Self::start_with(&[])
    }

    /// A fake with more flags (`-require-token`, `-sa-public-key FILE`, ...).
    pub fn start_with(flags: &[&str]) -> GceFake {
        let mut args = vec!["-project-number", PROJECT_NUMBER, "-metadata-project", PROJECT];
        args.extend_from_slice(flags);
        let process = FakeProcess::start("gcefake", gcefake(), &args);
        let endpoint = process.endpoint.clone();
        GceFake { process, endpoint }
    }

    /// The fake's `host:port` (the metadata server's address).
    pub fn host(&self) -> &str {
        self.endpoint.trim_start_matches("http://")
    }

    /// A client of the fake without a token (the tests' own calls).
    pub fn client(&self) -> Arc<Compute> {
        let compute = Compute::new(
            Some(self.endpoint.clone()),
            Source::Anonymous,
            Duration::from_secs(10),
        );
        Arc::new(compute.expect("a client of the fake"))
    }

    /// The provider configuration nodewarden gets for this fake.
    pub fn provider_config(&self, cluster_uid: &str) -> GcpConfig {
        GcpConfig {
            cluster_uid: cluster_uid.to_string(),
            project: Some(PROJECT.into()),
            endpoint: Some(self.endpoint.clone()),
            credentials: Some(Source::Anonymous),
            call_timeout: None,
        }
    }

    /// A control request of the fake (`/fake/...`), its answer's body.
    pub async fn control(&self, method: &str, path_and_query: &str) -> String {
        self.process.control(method, path_and_query).await
    }

    /// Its process ID (to pause it: a cloud that stops answering).
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
}

/// Waits for a setup operation and fails the test on its errors.
async fn done(compute: &Compute, operation: Operation, what: &str) {
    let done = compute
        .wait_done(PROJECT, operation, Duration::from_secs(30), what)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    nodewarden::cloud::gcp::api::check(done, what).unwrap_or_else(|e| panic!("{what}: {e}"));
}

/// An instance template on `image` labelled for the cluster and a managed
/// instance group of `size` from it in `zone`; returns the group's ID.
pub async fn create_group(
    compute: &Compute,
    uid: &str,
    zone: &str,
    name: &str,
    role: &str,
    size: i64,
    image: &str,
) -> String {
    let template = json!({
        "name": format!("{name}-template"),
        "properties": {
            "machineType": "n2d-standard-4",
            "labels": {"constellation-uid": uid, "constellation-role": role, "constellation-node-group": name},
            "disks": [{"boot": true, "initializeParams": {"sourceImage": image, "diskSizeGb": "10"}}],
        },
    });
    let what = format!("creating template {name}-template");
    let op: Operation = compute
        .post(
            &format!("projects/{PROJECT}/global/instanceTemplates"),
            &template,
            &what,
        )
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    done(compute, op, &what).await;
    let manager = json!({
        "name": name, "baseInstanceName": name, "targetSize": size,
        "instanceTemplate": format!("projects/{PROJECT}/global/instanceTemplates/{name}-template"),
    });
    let what = format!("creating group {name}");
    let op: Operation = compute
        .post(
            &format!("projects/{PROJECT}/zones/{zone}/instanceGroupManagers"),
            &manager,
            &what,
        )
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    done(compute, op, &what).await;
    format!("projects/{PROJECT}/zones/{zone}/instanceGroupManagers/{name}")
}

/// An instance as the fake shows it: (status, zone, role label, boot disk URL).
pub type Instances = BTreeMap<String, (String, String, String, String)>;

/// The cluster's instances by provider ID (every page of the aggregated list).
pub async fn instances(compute: &Compute, uid: &str) -> Result<Instances, String> {
    let mut all = Instances::new();
    let mut token = String::new();
    loop {
        let path = format!("projects/{PROJECT}/aggregated/instances?maxResults=50&pageToken={token}");
        let page: Value = compute
            .get(&path, "the instances")
            .await
            .map_err(|e| e.to_string())?;
        for scoped in page["items"].as_object().into_iter().flat_map(|m| m.values()) {
            for i in scoped["instances"].as_array().into_iter().flatten() {
                if i["labels"]["constellation-uid"] != uid {
                    continue;
                }
                let zone = ids::zone_name(i["zone"].as_str().unwrap_or_default()).to_string();
                let id = format!(
                    "gce://{PROJECT}/{zone}/{}",
                    i["name"].as_str().unwrap_or_default()
                );
                let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
                let value = (
                    text(&i["status"]),
                    zone,
                    text(&i["labels"]["constellation-role"]),
                    text(&i["disks"][0]["source"]),
                );
                all.insert(id, value);
            }
        }
        match page["nextPageToken"].as_str() {
            Some(t) if !t.is_empty() => token = t.to_string(),
            _ => return Ok(all),
        }
    }
}

/// The image a boot disk was made from.
async fn disk_image(compute: &Compute, disk: &str) -> Option<String> {
    let disk: Value = compute.get(ids::short(disk), "a disk").await.ok()?;
    disk["sourceImage"].as_str().map(|s| ids::short(s).to_string())
}

/// Plays the kubelets until stopped: a RUNNING instance's Node appears
/// `boot` after the joiner first sees it; a gone or stopping instance's Node goes.
pub async fn join(
    client: Client,
    compute: Arc<Compute>,
    run_id: String,
    uid: String,
    boot: Duration,
    stop: CancellationToken,
) {
    let nodes: Api<Node> = Api::all(client);
    let mut first_seen: BTreeMap<String, tokio::time::Instant> = BTreeMap::new();
    let mut joined: BTreeMap<String, String> = BTreeMap::new();
    while !stop.is_cancelled() {
        if let Ok(all) = instances(&compute, &uid).await {
            for (id, (status, _, role, disk)) in &all {
                if status != "RUNNING" || joined.contains_key(id) {
                    continue;
                }
                let seen = *first_seen
                    .entry(id.clone())
                    .or_insert_with(tokio::time::Instant::now);
                let Some(image) = (seen.elapsed() >= boot)
                    .then_some(())
                    .and(disk_image(&compute, disk).await)
                else {
                    continue;
                };
                let node = node_for(&run_id, id, &image, role);
                match nodes.create(&PostParams::default(), &node).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 409 => {}
                    Err(_) => continue,
                }
                joined.insert(id.clone(), node.name_any());
            }
            let gone: Vec<String> = joined
                .keys()
                .filter(|id| all.get(*id).is_none_or(|i| i.0 == "STOPPING"))
                .cloned()
                .collect();
            for id in gone {
                if let Some(name) = joined.remove(&id) {
                    let _ = nodes.delete(&name, &DeleteParams::default()).await;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn node_for(run_id: &str, provider_id: &str, image: &str, role: &str) -> Node {
    let job = JoinJob {
        instance: ids::last_segment(provider_id).to_string(),
        group: role.to_string(),
        role: match role {
            "control-plane" => GroupRole::ControlPlane,
            _ => GroupRole::Worker,
        },
        image: image.to_string(),
        labels: BTreeMap::from([(RUN_LABEL.to_string(), run_id.to_string())]),
        internal_ip: None,
    };
    let mut node = nodewarden_simcloud::nodes::node_for(&job);
    if let Some(spec) = node.spec.as_mut() {
        spec.provider_id = Some(provider_id.to_string());
    }
    node
}

/// Nothing leaked: the cluster `uid`'s running instances on the fake are
/// exactly the test's Nodes.
pub async fn wait_instances_equal_nodes(env: &super::TestEnv, compute: &Compute, uid: &str) {
    super::discovery::wait_instances_equal_nodes(env, "the Compute fake", || async {
        let all = instances(compute, uid).await?;
        Ok(all
            .into_iter()
            .filter(|(_, v)| v.0 == "RUNNING")
            .map(|(id, _)| id)
            .collect())
    })
    .await;
}

/// The groups of the GCP tests: (suffix, zone, `constellation-role` label, ScalingGroup role, size).
pub const GROUPS: [(&str, &str, &str, &str, i64); 3] = [
    ("cp", "europe-west3-a", "control-plane", "ControlPlane", 3),
    ("workers-a", "europe-west3-a", "worker", "Worker", 3),
    ("workers-b", "europe-west3-b", "worker", "Worker", 3),
];

/// A cluster on the fake: [`GROUPS`] as managed instance groups labelled
/// with the test's id as `constellation-uid`, and the joiner making their
/// instances Nodes.
pub struct GcpCluster {
    pub compute: Arc<Compute>,
    pub uid: String,
    /// (group ID, its name, ScalingGroup role).
    pub groups: Vec<(String, String, &'static str)>,
    joiner: super::discovery::Joiner,
}

impl GcpCluster {
    /// Creates the groups on `image` and waits until each instance is a Ready Node.
    pub async fn start(env: &super::TestEnv, fake: &GceFake, image: &str) -> GcpCluster {
        let compute = fake.client();
        let uid = env.id.clone();
        let mut groups = Vec::new();
        let mut total = 0;
        for (suffix, zone, label, role, size) in GROUPS {
            let name = format!("{}-{suffix}", env.id);
            let id = create_group(&compute, &uid, zone, &name, label, size, image).await;
            groups.push((id, name, role));
            total += size as usize;
        }
        let (client, cloud, run, cluster) =
            (env.client.clone(), compute.clone(), env.id.clone(), uid.clone());
        let boot = Duration::from_secs(1);
        let joiner = super::discovery::Joiner::start(env, total, "the fake's instances", move |stop| {
            join(client, cloud, run, cluster, boot, stop)
        })
        .await;
        GcpCluster {
            compute,
            uid,
            groups,
            joiner,
        }
    }

    /// Nothing leaked: the fake's running instances are exactly the Nodes.
    pub async fn wait_instances_equal_nodes(&self, env: &super::TestEnv) {
        wait_instances_equal_nodes(env, &self.compute, &self.uid).await;
    }

    /// Every group's instance template boots `image`.
    pub async fn assert_templates_on(&self, image: &str) {
        for (id, name, _) in &self.groups {
            let manager: Value = self.compute.get(id, "a group").await.expect("the group");
            let link = manager["instanceTemplate"].as_str().unwrap_or_default();
            let template: Value = self
                .compute
                .get(ids::short(link), "a template")
                .await
                .expect("its template");
            let got = template["properties"]["disks"][0]["initializeParams"]["sourceImage"].as_str();
            assert_eq!(
                got.map(ids::short),
                Some(image),
                "{name}'s instance template {link}"
            );
        }
    }

    /// Stops the joiner.
    pub async fn stop(self) {
        self.joiner.stop().await;
    }
}
