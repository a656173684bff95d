//! What a reconcile reads: the hosts (from the shared cache), each host's
//! networkData and BMC Secrets, the jump hosts' key Secrets and the load
//! balancers' template ConfigMaps (from the API server).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::ResourceExt;
use kube::api::Api;

use super::{SipReconciler, claimed_by, host_id, is_free};
use crate::api::metal3::BareMetalHost;
use crate::api::sip::{ROLES, SIPCluster, labels};
use crate::drain::pods::selector_matches;
use crate::runtime::store::{Key, ObjectKey};
use crate::sip::hosts;
use crate::sip::schedule::{Candidate, HostState, Member, RoleView, RoleWants};
use crate::sip::services;
use crate::sip::template::Template;

/// What the services need of a host: its addresses and its BMC.
#[derive(Clone, Debug, Default)]
pub(super) struct HostDetails {
    /// Network id → address.
    pub(super) addresses: BTreeMap<String, String>,
    /// BMC management address, user, password.
    pub(super) bmc: Option<(String, String, String)>,
    /// Why a record could not be read.
    pub(super) problems: Vec<String>,
}

/// The load balancers' templates (None: nodewarden's configuration).
pub(super) struct Templates {
    pub(super) control_plane: Option<std::result::Result<Template, String>>,
    pub(super) worker: Option<std::result::Result<Template, String>>,
}

/// What the services are built from besides the hosts.
pub(super) struct ServiceInputs {
    /// Per jump host, the names in its key Secret or why there are none.
    pub(super) keys: Vec<std::result::Result<Vec<String>, String>>,
    /// The load balancers' templates.
    pub(super) templates: Templates,
}

impl SipReconciler {
    /// Whether the cluster holds hosts upstream SIP claimed (they carry no
    /// state label): such a cluster had its hosts, whatever its status
    /// lists, and keeps them.
    pub(super) fn holds_hosts_from_upstream(&self, key: &Key<SIPCluster>) -> bool {
        self.ctx
            .hosts
            .list()
            .iter()
            .any(|h| claimed_by(h).as_ref() == Some(key) && h.labels().get(labels::STATE).is_none())
    }

    /// Each role's wants, hosts and free candidates, from the cache.
    pub(super) fn role_views(&self, sip: &SIPCluster) -> Vec<RoleView> {
        let ns = sip.namespace().unwrap_or_default();
        let name = sip.name_any();
        let hosts = self.ctx.hosts.list();
        let mine = |h: &BareMetalHost| {
            h.labels().get(labels::CLUSTER_NAMESPACE) == Some(&ns)
                && h.labels().get(labels::CLUSTER_NAME) == Some(&name)
        };
        ROLES
            .iter()
            .map(|role| {
                let set = sip.spec.nodes.get(*role);
                let key = set.and_then(|s| s.topology_key.clone());
                let count = set.and_then(|s| s.count).unwrap_or_default();
                let selected = |h: &BareMetalHost| {
                    let empty = BTreeMap::new();
                    let l = h.metadata.labels.as_ref().unwrap_or(&empty);
                    set.is_some_and(|s| {
                        s.label_selector
                            .as_ref()
                            .is_none_or(|sel| selector_matches(sel, l))
                    })
                };
                let topology = |h: &BareMetalHost| key.as_ref().and_then(|k| h.labels().get(k).cloned());
                let members = hosts
                    .iter()
                    .filter(|h| {
                        mine(h) && h.labels().get(labels::NODE_TYPE).map(String::as_str) == Some(*role)
                    })
                    .map(|h| Member {
                        name: host_id(h),
                        state: HostState::from_label(h.labels().get(labels::STATE).map(String::as_str)),
                        topology: topology(h),
                        unusable: h
                            .unusable()
                            .or_else(|| (!selected(h)).then(|| format!("no longer selected for {role}"))),
                    })
                    .collect();
                let free = hosts
                    .iter()
                    .filter(|h| is_free(h) && h.unusable().is_none() && selected(h))
                    .map(|h| Candidate {
                        name: host_id(h),
                        topology: topology(h),
                    })
                    .collect();
                RoleView {
                    wants: RoleWants {
                        role: role.to_string(),
                        active: usize::try_from(count.active).unwrap_or(0),
                        standby: usize::try_from(count.standby).unwrap_or(0),
                        topology_key: key,
                    },
                    members,
                    free,
                }
            })
            .collect()
    }

