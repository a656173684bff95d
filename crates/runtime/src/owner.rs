//! Which object of a kind controls another: the owner-reference mapping
//! behind [`super::manager::ControllerBuilder::owns`] (controller-runtime's
//! `handler.EnqueueRequestForOwner` with `OnlyControllerOwner`).

use std::any::TypeId;

use k8s_openapi::ClusterResourceScope;
use kube::api::ObjectMeta;

use super::controller::Object;
use super::store::ObjectKey;

/// A kind as owner references name it: its API group and kind, and whether
/// its objects live in a namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnerKind {
    /// The API group (`""` for the core group).
    pub group: String,
    /// The kind.
    pub kind: String,
    /// Namespaced (an owner is in the namespace of what it owns); false
    /// for a cluster-scoped kind.
    pub namespaced: bool,
}

impl OwnerKind {
    /// The kind `K`.
    pub fn of<K: Object>() -> Self
    where
        K::Scope: 'static,
    {
        OwnerKind {
            group: K::group(&()).into_owned(),
            kind: K::kind(&()).into_owned(),
            namespaced: TypeId::of::<K::Scope>() != TypeId::of::<ClusterResourceScope>(),
        }
    }

    /// The key of the object that controls `meta`'s, when it is of this
    /// kind: the owner's name, in `meta`'s namespace unless the kind is
    /// cluster-scoped (owner references name no namespace: a namespaced
    /// owner is always in its dependent's). Only the controller reference
    /// counts (the API server allows one): a plain owner reference (kept
    /// for garbage collection) makes no controller of this kind act. The
    /// version is not compared: every version of a group's kind is the same
    /// object.
    pub fn controller_of(&self, meta: &ObjectMeta) -> Option<ObjectKey> {
        let owner = meta.owner_references.iter().flatten().find(|r| {
            let group = r.api_version.rsplit_once('/').map_or("", |(group, _)| group);
            r.controller == Some(true) && r.kind == self.kind && group == self.group
        })?;
        let namespace = meta.namespace.as_deref().filter(|_| self.namespaced);
        Some(ObjectKey::new(namespace, &owner.name))
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Node;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use super::*;

    #[test]
    fn a_kind_is_named_by_group_and_scope() {
        let deployment = OwnerKind::of::<Deployment>();
        assert_eq!(
            (
                deployment.group.as_str(),
                deployment.kind.as_str(),
                deployment.namespaced
            ),
            ("apps", "Deployment", true)
        );
        let node = OwnerKind::of::<Node>();
        assert_eq!(
            (node.group.as_str(), node.kind.as_str(), node.namespaced),
            ("", "Node", false)
        );
    }

    fn reference(api_version: &str, kind: &str, name: &str, controller: Option<bool>) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            controller,
            block_owner_deletion: None,
        }
    }

    /// (what, the owner kind, the dependent's owner references, the key
    /// reconciled).
    #[test]
    fn only_the_controller_of_the_kind_is_reconciled() {
        let deployment = OwnerKind::of::<Deployment>();
        let node = OwnerKind::of::<Node>();
        let web = |controller| reference("apps/v1", "Deployment", "web", controller);
        type Case<'a> = (&'a str, &'a OwnerKind, Vec<OwnerReference>, Option<ObjectKey>);
        let cases: [Case; 9] = [
            (
                "its controller",
                &deployment,
                vec![web(Some(true))],
                Some(ObjectKey::new(Some("ns"), "web")),
            ),
            ("an owner, not its controller", &deployment, vec![web(None)], None),
            ("controller: false", &deployment, vec![web(Some(false))], None),
            (
                "another kind of the group",
                &deployment,
                vec![reference("apps/v1", "StatefulSet", "db", Some(true))],
                None,
            ),
            (
                "the kind of another group",
                &deployment,
                vec![reference("example.com/v1", "Deployment", "web", Some(true))],
                None,
            ),
            (
                "the core group is not a named one",
                &deployment,
                vec![reference("v1", "Deployment", "web", Some(true))],
                None,
            ),
            ("no owner", &deployment, vec![], None),
            (
                "the controller after a plain owner",
                &deployment,
                vec![reference("apps/v1", "Deployment", "old", None), web(Some(true))],
                Some(ObjectKey::new(Some("ns"), "web")),
            ),
            (
                "a cluster-scoped controller has no namespace",
                &node,
                vec![reference("v1", "Node", "n1", Some(true))],
                Some(ObjectKey::cluster("n1")),
            ),
        ];
        for (what, kind, owners, want) in cases {
            let meta = ObjectMeta {
                name: Some("dependent".into()),
                namespace: Some("ns".into()),
                owner_references: Some(owners),
                ..ObjectMeta::default()
            };
            assert_eq!(kind.controller_of(&meta), want, "{what}");
        }
    }
}
