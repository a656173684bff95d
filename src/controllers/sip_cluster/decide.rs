//! The reconcile's decisions, pure: whether the cluster plans as never yet
//! complete, whether a host may be written as the round judged it, each
//! service's objects, and what Ready says.

use std::collections::{BTreeMap, BTreeSet};

use kube::{Resource, ResourceExt};

use super::gather::{HostDetails, ServiceInputs};
use super::{claimed_by, host_id, is_free};
use crate::api::metal3::BareMetalHost;
use crate::api::sip::{ROLES, SIPCluster, ServiceEndpoint};
use crate::error::{Error, Result};
use crate::runtime::store::Key;
use crate::sip::schedule::{ClusterPlan, HostState};
use crate::sip::services::{self, Backend, BmcHost, Owner, ServiceObjects};
use crate::sip::template::{Template, TemplateError};

/// Ready's reason when a service could not be applied.
pub(super) const INFRA_FAILURE: &str = "InfraServiceFailure";
/// Ready's reason when an object already there cannot be taken over.
pub(super) const ADOPTION_BLOCKED: &str = "AdoptionBlocked";
/// Ready's reason when a load balancer's template cannot be rendered.
pub(super) const TEMPLATE_NOT_RENDERED: &str = "TemplateNotRendered";

/// What failed with the services: (Ready's reason, what, naming it).
pub(super) type Failures = Vec<(&'static str, String)>;

/// Whether the cluster has never had its hosts (its status lists none and
/// it holds none upstream SIP claimed), so it gets all of them or none.
pub(super) fn is_initial(sip: &SIPCluster, holds_hosts_from_upstream: bool) -> bool {
    !holds_hosts_from_upstream && sip.status.as_ref().is_none_or(|s| s.hosts.is_empty())
}

/// Whether a plan held back gives hosts back: right only for a cluster that
/// never had them, so it is made again on a fresh read of the SIPCluster.
pub(super) fn gives_hosts_back(plan: &ClusterPlan) -> bool {
    plan.held_back && plan.roles.iter().any(|p| !p.release.is_empty())
}

/// Whether `host`, as read now, still belongs to `owner` (None: free), as
/// the round that decides to write it judged it.
pub(super) fn still_owned_by(host: &BareMetalHost, owner: Option<&Key<SIPCluster>>) -> Result<()> {
    let now = claimed_by(host);
    let free_now = is_free(host);
    let as_judged = match owner {
        None => free_now,
        Some(key) => now.as_ref() == Some(key),
    };
    if as_judged {
        return Ok(());
    }
    let expected = owner.map_or("free".to_string(), |k| format!("claimed by {k}"));
    let found = match now {
        Some(k) => format!("claimed by {k}"),
        None if free_now => "free".to_string(),
        None => "labelled without a cluster namespace".to_string(),
    };
    Err(Error::Changed {
        kind: "BareMetalHost",
        name: host_id(host),
        reason: format!("expected {expected}, found {found}"),
    })
}

/// Every host the plan leaves the cluster with: (name, role, state).
pub(super) fn result_hosts(plan: &ClusterPlan) -> Vec<(String, String, HostState)> {
    plan.roles
        .iter()
        .zip(ROLES)
        .flat_map(|(p, role)| {
            p.result
                .iter()
                .map(move |(n, s)| (n.clone(), role.to_string(), *s))
        })
        .collect()
}

/// The name part of a host id (what services call the host).
fn short_name(id: &str) -> &str {
    id.rsplit_once('/').map_or(id, |(_, n)| n)
}

/// Whether `sip` renders a load balancer with the template ConfigMap
/// `name` of its namespace (upstream's names, `services::*_TEMPLATE`): a
/// change of that ConfigMap changes its services.
pub(super) fn renders_with(sip: &SIPCluster, name: &str) -> bool {
    let s = &sip.spec.services;
    (name == services::CONTROL_PLANE_TEMPLATE.0 && !s.load_balancer_control_plane.is_empty())
        || (name == services::WORKER_TEMPLATE.0 && !s.load_balancer_worker.is_empty())
}

/// Who owns the service objects: the SIPCluster, as their controller.
pub(super) fn owner(sip: &SIPCluster) -> std::result::Result<Owner, Failures> {
    Ok(Owner {
        name: sip.name_any(),
        namespace: sip.namespace().unwrap_or_default(),
        reference: sip
            .controller_owner_ref(&())
            .ok_or_else(|| vec![(INFRA_FAILURE, "the SIPCluster has no uid".to_string())])?,
    })
}

/// The services to apply, what failed, and the names whose objects stay
/// (those applied, and those of a service that failed here, which keeps
/// what it had).
pub(super) struct Built {
    pub(super) wanted: Vec<(&'static str, ServiceObjects)>,
    pub(super) failures: Failures,
    pub(super) kept: BTreeSet<String>,
}

impl Built {
    /// A load balancer's objects, or it is left out (keeping what it had)
    /// and why is told.
    fn load_balancer(
        &mut self,
        kind: &'static str,
        name: String,
        objects: std::result::Result<ServiceObjects, String>,
    ) {
        match objects {
            Ok(o) => self.wanted.push((kind, o)),
            Err(e) => self
                .failures
                .push((TEMPLATE_NOT_RENDERED, format!("{kind} {name}: {e}"))),
        }
        self.kept.insert(name);
    }
}

/// A load balancer built with its template, if any; what fails names the
/// ConfigMap and key.
fn with_template(
    ns: &str,
    template: &Option<std::result::Result<Template, String>>,
    (cm, key): (&str, &str),
    build: impl FnOnce(Option<&Template>) -> std::result::Result<ServiceObjects, TemplateError>,
) -> std::result::Result<ServiceObjects, String> {
    match template {
        None => build(None).map_err(|e| e.to_string()),
        Some(Ok(t)) => build(Some(t)).map_err(|e| format!("ConfigMap {ns}/{cm} key {key}: {e}")),
        Some(Err(e)) => Err(e.clone()),
    }
}

/// Every service's objects: the load balancers' backends are the role's
/// active hosts, the jump host lists every host with its BMC. `inputs`: per
/// jump host, the names in its key Secret or why there are none (that jump
/// host is left out and the reason returned); the load balancers'
/// templates, if any (one that fails leaves its load balancer out, and says
/// why).
pub(super) fn build_services(
    sip: &SIPCluster,
    owner: &Owner,
    members: &[(String, String, HostState)],
    details: &BTreeMap<String, HostDetails>,
    inputs: &ServiceInputs,
) -> Built {
    let address = |id: &str, interface: &Option<String>| {
        interface
            .as_ref()
            .and_then(|i| details.get(id).and_then(|d| d.addresses.get(i).cloned()))
    };
    let backends = |role: &str, interface: &Option<String>| -> Vec<Backend> {
        members
            .iter()
            .filter(|(_, r, s)| r == role && *s == HostState::Active)
            .map(|(n, _, _)| Backend {
                name: short_name(n).to_string(),
                ip: address(n, interface),
            })
            .collect()
    };
    let s = &sip.spec.services;
    let templates = &inputs.templates;
    let mut built = Built {
        wanted: Vec::new(),
        failures: Vec::new(),
        kept: BTreeSet::new(),
    };
    let ns = &owner.namespace;
    for (i, lb) in s.load_balancer_control_plane.iter().enumerate() {
        let b = backends("ControlPlane", &lb.common.node_interface_id);
        let name = services::instance_name("loadbalancer-controlplane", owner, i);
        let t = &templates.control_plane;
        let objects = with_template(ns, t, services::CONTROL_PLANE_TEMPLATE, |t| {
            services::load_balancer_control_plane(owner, i, lb, &b, t)
        });
        built.load_balancer("loadBalancerControlPlane", name, objects);
    }
    for (i, lb) in s.load_balancer_worker.iter().enumerate() {
        let b = backends("Worker", &lb.common.node_interface_id);
        let name = services::instance_name("loadbalancer-worker", owner, i);
        let objects = with_template(ns, &templates.worker, services::WORKER_TEMPLATE, |t| {
            services::load_balancer_worker(owner, i, lb, &b, t)
        });
        built.load_balancer("loadBalancerWorker", name, objects);
    }
    for ((i, jh), keys) in s.jump_host.iter().enumerate().zip(&inputs.keys) {
        // A jump host whose key Secret is missing keeps what it had.
        built.kept.insert(services::instance_name("jumphost", owner, i));
        let keys = match keys {
            Ok(k) => k,
            Err(e) => {
                built.failures.push((INFRA_FAILURE, e.clone()));
                continue;
            }
        };
        let hosts: Vec<BmcHost> = members
            .iter()
            .filter_map(|(n, _, _)| {
                let (bmc_ip, username, password) = details.get(n)?.bmc.clone()?;
                Some(BmcHost {
                    name: short_name(n).to_string(),
                    ip: address(n, &jh.common.node_interface_id),
                    bmc_ip,
                    username,
                    password,
                })
            })
            .collect();
        built
            .wanted
            .push(("jumpHost", services::jump_host(owner, i, jh, &hosts, keys)));
    }
    built
}

/// Ready as the round leaves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Ready {
    pub(super) ok: bool,
    /// Upstream's reason.
    pub(super) reason: &'static str,
    pub(super) message: String,
}

/// Ready, by what matters most: a role that cannot be filled, then the
/// services (a takeover or template problem the user must resolve before a
/// plain infrastructure failure), then the hosts' records.
pub(super) fn readiness(
    plan: &ClusterPlan,
    hosts: usize,
    details: &BTreeMap<String, HostDetails>,
    services: &std::result::Result<Vec<ServiceEndpoint>, Failures>,
) -> Ready {
    let shortfalls: Vec<&str> = plan.roles.iter().filter_map(|p| p.shortfall.as_deref()).collect();
    let problems: Vec<&str> = details
        .values()
        .flat_map(|d| d.problems.iter().map(String::as_str))
        .collect();
    let (ok, reason, message) = if !shortfalls.is_empty() {
        let held = if plan.held_back {
            "; no host claimed until all fit"
        } else {
            ""
        };
        (false, "Unschedulable", format!("{}{held}", shortfalls.join("; ")))
    } else if let Err(failures) = services {
        let reason = [ADOPTION_BLOCKED, TEMPLATE_NOT_RENDERED]
            .into_iter()
            .find(|r| failures.iter().any(|(f, _)| f == r))
            .unwrap_or(INFRA_FAILURE);
        let words: Vec<&str> = failures.iter().map(|(_, m)| m.as_str()).collect();
        (false, reason, words.join("; "))
    } else if !problems.is_empty() {
        (
            false,
            INFRA_FAILURE,
            format!("host records: {}", problems.join("; ")),
        )
    } else {
        let running = services.as_ref().map_or(0, Vec::len);
        (
            true,
            "ReconciliationSucceeded",
            format!("{hosts} hosts chosen, {running} services running"),
        )
    };
    Ready { ok, reason, message }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::sip::labels;
    use crate::sip::schedule::RolePlan;

    fn host(cluster: Option<(&str, &str)>) -> BareMetalHost {
        let mut labels = serde_json::Map::new();
        if let Some((ns, name)) = cluster {
            labels.insert(labels::CLUSTER_NAMESPACE.into(), ns.into());
            labels.insert(labels::CLUSTER_NAME.into(), name.into());
        }
        serde_json::from_value(json!({
            "apiVersion": "metal3.io/v1alpha1",
            "kind": "BareMetalHost",
            "metadata": {"name": "h", "namespace": "metal", "labels": labels},
            "spec": {},
        }))
        .expect("a host")
    }

    /// A host is written only as the round judged it: a claim needs it free
    /// still, a restate or release needs it still the cluster's — never
    /// another cluster's that claimed it since.
    #[test]
    fn a_host_is_written_only_as_it_was_judged() {
        let alpha = Key::<SIPCluster>::new(Some("sip"), "alpha");
        let beta = Key::<SIPCluster>::new(Some("sip"), "beta");
        // (what, host now, owner the round judged, written)
        let cases = [
            ("claim of a free host", host(None), None, true),
            (
                "claim of a host alpha took since",
                host(Some(("sip", "alpha"))),
                None,
                false,
            ),
            (
                "alpha restates its own host",
                host(Some(("sip", "alpha"))),
                Some(&alpha),
                true,
            ),
            (
                "alpha releases a host beta holds now",
                host(Some(("sip", "beta"))),
                Some(&alpha),
                false,
            ),
            (
                "alpha releases a host released since",
                host(None),
                Some(&alpha),
                false,
            ),
            (
                "same name, other namespace",
                host(Some(("other", "alpha"))),
                Some(&alpha),
                false,
            ),
            ("beta's own", host(Some(("sip", "beta"))), Some(&beta), true),
        ];
        for (what, h, owner, written) in cases {
            let result = still_owned_by(&h, owner);
            assert_eq!(result.is_ok(), written, "{what}: {result:?}");
            if let Err(e) = result {
                assert_eq!(e.category(), crate::error::Category::Conflict, "{what}");
                assert!(e.to_string().contains("metal/h"), "{what}: {e}");
            }
        }
    }

    /// (what, held back, released, gives hosts back).
    #[test]
    fn only_a_held_back_plan_that_releases_is_checked_on_a_fresh_read() {
        let releasing = RolePlan {
            release: vec![("metal/h".into(), "held back".into())],
            ..RolePlan::default()
        };
        let cases = [
            ("held back, releasing", true, releasing.clone(), true),
            ("held back, nothing to give", true, RolePlan::default(), false),
            ("not held back, releasing", false, releasing, false),
        ];
        for (what, held_back, role, want) in cases {
            let plan = ClusterPlan {
                roles: vec![RolePlan::default(), role],
                held_back,
            };
            assert_eq!(gives_hosts_back(&plan), want, "{what}");
        }
    }

    /// (what, from the status's hosts and upstream's labels, initial).
    #[test]
    fn a_cluster_is_initial_until_it_had_hosts() {
        let sip = |hosts: serde_json::Value| -> SIPCluster {
            serde_json::from_value(json!({
                "apiVersion": "airship.airshipit.org/v1", "kind": "SIPCluster",
                "metadata": {"name": "c", "namespace": "sip"},
                "spec": {"nodes": {}, "services": {}},
                "status": hosts,
            }))
            .expect("a sipcluster")
        };
        let had = json!({"hosts": [{"name": "metal/h", "role": "Worker", "state": "active"}]});
        let cases = [
            ("no status", sip(serde_json::Value::Null), false, true),
            ("no hosts listed", sip(json!({"hosts": []})), false, true),
            ("hosts listed", sip(had.clone()), false, false),
            ("holding upstream's hosts", sip(json!({})), true, false),
            ("both", sip(had), true, false),
        ];
        for (what, sip, from_upstream, want) in cases {
            assert_eq!(is_initial(&sip, from_upstream), want, "{what}");
        }
    }

    /// (what, the SIPCluster's load balancers, the template ConfigMap
    /// changed, whether its services change with it).
    #[test]
    fn a_template_concerns_the_clusters_with_its_load_balancer() {
        let sip = |services: serde_json::Value| -> SIPCluster {
            serde_json::from_value(json!({
                "apiVersion": "airship.airshipit.org/v1", "kind": "SIPCluster",
                "metadata": {"name": "c", "namespace": "sip"},
                "spec": {"nodes": {}, "services": services},
            }))
            .expect("a sipcluster")
        };
        let cp = json!([{"image": "haproxy", "nodePort": 30000}]);
        let worker = json!([{"image": "haproxy", "nodePortRange": {"start": 30001, "end": 30002}}]);
        let (cp_template, worker_template) =
            (services::CONTROL_PLANE_TEMPLATE.0, services::WORKER_TEMPLATE.0);
        let cases = [
            (
                "control plane",
                json!({"loadBalancerControlPlane": cp}),
                cp_template,
                true,
            ),
            (
                "control plane, not the worker's",
                json!({"loadBalancerControlPlane": cp}),
                worker_template,
                false,
            ),
            (
                "worker",
                json!({"loadBalancerWorker": worker}),
                worker_template,
                true,
            ),
            (
                "worker, not the control plane's",
                json!({"loadBalancerWorker": worker}),
                cp_template,
                false,
            ),
            ("no load balancer", json!({}), cp_template, false),
            (
                "another ConfigMap",
                json!({"loadBalancerControlPlane": cp}),
                "jumphost-c",
                false,
            ),
        ];
        for (what, services, template, want) in cases {
            assert_eq!(renders_with(&sip(services), template), want, "{what}");
        }
    }

    fn endpoint(name: &str) -> ServiceEndpoint {
        ServiceEndpoint {
            kind: "jumpHost".into(),
            name: name.into(),
            ..ServiceEndpoint::default()
        }
    }

    /// (what, a role's shortfall, held back, the services, a host record's
    /// problem, Ready: ok, reason, message).
    #[test]
    fn ready_names_what_matters_most() {
        type Services = std::result::Result<Vec<ServiceEndpoint>, Failures>;
        type Case<'a> = (&'a str, Option<&'a str>, bool, Services, Option<&'a str>, Ready);
        let ready = |ok, reason, message: &str| Ready {
            ok,
            reason,
            message: message.into(),
        };
        let blocked = (ADOPTION_BLOCKED, "Deployment d: held".to_string());
        let template = (TEMPLATE_NOT_RENDERED, "lb: bad".to_string());
        let infra = (INFRA_FAILURE, "jh: no keys".to_string());
        let cases: [Case; 7] = [
            (
                "all there",
                None,
                false,
                Ok(vec![endpoint("a"), endpoint("b")]),
                None,
                ready(
                    true,
                    "ReconciliationSucceeded",
                    "2 hosts chosen, 2 services running",
                ),
            ),
            (
                "a role short, held back",
                Some("Worker: 1 of 2"),
                true,
                Err(vec![infra.clone()]),
                Some("h: no BMC"),
                ready(
                    false,
                    "Unschedulable",
                    "Worker: 1 of 2; no host claimed until all fit",
                ),
            ),
            (
                "a role short",
                Some("Worker: 1 of 2"),
                false,
                Ok(vec![]),
                None,
                ready(false, "Unschedulable", "Worker: 1 of 2"),
            ),
            (
                "a takeover blocked before the rest",
                None,
                false,
                Err(vec![infra.clone(), template.clone(), blocked]),
                None,
                ready(
                    false,
                    ADOPTION_BLOCKED,
                    "jh: no keys; lb: bad; Deployment d: held",
                ),
            ),
            (
                "a template before infrastructure",
                None,
                false,
                Err(vec![infra.clone(), template]),
                None,
                ready(false, TEMPLATE_NOT_RENDERED, "jh: no keys; lb: bad"),
            ),
            (
                "infrastructure",
                None,
                false,
                Err(vec![infra]),
                Some("h: no BMC"),
                ready(false, INFRA_FAILURE, "jh: no keys"),
            ),
            (
                "a host's record",
                None,
                false,
                Ok(vec![endpoint("a")]),
                Some("h: no BMC"),
                ready(false, INFRA_FAILURE, "host records: h: no BMC"),
            ),
        ];
        for (what, shortfall, held_back, services, problem, want) in cases {
            let plan = ClusterPlan {
                roles: vec![RolePlan {
                    shortfall: shortfall.map(String::from),
                    ..RolePlan::default()
                }],
                held_back,
            };
            let details = BTreeMap::from([(
                "metal/h".to_string(),
                HostDetails {
                    problems: problem.map(String::from).into_iter().collect(),
                    ..HostDetails::default()
                },
            )]);
            assert_eq!(readiness(&plan, 2, &details, &services), want, "{what}");
        }
    }
}
