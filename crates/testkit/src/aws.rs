//! AWS in tests: moto's server (pinned, `e2e/moto/moto.sh`), Auto Scaling
//! groups made through the Query API as Constellation's installer makes them,
//! and a joiner that plays the kubelets: each running instance of the
//! cluster becomes a kwok Node with its provider ID and image after a boot
//! delay, and its Node goes when the instance is terminated.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, ResourceExt};
use nodewarden::cloud::GroupRole;
use nodewarden::cloud::aws::api;
use nodewarden::cloud::aws::form::Params;
use nodewarden::cloud::aws::query::{QueryClient, Service, Settings};
use nodewarden_simcloud::model::JoinJob;
use tokio_util::sync::CancellationToken;

use super::RUN_LABEL;
pub use super::discovery::create_budget_node_version;

/// The region the tests use (moto accepts any).
pub const REGION: &str = "us-east-1";
/// moto accepts any credentials.
pub const KEY: (&str, &str) = ("testing", "testing");

/// A moto server of one test, stopped on drop.
pub struct Moto {
    dir: tempfile::TempDir,
    pub endpoint: String,
}

fn script() -> PathBuf {
    crate::repo().join("e2e/moto/moto.sh")
}

impl Moto {
    pub fn start() -> Moto {
        let dir = tempfile::tempdir().expect("a temp dir");
        // moto records every request it carries out, in the order it
        // does; a failing test keeps the record (see Drop).
        let out = Command::new(script())
            .arg("start")
            .arg(dir.path())
            .env("MOTO_ENABLE_RECORDING", "True")
            .env("MOTO_RECORDER_FILEPATH", dir.path().join("requests.jsonl"))
            .output()
            .expect("running e2e/moto/moto.sh");
        assert!(
            out.status.success(),
            "starting moto failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let endpoint = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .trim()
            .to_string();
        Moto { dir, endpoint }
    }

    /// The server's pid. moto keeps its state in memory, so an outage is
    /// played by pausing it (SIGSTOP, then SIGCONT), not by a restart.
    pub fn pid(&self) -> u32 {
        let pid = std::fs::read_to_string(self.dir.path().join("pid")).expect("moto's pid");
        pid.trim().parse().expect("a pid")
    }

    /// A client of this server's EC2 and Auto Scaling APIs.
    pub fn client(&self) -> Arc<QueryClient> {
        let settings = Settings {
            region: REGION.into(),
            endpoint: Some(self.endpoint.clone()),
            static_credentials: Some((KEY.0.into(), KEY.1.into())),
            call_timeout: Duration::from_secs(10),
        };
        Arc::new(QueryClient::new(settings).expect("a client of moto"))
    }

    /// The provider configuration nodewarden gets for this server.
    pub fn provider_config(&self, cluster_uid: &str) -> nodewarden::cloud::aws::AwsConfig {
        nodewarden::cloud::aws::AwsConfig {
            cluster_uid: cluster_uid.to_string(),
            endpoint: Some(self.endpoint.clone()),
            region: REGION.into(),
            static_credentials: Some((KEY.0.into(), KEY.1.into())),
            call_timeout: None,
        }
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = Command::new(script()).arg("stop").arg(self.dir.path()).output();
        if std::thread::panicking() {
            // What moto was asked, in the order it acted: the record of a
            // failed test outlives its temporary directory.
            let kept = std::env::temp_dir().join(format!(
                "nodewarden-moto-requests-{}-{}.jsonl",
                std::process::id(),
                self.endpoint.rsplit(':').next().unwrap_or_default()
            ));
            if std::fs::copy(self.dir.path().join("requests.jsonl"), &kept).is_ok() {
                eprintln!(
                    "moto's requests, in the order it carried them out: {}",
                    kept.display()
                );
            }
        }
    }
}

/// A launch template on `image` and an Auto Scaling group of `size` from it,
/// tagged for the cluster (`constellation-uid`, `-role`, `-node-group`,
/// propagated to the instances).
pub async fn create_group(aws: &QueryClient, uid: &str, name: &str, role: &str, size: i32, image: &str) {
    let template = Params::new("CreateLaunchTemplate", Service::Ec2.version())
        .set("LaunchTemplateName", format!("{name}-template"))
        .set("LaunchTemplateData.ImageId", image)
        .set("LaunchTemplateData.InstanceType", "t3.small");
    let created = aws
        .call(Service::Ec2, template, "a launch template")
        .await
        .expect("a launch template");
    let id = created
        .text_at(&["launchTemplate", "launchTemplateId"])
        .expect("a template id");
    let tags: Vec<Vec<(&str, String)>> = [
        ("constellation-uid", uid),
        ("constellation-role", role),
        ("constellation-node-group", name),
    ]
    .iter()
    .map(|(k, v)| {
        vec![
            ("Key", k.to_string()),
            ("Value", v.to_string()),
            ("PropagateAtLaunch", "true".into()),
        ]
    })
    .collect();
    let group = Params::new("CreateAutoScalingGroup", Service::AutoScaling.version())
        .set("AutoScalingGroupName", name)
        .set("LaunchTemplate.LaunchTemplateId", id)
        .set("LaunchTemplate.Version", "$Default")
        .list("AvailabilityZones.member", [format!("{REGION}a")])
        .set("MinSize", "0")
        .set("MaxSize", "20")
        .set("DesiredCapacity", size.to_string())
        .structs("Tags.member", &tags);
    aws.call(Service::AutoScaling, group, "an Auto Scaling group")
        .await
        .expect("an Auto Scaling group");
}

/// The cluster's instances as EC2 shows them: id → (state, image, zone,
/// private DNS name, role tag).
pub type Instances = BTreeMap<String, (String, String, String, String, String)>;

pub async fn instances(aws: &QueryClient, uid: &str) -> Result<Instances, String> {
    let found = api::describe_instances(aws, &[], Some(("constellation-uid", uid)))
        .await
        .map_err(|e| e.to_string())?;
    let mut all = Instances::new();
    for i in found {
        let role = i
            .tags
            .iter()
            .find(|(k, _)| k == "constellation-role")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        let value = (
            i.state.clone().unwrap_or_else(|| "pending".into()),
            i.image_id.clone().unwrap_or_default(),
            i.zone.clone().unwrap_or_default(),
            i.private_dns_name.clone().unwrap_or_default(),
            role,
        );
        all.insert(i.id, value);
    }
    Ok(all)
}

/// Plays the kubelets until stopped: a running instance's Node appears
/// `boot` after the joiner first sees it; a terminated instance's Node goes.
pub async fn join(
    client: Client,
    aws: Arc<QueryClient>,
    run_id: String,
    uid: String,
    boot: Duration,
    stop: CancellationToken,
) {
    let nodes: Api<Node> = Api::all(client);
    let mut first_seen: BTreeMap<String, tokio::time::Instant> = BTreeMap::new();
    let mut joined: BTreeMap<String, String> = BTreeMap::new();
    while !stop.is_cancelled() {
        if let Ok(all) = instances(&aws, &uid).await {
            for (id, (state, image, zone, dns, role)) in &all {
                match state.as_str() {
                    "running" if !joined.contains_key(id) => {
                        let seen = *first_seen
                            .entry(id.clone())
                            .or_insert_with(tokio::time::Instant::now);
                        if seen.elapsed() < boot {
                            continue;
                        }
                        let node = node_for(&run_id, id, image, zone, dns, role);
                        match nodes.create(&PostParams::default(), &node).await {
                            Ok(_) => {}
                            Err(kube::Error::Api(s)) if s.code == 409 => {}
                            Err(_) => continue,
                        }
                        joined.insert(id.clone(), node.name_any());
                    }
                    "terminated" | "shutting-down" => {
                        if let Some(name) = joined.remove(id) {
                            let _ = nodes.delete(&name, &DeleteParams::default()).await;
                        }
                    }
                    _ => {}
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn node_for(run_id: &str, id: &str, image: &str, zone: &str, dns: &str, role: &str) -> Node {
    let job = JoinJob {
        instance: if dns.is_empty() {
            id.to_string()
        } else {
            dns.to_string()
        },
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
        spec.provider_id = Some(format!("aws:///{zone}/{id}"));
    }
    node
}

/// The image of the launch template version the group's template defaults to.
pub async fn default_image(aws: &QueryClient, group: &str) -> String {
    let (groups, _) = api::describe_groups(aws, &[group], None, None)
        .await
        .expect("the group");
    let template = groups
        .first()
        .and_then(|g| g.template.as_ref())
        .and_then(|t| t.id.clone())
        .expect("a launch template");
    let versions = api::template_versions(aws, &template, "$Default")
        .await
        .expect("the default version");
    versions
        .first()
        .and_then(|v| v.data.image_id.clone())
        .unwrap_or_default()
}

/// The groups of the AWS tests: (suffix, `constellation-role` tag, ScalingGroup role, size).
pub const GROUPS: [(&str, &str, &str, i32); 3] = [
    ("cp", "control-plane", "ControlPlane", 3),
    ("workers-a", "worker", "Worker", 3),
    ("workers-b", "worker", "Worker", 3),
];

/// A cluster on moto: [`GROUPS`] as Auto Scaling groups tagged with the
/// test's id as `constellation-uid`, and the joiner making their instances Nodes.
pub struct AwsCluster {
    pub aws: Arc<QueryClient>,
    pub uid: String,
    /// (Auto Scaling group name, ScalingGroup role).
    pub groups: Vec<(String, &'static str)>,
    joiner: super::discovery::Joiner,
}

impl AwsCluster {
    /// Creates the groups on `image` and waits until each instance is a Ready Node.
    pub async fn start(env: &super::TestEnv, moto: &Moto, image: &str) -> AwsCluster {
        let aws = moto.client();
        let uid = env.id.clone();
        let mut groups = Vec::new();
        let mut total = 0;
        for (g, tag_role, role, size) in GROUPS {
            let name = format!("{}-{g}", env.id);
            create_group(&aws, &uid, &name, tag_role, size, image).await;
            groups.push((name, role));
            total += size as usize;
        }
        let (client, cloud, run, cluster) = (env.client.clone(), aws.clone(), env.id.clone(), uid.clone());
        let boot = Duration::from_secs(1);
        let joiner = super::discovery::Joiner::start(env, total, "moto's instances", move |stop| {
            join(client, cloud, run, cluster, boot, stop)
        })
        .await;
        AwsCluster {
            aws,
            uid,
            groups,
            joiner,
        }
    }

    /// Nothing leaked: moto's running instances are exactly the Nodes.
    pub async fn wait_instances_equal_nodes(&self, env: &super::TestEnv) {
        super::discovery::wait_instances_equal_nodes(env, "moto", || async {
            let all = instances(&self.aws, &self.uid).await?;
            Ok(all
                .iter()
                .filter(|(_, v)| v.0 == "running")
                .map(|(id, v)| format!("aws:///{}/{id}", v.2))
                .collect())
        })
        .await;
    }

    /// Every group's launch template defaults to `image`.
    pub async fn assert_templates_default_to(&self, image: &str) {
        for (name, _) in &self.groups {
            assert_eq!(
                default_image(&self.aws, name).await,
                image,
                "{name}'s launch template"
            );
        }
    }

    /// Stops the joiner.
    pub async fn stop(self) {
        self.joiner.stop().await;
    }
}

/// Waits until discovery made one ScalingGroup per Auto Scaling group of
/// `cluster` (see [`super::discovery::wait_discovered`]).
pub async fn wait_discovered(env: &super::TestEnv, cluster: &AwsCluster) {
    let groups: Vec<(String, String, &str)> = cluster
        .groups
        .iter()
        .map(|(name, role)| (name.clone(), name.clone(), *role))
        .collect();
    super::discovery::wait_discovered(env, &groups).await;
}
