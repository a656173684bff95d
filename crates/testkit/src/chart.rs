//! nodewarden's Helm chart (`charts/nodewarden`) in tests: the pinned helm
//! (`e2e/helm/build.sh` builds it once into the cache outside the
//! repository), `helm lint` and `helm template` of a release, and what the
//! kubelet would give the container of the rendered Deployment (its args,
//! its environment, a token of its ServiceAccount).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::LazyLock;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Client;
use kube::api::{Api, PostParams};
use serde::Deserialize;
use serde_json::Value;

pub fn chart_dir() -> PathBuf {
    crate::repo().join("charts/nodewarden")
}

/// The pinned helm binary: `e2e/helm/build.sh` builds it on first use
/// (`just test` runs it before the tests) and prints its path.
pub fn helm() -> &'static Path {
    static HELM: LazyLock<PathBuf> = LazyLock::new(|| {
        let out = Command::new(crate::repo().join("e2e/helm/build.sh"))
            .stderr(Stdio::inherit())
            .output()
            .expect("running e2e/helm/build.sh");
        assert!(out.status.success(), "e2e/helm/build.sh failed");
        let path = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .to_string();
        PathBuf::from(path)
    });
    &HELM
}

/// helm with homes of its own, so the user's helm configuration,
/// repositories and plugins play no part.
fn helm_command() -> Command {
    let home = std::env::temp_dir().join("nodewarden-helm-home");
    let mut command = Command::new(helm());
    for (var, dir) in [
        ("HELM_CACHE_HOME", "cache"),
        ("HELM_CONFIG_HOME", "config"),
        ("HELM_DATA_HOME", "data"),
    ] {
        command.env(var, home.join(dir));
    }
    command
}

/// helm's stdout when it succeeded, else its stderr.
fn answer(out: Output) -> Result<String, String> {
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// A release of the chart: its name, namespace and values.
pub struct Release {
    pub name: String,
    pub namespace: String,
    pub values: Value,
}

impl Release {
    pub fn new(name: &str, namespace: &str, values: Value) -> Release {
        Release {
            name: name.to_string(),
            namespace: namespace.to_string(),
            values,
        }
    }

    /// helm (`lint` or `template`) on the chart with this release's values
    /// (a values file: JSON is YAML, and no `--set` escaping is needed).
    fn run(&self, args: &[&str]) -> Result<String, String> {
        let mut values = tempfile::Builder::new()
            .prefix("nodewarden-values-")
            .suffix(".yaml")
            .tempfile()
            .expect("a values file");
        serde_json::to_writer(&mut values, &self.values).expect("writing the values");
        let out = helm_command()
            .args(args)
            .arg(chart_dir())
            .args(["--namespace", &self.namespace, "--values"])
            .arg(values.path())
            .output()
            .expect("running helm");
        answer(out)
    }

    /// `helm install` of this release against the API server of
    /// `kubeconfig`, without the CRDs (the tests install them), its
    /// manifests passed through the executable `post_renderer` first;
    /// `template` takes it too, to show what would be installed.
    pub fn install(&self, kubeconfig: &Path, post_renderer: &Path) -> Result<String, String> {
        let (kubeconfig, post_renderer) = (kubeconfig.to_string_lossy(), post_renderer.to_string_lossy());
        self.run(&[
            "install",
            &self.name,
            "--skip-crds",
            "--kubeconfig",
            &kubeconfig,
            "--post-renderer",
            &post_renderer,
        ])
    }

    /// `helm template` as [`Release::install`] renders it, through `post_renderer`.
    pub fn template_through(&self, post_renderer: &Path) -> Result<Vec<Value>, String> {
        let post_renderer = post_renderer.to_string_lossy();
        let text = self.run(&["template", &self.name, "--post-renderer", &post_renderer])?;
        documents(&text)
    }

    /// `helm uninstall --wait`: Helm deletes what it installed and waits
    /// until the API server no longer has it.
    pub fn uninstall(&self, kubeconfig: &Path) -> Result<String, String> {
        let out = helm_command()
            .args([
                "uninstall",
                &self.name,
                "--wait",
                "--namespace",
                &self.namespace,
                "--kubeconfig",
            ])
            .arg(kubeconfig)
            .output()
            .expect("running helm");
        answer(out)
    }

    /// `helm lint --strict`: its report, or why it failed.
    pub fn lint(&self) -> Result<String, String> {
        self.run(&["lint", "--strict"])
    }

    /// `helm template` with the CRDs: the rendered documents, or helm's
    /// error (a value the schema refuses, a required value missing).
    pub fn template(&self) -> Result<Vec<Value>, String> {
        let text = self.run(&["template", &self.name, "--include-crds"])?;
        documents(&text)
    }
}

/// The documents helm printed, empty ones left out.
fn documents(text: &str) -> Result<Vec<Value>, String> {
    let docs = serde_norway::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).map_err(|e| format!("helm printed invalid YAML: {e}")))
        .collect::<Result<Vec<Value>, String>>()?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// The container of the Deployment `name` among rendered `docs`.
pub fn container<'a>(docs: &'a [Value], name: &str) -> &'a Value {
    &super::manifests::find(docs, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]
}

/// The environment the kubelet gives that container in pod `pod` of
/// `namespace`: its `envFrom` ConfigMaps (read from `docs`), then its `env`
/// with the downward API's `metadata.name` and `metadata.namespace` resolved.
pub fn pod_environment(
    docs: &[Value],
    container: &Value,
    namespace: &str,
    pod: &str,
) -> Vec<(String, String)> {
    let mut env = Vec::new();
    for from in container["envFrom"].as_array().into_iter().flatten() {
        let name = from["configMapRef"]["name"]
            .as_str()
            .expect("envFrom names a ConfigMap");
        let data = super::manifests::find(docs, "ConfigMap", name)["data"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        for (k, v) in data {
            env.push((k, v.as_str().unwrap_or_default().to_string()));
        }
    }
    for var in container["env"].as_array().into_iter().flatten() {
        let name = var["name"].as_str().expect("a variable's name").to_string();
        let value = match var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            Some("metadata.name") => pod.to_string(),
            Some("metadata.namespace") => namespace.to_string(),
            Some(other) => panic!("{name} reads {other}, which the tests do not resolve"),
            None => var["value"].as_str().unwrap_or_default().to_string(),
        };
        env.push((name, value));
    }
    env
}

/// A kubeconfig in `dir` authenticating with a fresh token of the
/// ServiceAccount `namespace/name`: the permissions its bindings give, and
/// nothing more.
pub async fn service_account_kubeconfig(client: &Client, namespace: &str, name: &str, dir: &Path) -> PathBuf {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let token = Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("a token of ServiceAccount {namespace}/{name}: {e}"))
        .status
        .and_then(|s| s.token)
        .expect("a token in the answer");
    let path = dir.join(format!("{name}.kubeconfig"));
    super::replicas::write_token_kubeconfig(&path, &token, None);
    path
}
