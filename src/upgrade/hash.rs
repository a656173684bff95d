//! A Plan's hash: what a node is labelled with once upgraded. It changes, and
//! the plan runs again on every node, when the version, the containers, the
//! service account or a referenced Secret's contents change (a Secret with
//! ignoreUpdates is left out).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use sha2::{Digest, Sha224};

use crate::api::plan::PlanSpec;

/// SHA-224 (hex, 56 characters) over `version`, the spec fields that decide
/// what runs on a node, and `secrets`: name → data of every Secret the plan
/// references without ignoreUpdates, in name order.
pub fn plan_hash(
    version: &str,
    spec: &PlanSpec,
    secrets: &BTreeMap<String, BTreeMap<String, ByteString>>,
) -> String {
    let mut h = Sha224::new();
    let mut field = |name: &str, value: &[u8]| {
        // Length-prefixed, so no two field sequences hash alike.
        h.update(name.as_bytes());
        h.update((value.len() as u64).to_be_bytes());
        h.update(value);
    };
    field("version", version.as_bytes());
    field(
        "serviceAccountName",
        spec.service_account_name.as_deref().unwrap_or("").as_bytes(),
    );
    field("upgrade", json(&spec.upgrade).as_bytes());
    field("prepare", json(&spec.prepare).as_bytes());
    let mounted: Vec<(&str, &str)> = spec
        .secrets
        .iter()
        .map(|s| (s.name.as_str(), s.path.as_str()))
        .collect();
    field("secrets", json(&mounted).as_bytes());
    for (name, data) in secrets {
        field("secret", name.as_bytes());
        for (key, value) in data {
            field(key, &value.0);
        }
    }
    super::hex(&h.finalize())
}

/// The Secrets whose contents belong in the hash.
pub fn hashed_secrets(spec: &PlanSpec) -> Vec<&str> {
    spec.secrets
        .iter()
        .filter(|s| !s.ignore_updates.unwrap_or(false))
        .map(|s| s.name.as_str())
        .collect()
}

/// `value` as JSON for hashing (fields in declaration order). Serializing
/// spec values cannot fail: their types are plain data.
fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::plan::{ContainerSpec, SecretSpec};

    fn spec() -> PlanSpec {
        PlanSpec {
            upgrade: ContainerSpec {
                image: "rancher/k3s-upgrade".into(),
                ..Default::default()
            },
            secrets: vec![SecretSpec {
                name: "creds".into(),
                path: "/creds".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn data(v: &str) -> BTreeMap<String, BTreeMap<String, ByteString>> {
        BTreeMap::from([(
            "creds".to_string(),
            BTreeMap::from([("token".to_string(), ByteString(v.as_bytes().to_vec()))]),
        )])
    }

    #[test]
    fn what_changes_the_hash() {
        let base = plan_hash("v1", &spec(), &data("a"));
        assert_eq!(base.len(), 56);
        assert_eq!(base, plan_hash("v1", &spec(), &data("a")), "stable");
        let mut args = spec();
        args.upgrade.args = vec!["--reboot".into()];
        let mut account = spec();
        account.service_account_name = Some("upgrader".into());
        let mut cordon = spec();
        cordon.cordon = Some(true);
        let table = [
            ("another version", plan_hash("v2", &spec(), &data("a")), true),
            ("another secret value", plan_hash("v1", &spec(), &data("b")), true),
            ("other upgrade args", plan_hash("v1", &args, &data("a")), true),
            (
                "another service account",
                plan_hash("v1", &account, &data("a")),
                true,
            ),
            (
                "cordon changes how, not what",
                plan_hash("v1", &cordon, &data("a")),
                false,
            ),
        ];
        for (what, hash, differs) in table {
            assert_eq!(hash != base, differs, "{what}");
        }
    }

    #[test]
    fn ignored_secrets_are_not_hashed() {
        let mut s = spec();
        assert_eq!(hashed_secrets(&s), vec!["creds"]);
        s.secrets[0].ignore_updates = Some(true);
        assert!(hashed_secrets(&s).is_empty());
    }
}