    /// Each host's value of its role's topologyKey.
    pub(super) fn topologies(
        &self,
        sip: &SIPCluster,
        members: &[(String, String, HostState)],
    ) -> BTreeMap<String, String> {
        members
            .iter()
            .filter_map(|(id, role, _)| {
                let key = sip.spec.nodes.get(role)?.topology_key.as_ref()?;
                let value = self.host(id)?.labels().get(key)?.clone();
                Some((id.clone(), value))
            })
            .collect()
    }

    /// The cached host of a host id.
    pub(super) fn host(&self, id: &str) -> Option<Arc<BareMetalHost>> {
        let (ns, name) = id.split_once('/')?;
        self.ctx.hosts.get(&ObjectKey::new(Some(ns), name))
    }

    /// Addresses from each host's networkData Secret; BMC address and
    /// credentials from its BMC Secret.
    pub(super) async fn host_details(
        &self,
        members: &[(String, String, HostState)],
    ) -> BTreeMap<String, HostDetails> {
        let mut out = BTreeMap::new();
        for (id, _, _) in members {
            let Some(host) = self.host(id) else {
                continue;
            };
            out.insert(id.clone(), self.details_of(&host).await);
        }
        out
    }

    async fn details_of(&self, host: &BareMetalHost) -> HostDetails {
        let host_ns = host.namespace().unwrap_or_default();
        let mut d = HostDetails::default();
        if let Some(nd) = &host.spec.network_data {
            let ns = nd.namespace.clone().unwrap_or_else(|| host_ns.clone());
            match self.secret(&ns, &nd.name).await {
                Ok(s) => match secret_value(&s, "networkData").map(|v| hosts::addresses(&v)) {
                    Some(Ok(a)) => d.addresses = a,
                    Some(Err(e)) => d.problems.push(format!("{}: {e}", host.name_any())),
                    None => d.problems.push(format!(
                        "{}: Secret {ns}/{} has no networkData",
                        host.name_any(),
                        nd.name
                    )),
                },
                Err(e) => d.problems.push(format!("{}: networkData {e}", host.name_any())),
            }
        }
        if let Some(bmc) = &host.spec.bmc {
            let ip = hosts::management_address(&bmc.address).unwrap_or_default();
            match self.secret(&host_ns, &bmc.credentials_name).await {
                Ok(s) => {
                    let get = |k| {
                        secret_value(&s, k)
                            .map(|v| String::from_utf8_lossy(&v).into_owned())
                            .unwrap_or_default()
                    };
                    d.bmc = Some((ip, get("username"), get("password")));
                }
                Err(e) => d
                    .problems
                    .push(format!("{}: BMC credentials {e}", host.name_any())),
            }
        }
        d
    }

    async fn secret(&self, ns: &str, name: &str) -> std::result::Result<Secret, String> {
        let api: Api<Secret> = Api::namespaced(self.ctx.client.clone(), ns);
        match api.get_opt(name).await {
            Ok(Some(s)) => Ok(s),
            Ok(None) => Err(format!("Secret {ns}/{name} not found")),
            Err(e) => Err(format!("Secret {ns}/{name}: {e}")),
        }
    }

    /// The jump hosts' key names (or why a jump host has none: the field
    /// and what is wrong) and the load balancers' templates.
    pub(super) async fn service_inputs(&self, sip: &SIPCluster) -> ServiceInputs {
        let ns = sip.namespace().unwrap_or_default();
        let mut keys = Vec::new();
        for (i, jh) in sip.spec.services.jump_host.iter().enumerate() {
            keys.push(match self.secret(&ns, &jh.node_ssh_private_keys).await {
                Ok(secret) => Ok(secret.data.unwrap_or_default().into_keys().collect()),
                Err(e) => Err(format!("spec.services.jumpHost[{i}].nodeSSHPrivateKeys: {e}")),
            });
        }
        let templates = Templates {
            control_plane: self.template(&ns, services::CONTROL_PLANE_TEMPLATE).await,
            worker: self.template(&ns, services::WORKER_TEMPLATE).await,
        };
        ServiceInputs { keys, templates }
    }

