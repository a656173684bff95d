//! A Plan's hash: what a node is labelled with once upgraded, computed as the
//! System Upgrade Controller v0.20.1 computes it (`pkg/upgrade/plan/plan.go`,
//! `DigestStatus`), so nodes SUC upgraded count as upgraded after a switch.
//!
//! SHA-224 (hex) over, in order: the latest version, the service account,
//! the fields the `upgrade.cattle.io/digest` annotation names (comma
//! separated dotted paths into the Plan, each rendered as wrangler's
//! `data.Object.String` renders it), and kubectl's `SecretHash` of every
//! referenced Secret without `ignoreUpdates`, in `spec.secrets` order. The
//! image, command and args are deliberately not in it: editing them alone
//! does not re-run a plan (upstream's meaning; name them in the annotation
//! to make them count).

use k8s_openapi::api::core::v1::Secret;
use serde_json::Value;
use sha2::{Digest, Sha224, Sha256};

use crate::api::plan::PlanSpec;

/// The annotation naming extra Plan fields that belong in the hash.
pub const DIGEST_ANNOTATION: &str = "upgrade.cattle.io/digest";

/// The hash of a plan whose version resolved to `version`.
/// `plan` is the Plan as JSON (`status.latestVersion` is read as `version`,
/// as upstream sets it before hashing); `secret_hashes` come from
/// [`secret_hash`], in `spec.secrets` order.
pub fn plan_hash(version: &str, service_account: &str, plan: &Value, secret_hashes: &[String]) -> String {
    let mut h = Sha224::new();
    h.update(version.as_bytes());
    h.update(service_account.as_bytes());
    for field in digest_fields(plan, version) {
        h.update(field.as_bytes());
    }
    for s in secret_hashes {
        h.update(s.as_bytes());
    }
    super::hex(&h.finalize())
}

/// The rendered values of the fields the digest annotation names.
fn digest_fields(plan: &Value, version: &str) -> Vec<String> {
    let Some(names) = plan
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(DIGEST_ANNOTATION))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    else {
        return Vec::new();
    };
    let mut plan = go_shaped(plan.clone());
    if let Some(status) = plan.get_mut("status").and_then(Value::as_object_mut) {
        status.insert("latestVersion".into(), Value::String(version.into()));
    } else if let Some(obj) = plan.as_object_mut() {
        obj.insert("status".into(), serde_json::json!({ "latestVersion": version }));
    }
    names
        .split(',')
        .map(|path| {
            // wrangler's GetValue: walks maps only; anything else reads as nothing.
            let mut at = Some(&plan);
            for key in path.split('.') {
                at = at.and_then(|v| v.as_object()).and_then(|m| m.get(key));
            }
            go_to_string(at)
        })
        .collect()
}

/// The Plan as upstream's Go types would encode it: their non-pointer
/// `omitempty` scalars drop out when zero (`cordon: false` reads as "").
fn go_shaped(mut plan: Value) -> Value {
    fn drop_zero(obj: Option<&mut Value>, keys: &[&str]) {
        if let Some(m) = obj.and_then(Value::as_object_mut) {
            m.retain(|k, v| {
                let zero = matches!(v, Value::Bool(false) | Value::Null) || v.as_i64() == Some(0);
                !(zero && keys.contains(&k.as_str()))
            });
        }
    }
    drop_zero(plan.get_mut("spec"), &["concurrency", "exclusive", "cordon"]);
    drop_zero(
        plan.pointer_mut("/spec/drain"),
        &["force", "disableEviction", "skipWaitForDeleteTimeout"],
    );
    if let Some(secrets) = plan.pointer_mut("/spec/secrets").and_then(Value::as_array_mut) {
        for s in secrets {
            drop_zero(Some(s), &["ignoreUpdates"]);
        }
    }
    plan
}

/// wrangler's `convert.ToString`: the first element of a list, then Go's
/// `fmt.Sprint`, trimmed; nothing and null read as "".
fn go_to_string(v: Option<&Value>) -> String {
    let single = match v {
        Some(Value::Array(items)) => items.first(),
        other => other,
    };
    match single {
        None | Some(Value::Null) => String::new(),
        Some(v) => go_sprint(v).trim().to_string(),
    }
}

