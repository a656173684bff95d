//! Waiting until rendered RBAC is in effect. kube-apiserver's RBAC
//! authorizer reads Roles and bindings through informers: a binding just
//! created can still be unknown to it for a moment, longer on a loaded
//! machine, and a process started at once with the bound ServiceAccount's
//! token is refused its first calls. A SubjectAccessReview asks that same
//! authorizer, so once it allows every rule, so does the API server.

use std::time::Duration;

use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::Value;

use crate::{Probe, seen, wait_for};

/// One question for the authorizer: may `user` do what a rule grants.
#[derive(Clone, Debug, PartialEq)]
pub struct Grant {
    pub user: String,
    pub namespace: Option<String>,
    pub group: String,
    pub resource: String,
    pub verb: String,
    pub name: Option<String>,
}

/// Every grant the RoleBindings and ClusterRoleBindings among `docs` give
/// their ServiceAccounts, one per rule of the role they bind (its first
/// group, resource, verb and name); roles not among `docs` are left out.
pub fn grants(docs: &[Value]) -> Vec<Grant> {
    let mut out = Vec::new();
    for binding in docs {
        let namespace = match binding["kind"].as_str() {
            Some("RoleBinding") => binding["metadata"]["namespace"].as_str().map(String::from),
            Some("ClusterRoleBinding") => None,
            _ => continue,
        };
        let role_ref = &binding["roleRef"];
        // A Role is the one in the binding's namespace; a ClusterRole has none.
        let Some(role) = docs.iter().find(|d| {
            d["kind"] == role_ref["kind"]
                && d["metadata"]["name"] == role_ref["name"]
                && (role_ref["kind"] == "ClusterRole"
                    || d["metadata"]["namespace"] == binding["metadata"]["namespace"])
        }) else {
            continue;
        };
        for subject in binding["subjects"].as_array().into_iter().flatten() {
            if subject["kind"] != "ServiceAccount" {
                continue;
            }
            let sa_namespace = subject["namespace"]
                .as_str()
                .or(namespace.as_deref())
                .unwrap_or_default();
            let user = format!(
                "system:serviceaccount:{sa_namespace}:{}",
                subject["name"].as_str().unwrap_or_default()
            );
            for rule in role["rules"].as_array().into_iter().flatten() {
                let first = |key: &str| rule[key][0].as_str().map(String::from);
                let (Some(resource), Some(verb)) = (first("resources"), first("verbs")) else {
                    continue; // a non-resource rule
                };
                out.push(Grant {
                    user: user.clone(),
                    namespace: namespace.clone(),
                    group: first("apiGroups").unwrap_or_default(),
                    resource,
                    verb,
                    name: first("resourceNames"),
                });
            }
        }
    }
    out
}

/// Waits until the API server's authorizer allows every grant of `docs`'
/// bindings (see [`grants`]).
pub async fn wait_until_in_effect(client: &Client, docs: &[Value]) {
    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    for grant in grants(docs) {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(grant.user.clone()),
                resource_attributes: Some(ResourceAttributes {
                    namespace: grant.namespace.clone(),
                    group: Some(grant.group.clone()),
                    resource: Some(grant.resource.clone()),
                    verb: Some(grant.verb.clone()),
                    name: grant.name.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        wait_for(
            &format!("RBAC in effect: {grant:?}"),
            Duration::from_secs(30),
            || async {
                match reviews.create(&PostParams::default(), &review).await {
                    Ok(r) if r.status.as_ref().is_some_and(|s| s.allowed) => Probe::Done(()),
                    Ok(r) => Probe::NotYet(format!("{:?}", r.status)),
                    Err(e) => Probe::NotYet(seen(e)),
                }
            },
        )
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_rule_of_a_bound_role_is_one_grant_to_each_service_account() {
        let docs = [
            json!({"kind": "ClusterRole", "metadata": {"name": "c"}, "rules": [
                {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]},
                {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["validatingwebhookconfigurations"],
                 "verbs": ["patch"], "resourceNames": ["hook"]},
                {"nonResourceURLs": ["/metrics"], "verbs": ["get"]},
            ]}),
            json!({"kind": "ClusterRoleBinding", "metadata": {"name": "c"},
                   "roleRef": {"kind": "ClusterRole", "name": "c"},
                   "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "ns"},
                                {"kind": "User", "name": "someone"}]}),
            json!({"kind": "Role", "metadata": {"name": "r", "namespace": "ns"}, "rules": [
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
            ]}),
            json!({"kind": "RoleBinding", "metadata": {"name": "r", "namespace": "ns"},
                   "roleRef": {"kind": "Role", "name": "r"},
                   "subjects": [{"kind": "ServiceAccount", "name": "sa"}]}),
            json!({"kind": "RoleBinding", "metadata": {"name": "v", "namespace": "ns"},
                   "roleRef": {"kind": "ClusterRole", "name": "view"},
                   "subjects": [{"kind": "ServiceAccount", "name": "sa"}]}),
            json!({"kind": "RoleBinding", "metadata": {"name": "r", "namespace": "other"},
                   "roleRef": {"kind": "Role", "name": "r"},
                   "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "ns"}]}),
        ];
        let grant =
            |namespace: Option<&str>, group: &str, resource: &str, verb: &str, name: Option<&str>| Grant {
                user: "system:serviceaccount:ns:sa".into(),
                namespace: namespace.map(String::from),
                group: group.into(),
                resource: resource.into(),
                verb: verb.into(),
                name: name.map(String::from),
            };
        assert_eq!(
            grants(&docs),
            [
                grant(None, "", "nodes", "get", None),
                grant(
                    None,
                    "admissionregistration.k8s.io",
                    "validatingwebhookconfigurations",
                    "patch",
                    Some("hook")
                ),
                grant(Some("ns"), "coordination.k8s.io", "leases", "create", None),
            ]
        );
    }
}
