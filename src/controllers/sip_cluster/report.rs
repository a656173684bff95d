//! What a reconcile tells: the status (hosts, services, counts, Ready), the
//! metrics, a trace per replaced host, and Events.

use std::collections::BTreeMap;
use std::time::SystemTime;

use jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::super::replacement_trace::TRACE_FLUSH_TIMEOUT;
use super::super::{event, spawn_event};
use super::SipReconciler;
use super::decide::{self, Failures};
use super::gather::HostDetails;
use super::metrics::SipRoleLabels;
use crate::api::conditions::set_condition;
use crate::api::sip::{ChosenHost, ROLES, SIPCluster, SIPClusterStatus, ServiceEndpoint};
use crate::error::Result;
use crate::sip::schedule::{ClusterPlan, HostState};
use crate::telemetry::trace::{self, SpanRecord, TraceParent};

/// When a reconcile started, finished its label writes, finished.
#[derive(Clone, Copy)]
pub(super) struct Times {
    pub(super) started: SystemTime,
    pub(super) labelled: SystemTime,
    pub(super) done: SystemTime,
}

/// The status: hosts, services, counts and Ready with upstream's reasons.
pub(super) fn status_for(
    sip: &SIPCluster,
    plan: &ClusterPlan,
    members: &[(String, String, HostState)],
    details: &BTreeMap<String, HostDetails>,
    topology: &BTreeMap<String, String>,
    services: &std::result::Result<Vec<ServiceEndpoint>, Failures>,
) -> SIPClusterStatus {
    let mut status = sip.status.clone().unwrap_or_default();
    let generation = sip.metadata.generation;
    status.observed_generation = generation;
    status.hosts = chosen_hosts(sip, members, details, topology);
    status.services = services.clone().unwrap_or_default();
    status.control_plane = role_summary(sip, members, "ControlPlane");
    status.workers = role_summary(sip, members, "Worker");
    let ready = decide::readiness(plan, members.len(), details, services);
    set_condition(
        &mut status.conditions,
        "Ready",
        ready.ok,
        ready.reason,
        ready.message,
        generation,
        Timestamp::now(),
    );
    status
}

/// The status's hosts, each with its address on the services' interface.
fn chosen_hosts(
    sip: &SIPCluster,
    members: &[(String, String, HostState)],
    details: &BTreeMap<String, HostDetails>,
    topology: &BTreeMap<String, String>,
) -> Vec<ChosenHost> {
    let s = &sip.spec.services;
    let interface = s
        .load_balancer_control_plane
        .iter()
        .map(|x| &x.common)
        .chain(s.load_balancer_worker.iter().map(|x| &x.common))
        .chain(s.jump_host.iter().map(|x| &x.common))
        .find_map(|c| c.node_interface_id.clone());
    members
        .iter()
        .map(|(id, role, state)| ChosenHost {
            name: id.clone(),
            role: role.clone(),
            state: state.as_str().into(),
            topology: topology.get(id).cloned(),
            ip: interface
                .as_ref()
                .and_then(|i| details.get(id).and_then(|d| d.addresses.get(i).cloned())),
        })
        .collect()
}

/// A role's hosts against its wants: `active/wanted (+standby/wanted)`;
/// None for a role the spec does not name.
fn role_summary(sip: &SIPCluster, members: &[(String, String, HostState)], role: &str) -> Option<String> {
    let set = sip.spec.nodes.get(role)?;
    let c = set.count.unwrap_or_default();
    let of = |s: HostState| members.iter().filter(|(_, r, x)| r == role && *x == s).count();
    Some(format!(
        "{}/{} (+{}/{})",
        of(HostState::Active),
        c.active,
        of(HostState::Standby),
        c.standby
    ))
}

impl SipReconciler {
    pub(super) async fn write_status(&self, sip: &SIPCluster, status: SIPClusterStatus) -> Result<()> {
        if sip.status.as_ref() == Some(&status) {
            return Ok(());
        }
        self.ctx.leader.ensure_leader()?;
        let mut updated = sip.clone();
        updated.status = Some(status);
        let api: Api<SIPCluster> =
            Api::namespaced(self.ctx.client.clone(), &sip.namespace().unwrap_or_default());
        api.replace_status(&sip.name_any(), &PostParams::default(), &updated)
            .await?;
        Ok(())
    }

    /// Once written: a trace per replaced host, the metrics, the Events.
    pub(super) async fn publish_round(&self, sip: &SIPCluster, plan: &ClusterPlan, times: &Times) {
        let ns = sip.namespace().unwrap_or_default();
        let name = sip.name_any();
        let mut traced = false;
        for (p, role) in plan.roles.iter().zip(ROLES) {
            let wanted = sip
                .spec
                .nodes
                .get(role)
                .and_then(|s| s.count)
                .map(|c| usize::try_from(c.active + c.standby).unwrap_or(0))
                .unwrap_or(0);
            let count = |s: HostState| p.result.iter().filter(|(_, x)| *x == s).count();
            self.ctx.metrics.set_sip_hosts(
                &ns,
                &name,
                role,
                [
                    ("active", count(HostState::Active)),
                    ("standby", count(HostState::Standby)),
                    ("wanted", wanted),
                ],
            );
            for (old, new) in &p.replaced {
                self.ctx
                    .metrics
                    .sip_host_replacements
                    .get_or_create(&SipRoleLabels {
                        cluster_namespace: ns.clone(),
                        cluster: name.clone(),
                        role: role.to_string(),
                    })
                    .inc();
                let promoted = new
                    .as_ref()
                    .is_some_and(|n| p.restate.iter().any(|(r, _)| r == n));
                let tp = TraceParent::new_root();
                let phase = if promoted { "promote standby" } else { "claim host" };
                // The labels are written in one pass (releases first), then
                // the services: the phases share those two intervals.
                let Times {
                    started,
                    labelled,
                    done,
                } = *times;
                trace::emit_phase(&tp, SpanRecord::new("release failed host", started, labelled));
                trace::emit_phase(&tp, SpanRecord::new(phase, started, labelled));
                trace::emit_phase(&tp, SpanRecord::new("update services", labelled, done));
                trace::emit_root(
                    &tp,
                    SpanRecord::new("replace host", times.started, times.done)
                        .attr("nodewarden.sipcluster", format!("{ns}/{name}"))
                        .attr("nodewarden.role", role)
                        .attr("nodewarden.host.old", old.clone())
                        .attr("nodewarden.host.new", new.clone().unwrap_or_default()),
                );
                traced = true;
                let note = match new {
                    Some(n) => format!("{role} host {old} failed: {n} serves in its place"),
                    None => format!("{role} host {old} failed and no host can replace it"),
                };
                self.event(sip, EventType::Warning, "HostReplaced", note);
            }
        }
        if traced {
            trace::flush(TRACE_FLUSH_TIMEOUT).await;
        }
    }

    /// Publishes an Event on the SIPCluster (in the background).
    pub(super) fn event(&self, sip: &SIPCluster, type_: EventType, reason: &str, note: String) {
        let event = event(type_, reason, "Schedule", &note);
        spawn_event(&self.ctx.recorder, event, sip.object_ref(&()));
    }
}