/// Go's `%v` of a JSON value decoded into `interface{}` (numbers kept as
/// written, maps with sorted keys).
fn go_sprint(v: &Value) -> String {
    match v {
        Value::Null => "<nil>".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        Value::Array(items) => format!("[{}]", items.iter().map(go_sprint).collect::<Vec<_>>().join(" ")),
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .iter()
                .map(|k| format!("{k}:{}", go_sprint(&m[*k])))
                .collect();
            format!("map[{}]", parts.join(" "))
        }
    }
}

/// kubectl's `hash.SecretHash`: SHA-256 of the JSON of kind, type, name,
/// data (base64) and immutable, keys sorted; the first ten hex digits with
/// 0,1,3,a,e turned into g,h,k,m,t.
pub fn secret_hash(secret: &Secret) -> String {
    let mut m = serde_json::Map::new();
    // The API server omits empty data; Go then encodes the nil map as null.
    let data = match &secret.data {
        // ByteString serializes as standard base64, as Go encodes []byte.
        Some(d) if !d.is_empty() => serde_json::to_value(d).unwrap_or_default(),
        _ => Value::Null,
    };
    m.insert("data".into(), data);
    if let Some(i) = secret.immutable {
        m.insert("immutable".into(), Value::Bool(i));
    }
    m.insert("kind".into(), Value::String("Secret".into()));
    m.insert(
        "name".into(),
        Value::String(secret.metadata.name.clone().unwrap_or_default()),
    );
    m.insert(
        "type".into(),
        Value::String(secret.type_.clone().unwrap_or_default()),
    );
    let json = go_json(&Value::Object(m));
    let hex = super::hex(&Sha256::digest(json.as_bytes()));
    hex[..10]
        .chars()
        .map(|c| match c {
            '0' => 'g',
            '1' => 'h',
            '3' => 'k',
            'a' => 'm',
            'e' => 't',
            c => c,
        })
        .collect()
}

/// `json.Marshal`'s text: keys sorted (serde_json's map is ordered) and
/// `<`, `>`, `&` escaped as Go escapes them.
fn go_json(v: &Value) -> String {
    serde_json::to_string(v)
        .unwrap_or_default()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}

