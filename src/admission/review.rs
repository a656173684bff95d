//! The AdmissionReview as the webhook reads it: only what the rules look at
//! (the kind, the operation, the name and the spec fields they check). The
//! rest (metadata, userInfo, options, every other field of both objects) is
//! skipped as it is parsed, never kept: a review may carry two objects of
//! up to 3 MiB, and kept as JSON values a few MiB of small arrays take
//! several hundred MiB.

use kube::core::admission::{AdmissionResponse, AdmissionReview, Operation};
use kube::core::{DynamicObject, GroupVersionKind, Status, TypeMeta};
use serde::Deserialize;

/// One AdmissionReview request, as far as the webhook reads it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Review {
    /// The review's own apiVersion, echoed in the answer.
    pub api_version: String,
    /// The review's own kind, echoed in the answer.
    pub kind: String,
    /// What is asked.
    pub request: Request,
}

/// The request of a review.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    /// Echoed in the answer.
    pub uid: String,
    /// The kind of the object admitted.
    pub kind: GroupVersionKind,
    /// The object's name (empty when the API server generates it).
    #[serde(default)]
    pub name: String,
    /// CREATE, UPDATE, ...
    pub operation: Operation,
    /// The object as it would be stored.
    #[serde(default)]
    pub object: Option<Reviewed>,
    /// The object as it is stored (UPDATE).
    #[serde(default)]
    pub old_object: Option<Reviewed>,
}

/// An object of a review: its spec's fields the rules read.
#[derive(Debug, Default, Deserialize)]
pub struct Reviewed {
    #[serde(default)]
    metadata: Option<Metadata>,
    #[serde(default)]
    spec: Option<Spec>,
}

#[derive(Debug, Default, Deserialize)]
struct Metadata {
    #[serde(default)]
    labels: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    /// A NodeMaintenance's node.
    node_name: Option<String>,
    /// A ScalingGroup's NodeVersion.
    node_image: Option<String>,
}

impl Reviewed {
    /// `spec.nodeName`, empty when unset.
    pub fn node_name(object: Option<&Reviewed>) -> &str {
        object
            .and_then(|o| o.spec.as_ref())
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or_default()
    }

    /// The value of label `key`, empty when unset.
    pub fn label<'a>(object: Option<&'a Reviewed>, key: &str) -> &'a str {
        object
            .and_then(|o| o.metadata.as_ref())
            .and_then(|m| m.labels.get(key))
            .map(String::as_str)
            .unwrap_or_default()
    }

    /// `spec.nodeImage`, empty when unset.
    pub fn node_image(object: Option<&Reviewed>) -> &str {
        object
            .and_then(|o| o.spec.as_ref())
            .and_then(|s| s.node_image.as_deref())
            .unwrap_or_default()
    }
}

/// Parses a review's body, keeping only what [`Review`] names.
pub fn parse(body: &[u8]) -> Result<Review, serde_json::Error> {
    serde_json::from_slice(body)
}

