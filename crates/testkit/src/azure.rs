//! Azure in tests: the ARM fake (`e2e/azurefake`, built once into the
//! cache, its wire format armcompute's own model types, its long-running
//! operations ARM's), VM scale sets made through ARM as an installer makes
//! them, and a joiner that plays the kubelets: each provisioned VM of the
//! cluster becomes a kwok Node with its provider ID and image after a boot
//! delay, and its Node goes when the VM does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use nodewarden::cloud::GroupRole;
use nodewarden::cloud::azure::api::Arm;
use nodewarden::cloud::azure::credentials::{Cached, Source};
use nodewarden::cloud::azure::{AzureConfig, image};
use nodewarden_simcloud::model::JoinJob;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::RUN_LABEL;
use super::fake_process::FakeProcess;

/// The subscription of the tests (the fake accepts any).
pub const SUBSCRIPTION: &str = "00000000-0000-4000-8000-000000000001";
/// Their resource group.
pub const RESOURCE_GROUP: &str = "nodewarden-test";
/// The client secret the fake is started to accept.
pub const SECRET: &str = "test-secret";

/// The fake's binary: `e2e/azurefake/build.sh` builds it on first use.
pub fn azurefake() -> &'static Path {
    static BIN: LazyLock<PathBuf> = LazyLock::new(|| super::fake_process::build("azurefake"));
    &BIN
}

/// An ARM fake of one test, stopped on drop.
pub struct AzureFake {
    process: FakeProcess,
    pub endpoint: String,
}

impl AzureFake {
    /// A fake that asks no token and polls at once.
    pub fn start() -> AzureFake {
        Self::start_with(&[])
    }

    /// A fake with more flags (`-require-token`, `-federated-token T`, ...).
    pub fn start_with(flags: &[&str]) -> AzureFake {
        let mut args = vec!["-retry-after", "0", "-client-secret", SECRET];
        args.extend_from_slice(flags);
        let process = FakeProcess::start("azurefake", azurefake(), &args);
        let endpoint = process.endpoint.clone();
        AzureFake { process, endpoint }
    }

    /// Tokens by the client-secret grant of the fake's Azure AD.
    pub fn secret_source(&self) -> Source {
        Source::Secret {
            authority: self.endpoint.clone(),
            tenant: "tenant".into(),
            client_id: "nodewarden".into(),
            secret: SECRET.into(),
        }
    }

    /// A client of the fake (the tests' own calls).
    pub fn client(&self) -> Arc<Arm> {
        let credentials = Cached::new(self.secret_source());
        let arm = Arm::new(
            Some(self.endpoint.clone()),
            credentials,
            Duration::from_secs(10),
            Duration::from_millis(200),
        );
        Arc::new(arm.expect("a client of the fake"))
    }