/// The Secrets whose contents belong in the hash, in `spec.secrets` order.
pub fn hashed_secrets(spec: &PlanSpec) -> Vec<&str> {
    spec.secrets
        .iter()
        .filter(|s| !s.ignore_updates.unwrap_or(false))
        .map(|s| s.name.as_str())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use std::collections::BTreeMap;

    fn secret(name: &str, type_: Option<&str>, immutable: Option<bool>, data: &[(&str, &[u8])]) -> Secret {
        let mut s = Secret::default();
        s.metadata.name = Some(name.into());
        s.metadata.namespace = Some("system-upgrade".into());
        s.type_ = type_.map(str::to_string);
        s.immutable = immutable;
        if !data.is_empty() {
            s.data = Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                    .collect::<BTreeMap<_, _>>(),
            );
        }
        s
    }

    /// Values printed by system-upgrade-controller v0.20.1's own
    /// `plan.DigestStatus` (wrangler v3.7.0-rc.1, k8s.io/kubectl v0.36.0,
    /// go1.26) for the same three Plans and Secrets: the Go program is
    /// e2e/suc-hash/main.go and e2e/suc-hash/README.md says how it was run
    /// against the module from the Go module proxy.
    #[test]
    fn upstream_hashes() {
        // Seed 003's Plan (the SUC README's k3os-latest): version only.
        let seed003 = serde_json::json!({
            "metadata": {"name": "k3os-latest", "namespace": "k3os-system"},
            "spec": {"concurrency": 1, "channel": "https://github.com/rancher/k3os/releases/latest",
                     "version": "v0.9.0-dev", "drain": {"force": true},
                     "upgrade": {"image": "rancher/k3os", "command": ["k3os", "--debug"]}}
        });
        let digest = serde_json::json!({
            "metadata": {"name": "k3s-server", "namespace": "system-upgrade", "labels": {"tier": "gold"},
                "annotations": {DIGEST_ANNOTATION: "spec.upgrade.image,spec.upgrade.envs,spec.concurrency,spec.cordon,metadata.labels.tier,spec.missing"}},
            "spec": {"concurrency": 2, "cordon": false, "serviceAccountName": "system-upgrade", "version": "v1.33.1+k3s1",
                "secrets": [{"name": "env", "path": "/host/env"}, {"name": "skipped", "path": "skip", "ignoreUpdates": true}],
                "upgrade": {"image": "rancher/k3s-upgrade", "envs": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}}
        });
        let env = secret(
            "env",
            Some("Opaque"),
            None,
            &[("TOKEN", b"s3cret"), ("FOO", b"bar")],
        );
        let tls = secret(
            "tls",
            Some("kubernetes.io/tls"),
            Some(true),
            &[("tls.crt", b"CERT"), ("tls.key", &[0, 1, 254, 255])],
        );
        let empty = secret("empty", None, None, &[]);
        let plain = serde_json::json!({"metadata": {"name": "p"}, "spec": {"version": "v1", "upgrade": {"image": "busybox"}}});
        let table = [
            (
                "seed 003",
                plan_hash("v0.9.0-dev", "", &seed003, &[]),
                "867d9ef93211def3a0eb54ef368e8d3d130444f08a835c02a06a9358",
            ),
            (
                "secret and digest annotation",
                plan_hash("v1.33.1-k3s1", "system-upgrade", &digest, &[secret_hash(&env)]),
                "aed082906b7f9b685743f1b1fd409de8abedfcfaf7f8cfa29b91a31d",
            ),
            (
                "typed immutable Secret and one without data",
                plan_hash("v1", "", &plain, &[secret_hash(&tls), secret_hash(&empty)]),
                "77f3e9ba353eb59436fea3ad41785bb52cfc64b35ec54946820e0365",
            ),
        ];
        for (what, got, want) in table {
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn what_changes_the_hash() {
        let plan = |image: &str, annotation: Option<&str>| {
            let mut p =
                serde_json::json!({"metadata": {"annotations": {}}, "spec": {"upgrade": {"image": image}}});
            if let Some(a) = annotation {
                p["metadata"]["annotations"][DIGEST_ANNOTATION] = a.into();
            }
            p
        };
        let base = plan_hash("v1", "", &plan("a", None), &[]);
        let table = [
            (
                "another version",
                plan_hash("v2", "", &plan("a", None), &[]),
                true,
            ),
            (
                "another service account",
                plan_hash("v1", "sa", &plan("a", None), &[]),
                true,
            ),
            (
                "another image alone: upstream does not re-run",
                plan_hash("v1", "", &plan("b", None), &[]),
                false,
            ),
            (
                "another secret",
                plan_hash("v1", "", &plan("a", None), &["x".into()]),
                true,
            ),
            (
                "image named by the digest annotation",
                plan_hash("v1", "", &plan("b", Some("spec.upgrade.image")), &[]),
                true,
            ),
            (
                "a path that is not there adds nothing",
                plan_hash("v1", "", &plan("a", Some("spec.nothing")), &[]),
                false,
            ),
        ];
        for (what, hash, differs) in table {
            assert_eq!(hash != base, differs, "{what}");
        }
    }

    #[test]
    fn go_rendering() {
        let v = serde_json::json!({"b": [1, "x"], "a": {"k": null}, "c": true});
        assert_eq!(go_sprint(&v), "map[a:map[k:<nil>] b:[1 x] c:true]");
        assert_eq!(go_to_string(Some(&serde_json::json!([" y ", "z"]))), "y");
        assert_eq!(go_to_string(Some(&serde_json::json!([]))), "");
        assert_eq!(go_to_string(None), "");
    }

    #[test]
    fn ignored_secrets_are_not_hashed() {
        let mut s = PlanSpec::default();
        s.secrets.push(crate::api::plan::SecretSpec {
            name: "creds".into(),
            path: "/creds".into(),
            ..Default::default()
        });
        assert_eq!(hashed_secrets(&s), vec!["creds"]);
        s.secrets[0].ignore_updates = Some(true);
        assert!(hashed_secrets(&s).is_empty());
    }
}