    /// A load balancer's template from upstream's ConfigMap (None: there is
    /// none, nodewarden's configuration serves), or why it cannot be used.
    async fn template(
        &self,
        ns: &str,
        (name, key): (&str, &str),
    ) -> Option<std::result::Result<Template, String>> {
        let api: Api<ConfigMap> = Api::namespaced(self.ctx.client.clone(), ns);
        let found = api.get_opt(name).await;
        parse_template(ns, name, key, found.map_err(|e| e.to_string()))
    }
}

/// A template from a ConfigMap as read (None: not there), or why it cannot
/// be used, naming the ConfigMap. There is no fallback to nodewarden's own
/// configuration once a ConfigMap is there: the user asked for theirs.
fn parse_template(
    ns: &str,
    name: &str,
    key: &str,
    found: std::result::Result<Option<ConfigMap>, String>,
) -> Option<std::result::Result<Template, String>> {
    let cm = match found {
        Ok(None) => return None,
        Ok(Some(cm)) => cm,
        Err(e) => return Some(Err(format!("ConfigMap {ns}/{name}: {e}"))),
    };
    let Some(source) = cm.data.as_ref().and_then(|d| d.get(key)) else {
        return Some(Err(format!("ConfigMap {ns}/{name} has no key {key}")));
    };
    Some(Template::parse(source).map_err(|e| format!("ConfigMap {ns}/{name} key {key}: {e}")))
}

fn secret_value(secret: &Secret, key: &str) -> Option<Vec<u8>> {
    if let Some(v) = secret.data.as_ref().and_then(|d| d.get(key)) {
        return Some(v.0.clone());
    }
    secret
        .string_data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|v| v.clone().into_bytes())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// (the ConfigMap as read, the template used or what is said).
    #[test]
    fn a_template_configmap_is_used_or_named_never_passed_over() {
        let cm = |data: serde_json::Value| -> Option<ConfigMap> {
            Some(
                serde_json::from_value(json!({"metadata": {"name": "loadbalancerworker"}, "data": data}))
                    .expect("a cm"),
            )
        };
        let key = "loadBalancerWorker.cfg";
        type Read = std::result::Result<Option<ConfigMap>, String>;
        type Case<'a> = (&'a str, Read, Option<std::result::Result<(), &'a str>>);
        let cases: [Case; 5] = [
            ("none there: nodewarden's own", Ok(None), None),
            ("a template", Ok(cm(json!({key: "bind *:{{ 1 }}"}))), Some(Ok(()))),
            (
                "without the key",
                Ok(cm(json!({"other": "x"}))),
                Some(Err(
                    "ConfigMap sip/loadbalancerworker has no key loadBalancerWorker.cfg",
                )),
            ),
            (
                "an unsupported construct",
                Ok(cm(json!({key: "x\n{{ len .Servers }}"}))),
                Some(Err(
                    "ConfigMap sip/loadbalancerworker key loadBalancerWorker.cfg: line 2: the function `len`",
                )),
            ),
            (
                "not readable",
                Err("403 Forbidden".into()),
                Some(Err("ConfigMap sip/loadbalancerworker: 403 Forbidden")),
            ),
        ];
        for (what, found, want) in cases {
            let got = parse_template("sip", "loadbalancerworker", key, found);
            match (got, want) {
                (None, None) | (Some(Ok(_)), Some(Ok(()))) => {}
                (Some(Err(e)), Some(Err(w))) => assert!(e.starts_with(w), "{what}: {e}"),
                (got, _) => panic!("{what}: {got:?}"),
            }
        }
    }
}