    /// The provider configuration nodewarden gets for this fake.
    pub fn provider_config(&self, cluster_uid: &str) -> AzureConfig {
        AzureConfig {
            cluster_uid: cluster_uid.to_string(),
            subscription: SUBSCRIPTION.into(),
            resource_group: RESOURCE_GROUP.into(),
            endpoint: Some(self.endpoint.clone()),
            credentials: Some(self.secret_source()),
            max_poll: Some(Duration::from_millis(200)),
            ..Default::default()
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

/// The ARM ID of the test scale set `name`.
pub fn scale_set_id(name: &str) -> String {
    format!(
        "/subscriptions/{SUBSCRIPTION}/resourceGroups/{RESOURCE_GROUP}/providers/Microsoft.Compute/virtualMachineScaleSets/{name}"
    )
}

/// A scale set of `size` VMs on `image`, tagged for the cluster; its ID.
pub async fn create_scale_set(
    arm: &Arm,
    uid: &str,
    name: &str,
    role: &str,
    size: i64,
    image: &str,
) -> String {
    let id = scale_set_id(name);
    let body = json!({
        "location": "westeurope",
        "tags": {"constellation-uid": uid, "constellation-role": role, "constellation-node-group": name},
        "sku": {"name": "Standard_DC4as_v5", "tier": "Standard", "capacity": size},
        "properties": {
            "orchestrationMode": "Uniform",
            "virtualMachineProfile": {
                "osProfile": {"computerNamePrefix": name},
                "storageProfile": {"imageReference": image::reference_for(image)},
            },
        },
    });
    let what = format!("creating scale set {name}");
    arm.put(&id, &body, &what)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    id
}

/// A VM as the fake shows it: (provisioning state, role tag, computer name, image).
pub type Vms = BTreeMap<String, (String, String, String, String)>;

/// The cluster's VMs by provider ID.
pub async fn vms(arm: &Arm, uid: &str) -> Result<Vms, String> {
    let sets_path = format!(
        "/subscriptions/{SUBSCRIPTION}/resourceGroups/{RESOURCE_GROUP}/providers/Microsoft.Compute/virtualMachineScaleSets"
    );
    let sets: Vec<Value> = arm
        .list(&sets_path, "the scale sets")
        .await
        .map_err(|e| e.to_string())?;
    let mut all = Vms::new();
    for set in sets.iter().filter(|s| s["tags"]["constellation-uid"] == uid) {
        let id = set["id"].as_str().unwrap_or_default();
        let role = set["tags"]["constellation-role"].as_str().unwrap_or_default();
        let path = format!("{id}/virtualMachines");
        let members: Vec<Value> = arm.list(&path, "the VMs").await.map_err(|e| e.to_string())?;
        for vm in members {
            let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
            let reference: image::ImageReference =
                serde_json::from_value(vm["properties"]["storageProfile"]["imageReference"].clone())
                    .unwrap_or_default();
            let value = (
                text(&vm["properties"]["provisioningState"]),
                role.to_string(),
                text(&vm["properties"]["osProfile"]["computerName"]).to_lowercase(),
                reference.image().unwrap_or_default(),
            );
            all.insert(format!("azure://{}", text(&vm["id"])), value);
        }
    }
    Ok(all)
}

/// Plays the kubelets until stopped: a provisioned VM's Node appears `boot`
/// after the joiner first sees it; a gone or deleting VM's Node goes.
pub async fn join(
    client: Client,
    arm: Arc<Arm>,
    run_id: String,
    uid: String,
    boot: Duration,
    stop: CancellationToken,
) {
    let nodes: Api<Node> = Api::all(client);
    let mut first_seen: BTreeMap<String, tokio::time::Instant> = BTreeMap::new();
    let mut joined: BTreeMap<String, String> = BTreeMap::new();
    while !stop.is_cancelled() {
        if let Ok(all) = vms(&arm, &uid).await {
            for (id, (state, role, name, image)) in &all {
                if state != "Succeeded" || joined.contains_key(id) {
                    continue;
                }
                let seen = *first_seen
                    .entry(id.clone())
                    .or_insert_with(tokio::time::Instant::now);
                if seen.elapsed() < boot {
                    continue;
                }
                let node = node_for(&run_id, id, name, image, role);
                match nodes.create(&PostParams::default(), &node).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 409 => {}
                    Err(_) => continue,
                }
                joined.insert(id.clone(), node.name_any());
            }
            let gone: Vec<String> = joined
                .keys()
                .filter(|id| all.get(*id).is_none_or(|vm| vm.0 == "Deleting"))
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

fn node_for(run_id: &str, provider_id: &str, name: &str, image: &str, role: &str) -> Node {
    let job = JoinJob {
        instance: name.to_string(),
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
pub async fn wait_instances_equal_nodes(env: &super::TestEnv, arm: &Arm, uid: &str) {
    super::discovery::wait_instances_equal_nodes(env, "the ARM fake", || async {
        let all = vms(arm, uid).await?;
        Ok(all
            .into_iter()
            .filter(|(_, v)| v.0 == "Succeeded")
            .map(|(id, _)| id)
            .collect())
    })
    .await;
}

/// The scale sets of the Azure tests: (suffix, `constellation-role` tag, ScalingGroup role, size).
pub const SCALE_SETS: [(&str, &str, &str, i64); 3] = [
    ("cp", "control-plane", "ControlPlane", 3),
    ("wa", "worker", "Worker", 3),
    ("wb", "worker", "Worker", 3),
];

/// A cluster on the fake: [`SCALE_SETS`] tagged with the test's id as
/// `constellation-uid`, and the joiner making their VMs Nodes.
pub struct AzureCluster {
    pub arm: Arc<Arm>,
    pub uid: String,
    /// (scale set ID, its name, ScalingGroup role).
    pub groups: Vec<(String, String, &'static str)>,
    joiner: super::discovery::Joiner,
}

impl AzureCluster {
    /// Creates the scale sets on `image` and waits until each VM is a Ready Node.
    pub async fn start(env: &super::TestEnv, fake: &AzureFake, image: &str) -> AzureCluster {
        let arm = fake.client();
        let uid = env.id.clone();
        let mut groups = Vec::new();
        let mut total = 0;
        for (suffix, tag, role, size) in SCALE_SETS {
            let name = format!("{}-{suffix}", env.id);
            let id = create_scale_set(&arm, &uid, &name, tag, size, image).await;
            groups.push((id, name, role));
            total += size as usize;
        }
        let (client, cloud, run, cluster) = (env.client.clone(), arm.clone(), env.id.clone(), uid.clone());
        let boot = Duration::from_secs(1);
        let joiner = super::discovery::Joiner::start(env, total, "the fake's VMs", move |stop| {
            join(client, cloud, run, cluster, boot, stop)
        })
        .await;
        AzureCluster {
            arm,
            uid,
            groups,
            joiner,
        }
    }

    /// Nothing leaked: the fake's provisioned VMs are exactly the Nodes.
    pub async fn wait_instances_equal_nodes(&self, env: &super::TestEnv) {
        wait_instances_equal_nodes(env, &self.arm, &self.uid).await;
    }

    /// Every scale set's model boots `image`.
    pub async fn assert_models_on(&self, image: &str) {
        for (id, name, _) in &self.groups {
            let set: Value = self.arm.get(id, "a scale set").await.expect("the scale set");
            let reference: image::ImageReference = serde_json::from_value(
                set["properties"]["virtualMachineProfile"]["storageProfile"]["imageReference"].clone(),
            )
            .expect("its image reference");
            assert_eq!(reference.image().as_deref(), Some(image), "{name}'s model");
        }
    }

    /// Stops the joiner.
    pub async fn stop(self) {
        self.joiner.stop().await;
    }
}
