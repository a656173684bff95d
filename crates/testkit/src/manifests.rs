//! YAML manifests against the real API server: reading multi-document files,
//! turning documents into `DynamicObject`s and server-side applying them (a
//! dry run or for real), with the resource and scope found through discovery.

use std::path::Path;

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Scope, pinned_kind};
use kube::{Client, ResourceExt};
use serde::Deserialize;
use serde_json::Value;

/// The field manager of every apply the tests make from manifests.
pub const FIELD_MANAGER: &str = "nodewarden-test";

/// The file name of `path`, as the tests name a file in their messages.
pub fn file_name(path: &Path) -> String {
    path.file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_string()
}

/// The non-empty YAML documents of `path`, as JSON values.
pub fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_norway::Deserializer::from_str(&text)
        .enumerate()
        .map(|(i, doc)| {
            Value::deserialize(doc)
                .unwrap_or_else(|e| panic!("{} document {i} is not valid YAML: {e}", path.display()))
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// Document `i` of the file named `file` as a Kubernetes object.
pub fn to_object(file: &str, i: usize, doc: Value) -> DynamicObject {
    serde_json::from_value(doc)
        .unwrap_or_else(|e| panic!("{file} document {i} is not a Kubernetes object: {e}"))
}

pub fn gvk_of(obj: &DynamicObject) -> GroupVersionKind {
    let types = obj.types.as_ref().expect("apiVersion and kind");
    GroupVersionKind::try_from(types).expect("a valid apiVersion")
}

pub fn is_namespace(obj: &DynamicObject) -> bool {
    obj.types
        .as_ref()
        .is_some_and(|t| t.api_version == "v1" && t.kind == "Namespace")
}

/// `file: apiVersion/kind namespace/name`, for messages.
pub fn describe(file: &str, obj: &DynamicObject) -> String {
    let types = obj
        .types
        .as_ref()
        .map(|t| format!("{}/{}", t.api_version, t.kind));
    format!(
        "{file}: {} {}{}",
        types.unwrap_or_default(),
        obj.namespace().map(|ns| format!("{ns}/")).unwrap_or_default(),
        obj.name_any()
    )
}

/// What one server-side apply came to.
pub enum Applied {
    Done(Box<DynamicObject>),
    /// The API server does not serve the object's kind (its CRD is missing).
    NotServed(String),
}

/// Server-side applies `obj` (a dry run unless `dry_run` is false), resolving
/// its resource and scope through discovery.
pub async fn apply(client: &Client, obj: &DynamicObject, dry_run: bool) -> Result<Applied, String> {
    let gvk = gvk_of(obj);
    let (resource, caps) = match pinned_kind(client, &gvk).await {
        Ok(found) => found,
        Err(e) => return Ok(Applied::NotServed(format!("discovery of {gvk:?}: {e}"))),
    };
    let api: Api<DynamicObject> = match caps.scope {
        Scope::Namespaced => {
            let ns = obj
                .namespace()
                .ok_or_else(|| "a namespaced object without metadata.namespace".to_string())?;
            Api::namespaced_with(client.clone(), &ns, &resource)
        }
        Scope::Cluster => {
            if obj.namespace().is_some() {
                return Err("a cluster-scoped object with metadata.namespace".into());
            }
            Api::all_with(client.clone(), &resource)
        }
    };
    // force: the CRDs are already applied by the test harness under another
    // field manager; a dry run changes nothing either way. Strict: an unknown
    // or misspelt field fails the apply.
    let mut params = PatchParams::apply(FIELD_MANAGER).force().validation_strict();
    if dry_run {
        params = params.dry_run();
    }
    api.patch(&obj.name_any(), &params, &Patch::Apply(obj))
        .await
        .map(|o| Applied::Done(Box::new(o)))
        .map_err(|e| e.to_string())
}

/// Server-side applies every document of a YAML file (as `kubectl apply
/// --server-side` would), for fixtures that are the real manifests.
pub async fn apply_manifest(client: &Client, path: &Path) {
    let file = file_name(path);
    for (i, doc) in documents(path).into_iter().enumerate() {
        let obj = to_object(&file, i, doc);
        match apply(client, &obj, false).await {
            Ok(Applied::Done(_)) => {}
            Ok(Applied::NotServed(e)) | Err(e) => panic!("applying {}: {e}", describe(&file, &obj)),
        }
    }
}

/// The objects `kubectl kustomize <dir>` renders (the pinned kubectl of the
/// local control plane, whose kustomize is what `kubectl apply -k` runs).
pub fn kustomize(dir: &Path) -> Vec<Value> {
    let cp = super::control_plane();
    let bin_dir = std::fs::read_to_string(cp.run_dir.join("bin-dir")).expect("the control plane's bin-dir");
    let out = std::process::Command::new(Path::new(bin_dir.trim()).join("kubectl"))
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("running kubectl kustomize");
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_norway::Deserializer::from_slice(&out.stdout)
        .map(|doc| Value::deserialize(doc).expect("kustomize prints YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

/// The document of `kind` named `name` among `docs`.
pub fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

/// The data of the ConfigMap whose name starts with `prefix` (a
/// configMapGenerator adds a hash suffix).
pub fn generated_config_map(docs: &[Value], prefix: &str) -> (String, serde_json::Map<String, Value>) {
    let cm = docs
        .iter()
        .find(|d| {
            d["kind"] == "ConfigMap"
                && d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(prefix))
        })
        .unwrap_or_else(|| panic!("no ConfigMap {prefix}-*"));
    (
        cm["metadata"]["name"].as_str().unwrap_or_default().to_string(),
        cm["data"].as_object().cloned().unwrap_or_default(),
    )
}

/// The nodewarden Deployment's container in rendered `docs`: its args and
/// the ConfigMaps it reads its environment from (`envFrom`).
pub fn shipped_container(docs: &[Value]) -> (&Value, Vec<String>, Vec<String>) {
    let c = &find(docs, "Deployment", "nodewarden")["spec"]["template"]["spec"]["containers"][0];
    let args = c["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(String::from)
        .collect();
    let from = c["envFrom"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["configMapRef"]["name"].as_str().map(String::from))
        .collect();
    (c, args, from)
}
