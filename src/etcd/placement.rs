//! Where etcd's members run: on the control-plane nodes (stacked, as kubeadm
//! and Constellation make them, seen by their static pods) or elsewhere.
//! The webhook's quorum rule and the rollout's member removal both ask.

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;

/// Where etcd's members run, which decides where the quorum rule applies
/// (the operator's `--etcd-on-control-plane`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EtcdPlacement {
    /// Where a static etcd pod runs (`auto`): kubeadm's and RKE2's
    /// `kube-system/etcd-<node>`, label `component=etcd`.
    #[default]
    Detect,
    /// On every control-plane node (`true`): etcd without a pod of its own,
    /// such as k3s's embedded one.
    ControlPlane,
    /// Off the nodes (`false`): external etcd, managed control planes.
    External,
}

impl FromStr for EtcdPlacement {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(EtcdPlacement::Detect),
            "true" => Ok(EtcdPlacement::ControlPlane),
            "false" => Ok(EtcdPlacement::External),
            other => Err(format!("{other:?}: expected auto, true or false")),
        }
    }
}

/// The namespace and label of static etcd pods (kubeadm's, RKE2's).
pub const ETCD_POD_NAMESPACE: &str = "kube-system";
/// The label selector of static etcd pods.
pub const ETCD_POD_SELECTOR: &str = "component=etcd";

/// A static etcd pod as the webhook reads it.
#[derive(Clone, Debug, PartialEq)]
pub struct EtcdPod {
    /// The pod's name (`etcd-<node>` as kubeadm names it).
    pub name: String,
    /// spec.nodeName.
    pub node: Option<String>,
}

/// The control-plane nodes that run an etcd member, each with how that is
/// known (the message of a refusal names it).
pub fn etcd_members(
    placement: EtcdPlacement,
    control_plane: &BTreeSet<String>,
    pods: &[EtcdPod],
) -> BTreeMap<String, String> {
    match placement {
        EtcdPlacement::External => BTreeMap::new(),
        EtcdPlacement::ControlPlane => control_plane
            .iter()
            .map(|n| (n.clone(), "--etcd-on-control-plane=true".to_string()))
            .collect(),
        EtcdPlacement::Detect => control_plane
            .iter()
            .filter_map(|n| {
                let on_node = |p: &&EtcdPod| match &p.node {
                    Some(bound) => bound == n,
                    None => p.name == format!("etcd-{n}"),
                };
                let pod = pods.iter().find(on_node)?;
                Some((n.clone(), format!("static pod {ETCD_POD_NAMESPACE}/{}", pod.name)))
            })
            .collect(),
    }
}

/// The static etcd pods where they decide which nodes run a member (under
/// `Detect`); none, and no read, under the other placements.
pub async fn static_etcd_pods_for(
    client: &kube::Client,
    placement: EtcdPlacement,
) -> Result<Vec<EtcdPod>, kube::Error> {
    if placement != EtcdPlacement::Detect {
        return Ok(Vec::new());
    }
    static_etcd_pods(client).await
}

/// The static etcd pods (one LIST of kube-system by label: a few pods).
async fn static_etcd_pods(client: &kube::Client) -> Result<Vec<EtcdPod>, kube::Error> {
    use kube::ResourceExt;
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(client.clone(), ETCD_POD_NAMESPACE);
    let list = pods
        .list(&kube::api::ListParams::default().labels(ETCD_POD_SELECTOR))
        .await?;
    Ok(list
        .items
        .iter()
        .map(|p| EtcdPod {
            name: p.name_any(),
            node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_members_are_where_etcd_runs() {
        let control_plane: BTreeSet<String> = ["c1", "c2", "c3"].iter().map(|s| s.to_string()).collect();
        let pod = |name: &str, node: Option<&str>| EtcdPod {
            name: name.into(),
            node: node.map(Into::into),
        };
        let pods = [
            pod("etcd-c1", Some("c1")),
            // Named for c2 but bound elsewhere: the binding counts.
            pod("etcd-c2", Some("w1")),
            // Not bound yet: the name tells.
            pod("etcd-c3", None),
        ];
        // (placement, pods, members with how they are known)
        type Case<'a> = (EtcdPlacement, &'a [EtcdPod], &'a [(&'a str, &'a str)]);
        let cases: [Case; 5] = [
            (
                EtcdPlacement::Detect,
                &pods,
                &[
                    ("c1", "static pod kube-system/etcd-c1"),
                    ("c3", "static pod kube-system/etcd-c3"),
                ],
            ),
            (EtcdPlacement::Detect, &[], &[]),
            (
                EtcdPlacement::ControlPlane,
                &[],
                &[
                    ("c1", "--etcd-on-control-plane=true"),
                    ("c2", "--etcd-on-control-plane=true"),
                    ("c3", "--etcd-on-control-plane=true"),
                ],
            ),
            (EtcdPlacement::External, &pods, &[]),
            (EtcdPlacement::External, &[], &[]),
        ];
        for (placement, pods, want) in cases {
            let want: BTreeMap<String, String> =
                want.iter().map(|(n, w)| (n.to_string(), w.to_string())).collect();
            assert_eq!(
                etcd_members(placement, &control_plane, pods),
                want,
                "{placement:?}"
            );
        }
        for (flag, want) in [
            ("auto", Ok(EtcdPlacement::Detect)),
            ("true", Ok(EtcdPlacement::ControlPlane)),
            ("false", Ok(EtcdPlacement::External)),
        ] {
            assert_eq!(flag.parse::<EtcdPlacement>(), want);
        }
        assert!("yes".parse::<EtcdPlacement>().is_err());
    }
}