impl Review {
    /// The answer: allowed, or denied with the message.
    pub fn answer(&self, verdict: Result<(), String>) -> AdmissionReview<DynamicObject> {
        // kube builds an answer from its own AdmissionRequest, which keeps
        // all of a review; `invalid` is the constructor that needs none, and
        // every field it sets is set here.
        let mut response = AdmissionResponse::invalid("");
        response.types = TypeMeta {
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
        };
        response.uid = self.request.uid.clone();
        response.allowed = true;
        response.result = Status::default();
        match verdict {
            Ok(()) => response,
            Err(message) => response.deny(message),
        }
        .into_review()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::admission::AdmissionRequest;
    use serde_json::json;

    /// A review as kube-apiserver sends it for an UPDATE of a NodeMaintenance.
    fn update_review() -> serde_json::Value {
        let object = |node: &str| {
            json!({
                "apiVersion": "nodemaintenance.medik8s.io/v1beta1", "kind": "NodeMaintenance",
                "metadata": {"name": "nm", "uid": "u1", "labels": {"a": "b"},
                    "managedFields": [{"manager": "kubectl", "operation": "Update",
                        "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:nodeName": {}}}}]},
                "spec": {"nodeName": node, "reason": "test"},
                "status": {"phase": "Running"},
            })
        };
        json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "nodemaintenance.medik8s.io", "version": "v1beta1", "kind": "NodeMaintenance"},
                "resource": {"group": "nodemaintenance.medik8s.io", "version": "v1beta1", "resource": "nodemaintenances"},
                "requestKind": {"group": "nodemaintenance.medik8s.io", "version": "v1beta1", "kind": "NodeMaintenance"},
                "requestResource": {"group": "nodemaintenance.medik8s.io", "version": "v1beta1", "resource": "nodemaintenances"},
                "name": "nm",
                "operation": "UPDATE",
                "userInfo": {"username": "admin", "groups": ["system:masters"], "extra": {"k": ["v"]}},
                "object": object("node-b"),
                "oldObject": object("node-a"),
                "dryRun": false,
                "options": {"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"},
            }
        })
    }

    #[test]
    fn reads_what_the_rules_need() {
        let body = serde_json::to_vec(&update_review()).expect("json");
        let review = parse(&body).expect("a review");
        assert_eq!(review.request.kind.kind, "NodeMaintenance");
        assert_eq!(review.request.operation, Operation::Update);
        assert_eq!(review.request.name, "nm");
        assert_eq!(Reviewed::node_name(review.request.object.as_ref()), "node-b");
        assert_eq!(Reviewed::node_name(review.request.old_object.as_ref()), "node-a");
        assert_eq!(Reviewed::node_image(review.request.object.as_ref()), "");
        assert_eq!(Reviewed::label(review.request.object.as_ref(), "a"), "b");
        assert_eq!(Reviewed::label(review.request.object.as_ref(), "c"), "");
    }

    /// The answer is what kube makes from its own full parse of the review.
    #[test]
    fn answers_as_kube_would() {
        let body = serde_json::to_vec(&update_review()).expect("json");
        let review = parse(&body).expect("a review");
        let full: AdmissionReview<DynamicObject> = serde_json::from_slice(&body).expect("kube's parse");
        let request: AdmissionRequest<DynamicObject> = full.try_into().expect("a request");
        for verdict in [Ok(()), Err("updating spec.NodeName isn't allowed".to_string())] {
            let kube = match &verdict {
                Ok(()) => AdmissionResponse::from(&request),
                Err(m) => AdmissionResponse::from(&request).deny(m),
            }
            .into_review();
            let ours = review.answer(verdict);
            assert_eq!(
                serde_json::to_value(&ours).expect("json"),
                serde_json::to_value(&kube).expect("json")
            );
        }
    }

    #[test]
    fn fields_the_rules_do_not_read_are_skipped_whatever_their_shape() {
        let mut review = update_review();
        // Nested deeper than any parser would recurse, and large: skipped
        // without being kept.
        let deep = format!("{}{}", "[".repeat(20_000), "]".repeat(20_000));
        review["request"]["object"]["metadata"]["annotations"] = json!({"x": "y"});
        let mut body = serde_json::to_string(&review).expect("json");
        body = body.replacen(
            "\"dryRun\":false",
            &format!("\"dryRun\":false,\"extra\":{deep}"),
            1,
        );
        let parsed = parse(body.as_bytes()).expect("a review with a deep unknown field");
        assert_eq!(Reviewed::node_name(parsed.request.object.as_ref()), "node-b");
    }

    #[test]
    fn malformed_bodies_say_what_is_wrong() {
        let deep = "[".repeat(20_000);
        for (body, says) in [
            (&b""[..], "EOF"),
            (b"not json", "expected"),
            (
                b"{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\"}",
                "missing field `request`",
            ),
            (deep.as_bytes(), "invalid type"),
        ] {
            let error = parse(body).expect_err("malformed").to_string();
            assert!(error.contains(says), "{error}");
        }
    }
}
