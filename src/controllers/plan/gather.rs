//! Gathering: what the cache, the API and the plan's channel say of a plan
//! and its nodes. Reads only; what the facts mean is `decide`'s.

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Node, Secret};
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use super::decide::{cordoned_by_upstream, drain_timeout, maintenance_state, selects};
use super::{Applying, PlanReconciler, Target, maintenance_name, owner, plan_key, plan_of};
use crate::api::node_maintenance::medik8s;
use crate::api::plan::{Plan, node_label};
use crate::drain::node::recorded_changes;
use crate::error::Result;
use crate::node::node_is_ready;
use crate::runtime::store::ObjectKey;
use crate::upgrade::job::{
    HOSTNAME_LABEL, JobNode, STEP_LABEL, job_name, made_from_another_template, parse_go_duration,
    prepare_job_name, upgrade_job,
};
use crate::upgrade::schedule::{self, Candidate, JobState, Maintenance, NodeFacts};
use crate::upgrade::tally::{Basis, Mark, Tally};
use crate::upgrade::window::Window;
use crate::upgrade::{channel, hash, labels};

/// What a channel answered, and when.
pub(super) struct ChannelAnswer {
    url: String,
    answer: std::result::Result<String, String>,
    at: Instant,
}

/// kubectl's hash of each Secret in the hash, in `spec.secrets` order.
pub(super) type SecretData = Vec<String>;

/// What admission could not check (`validate`): the window, and the
/// Secrets' hashes; or why the plan is invalid.
pub(super) type Validated = std::result::Result<(Option<Window>, SecretData), String>;

/// The version and how it was found (`resolve`: Version or Channel); or
/// why there is none.
pub(super) type Resolved = std::result::Result<(String, &'static str), String>;

impl PlanReconciler {
    /// The nodes a `status.applying` lists by hostname label value
    /// (upstream's entries); the common case, a node named as its label,
    /// needs no scan.
    pub(super) fn applying_names(&self, entries: &[String]) -> Vec<String> {
        let named = |e: &String| {
            self.ctx
                .nodes
                .get(&ObjectKey::cluster(e))
                .is_some_and(|n| n.labels().get(HOSTNAME_LABEL) == Some(e))
        };
        if entries.iter().all(named) {
            return entries.to_vec();
        }
        let nodes: Vec<(String, String)> = self
            .ctx
            .nodes
            .list()
            .iter()
            .filter_map(|n| Some((n.name_any(), n.labels().get(HOSTNAME_LABEL)?.clone())))
            .collect();
        nodes_of_hostnames(entries, &nodes)
    }

    /// The plan's tally of the nodes it selects (that have a hostname to
    /// pin a Job to), brought up to date: from the nodes that changed since
    /// its last pass, or from every node when the target, the selector or
    /// the plan itself is new (or this is its first pass here).
    pub(super) fn tally<'t>(
        &self,
        tallies: &'t mut HashMap<ObjectKey, Tally>,
        plan: &Plan,
        hash: &str,
    ) -> &'t Tally {
        let key = plan_key(plan);
        let basis = Basis {
            plan_uid: plan.metadata.uid.clone().unwrap_or_default(),
            generation: plan.metadata.generation,
            hash: hash.to_string(),
        };
        // Taken before the cache is read: a change after this is noted again.
        let changed = self.ctx.changed_nodes.take(&key);
        let label = node_label(&plan.name_any());
        let mark = |node: &Node| {
            selects(plan, node).then(|| {
                let value = hash_label_of(&label, node);
                Mark {
                    upgraded: value == Some(hash),
                    due: schedule::is_due(value, hash),
                }
            })
        };
        match tallies.entry(key) {
            Entry::Occupied(e) if e.get().basis() == &basis => {
                let tally = e.into_mut();
                for name in changed {
                    let node = self.ctx.nodes.get(&ObjectKey::cluster(&name));
                    tally.set(&name, node.as_deref().and_then(mark));
                }
                tally
            }
            e => {
                let mut tally = Tally::new(basis);
                for node in self.ctx.nodes.list() {
                    if let Some(m) = mark(&node) {
                        tally.set(name_of(&node), Some(m));
                    }
                }
                match e {
                    Entry::Occupied(mut e) => {
                        e.insert(tally);
                        e.into_mut()
                    }
                    Entry::Vacant(e) => e.insert(tally),
                }
            }
        }
    }

    /// A deleted plan's tally and notes go with it.
    pub(super) fn forget_tally(&self, key: &ObjectKey) {
        self.ctx.changed_nodes.take(key);
        self.ctx
            .tallies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    /// What the cluster shows about one applying node.
    pub(super) fn node_facts(&self, plan: &Plan, name: &str, target: &Target, now: Timestamp) -> NodeFacts {
        let hash = target.hash.as_str();
        let node = self.ctx.nodes.get(&ObjectKey::cluster(name));
        let plan_name = plan.name_any();
        let ns = plan.namespace().unwrap_or_default();
        let current = job_name(&plan_name, name, hash);
        let job_object = self.ctx.jobs.get(&ObjectKey::new(Some(&ns), &current));
        let job = job_object
            .as_deref()
            .map(|j| job_state(j, name))
            .unwrap_or(JobState::Absent);
        let prepare_job = plan.spec.prepare.as_ref().map(|_| {
            self.ctx
                .jobs
                .get(&ObjectKey::new(
                    Some(&ns),
                    &prepare_job_name(&plan_name, name, hash),
                ))
                .map(|j| job_state(&j, name))
                .unwrap_or(JobState::Absent)
        });
        let earlier_job_running = self.ctx.jobs.list().iter().any(|j| {
            j.namespace().as_deref() == Some(ns.as_str())
                && j.labels().get(labels::PLAN) == Some(&plan_name)
                && j.labels().get(labels::NODE).map(String::as_str) == Some(name)
                && !j.labels().contains_key(STEP_LABEL)
                && j.name_any() != current
                && job_state(j, name) == JobState::Running
        });
        let maintenance = self
            .ctx
            .maintenances
            .get(&ObjectKey::cluster(&maintenance_name(plan, name)))
            .map(|m| maintenance_state(&m, drain_timeout(plan), now))
            .unwrap_or(Maintenance::Absent);
        let record = node.as_deref().and_then(recorded_changes);
        let cordoned_by_plan = record.as_ref().is_some_and(|c| c.owner == owner(plan));
        let held_by = record.map(|c| c.owner).filter(|o| *o != owner(plan));
        let upstream_cordon = node
            .as_deref()
            .is_some_and(|n| cordoned_by_upstream(plan, n, job_object.as_deref()));
        let remnants = maintenance != Maintenance::Absent
            || cordoned_by_plan
            || upstream_cordon
            || job == JobState::Running
            || earlier_job_running;
        NodeFacts {
            name: name.to_string(),
            hash_label: node.as_ref().and_then(|n| hash_label(plan, n)),
            ready: node.as_deref().is_some_and(node_is_ready),
            ready_since: node.as_deref().and_then(ready_since),
            selected: node.as_deref().is_some_and(|n| selects(plan, n)),
            maintenance,
            cordoned_by_plan,
            held_by,
            job_outdated: matches!(job, JobState::Failed(_))
                && job_object
                    .as_deref()
                    .zip(node.as_deref())
                    .is_some_and(|(j, n)| self.made_from_an_earlier_spec(plan, j, n, target)),
            job,
            prepare_job,
            earlier_job_running,
            remnants,
        }
    }

    /// Whether `job`, node `n`'s Job at the target, was made from an earlier
    /// spec of `plan` (only asked of failed Jobs: a Job is built for it).
    fn made_from_an_earlier_spec(&self, plan: &Plan, job: &Job, n: &Node, target: &Target) -> bool {
        let wanted = upgrade_job(
            plan,
            &JobNode::of(n),
            &target.version,
            &target.hash,
            &self.ctx.config.jobs,
        );
        made_from_another_template(job, &wanted)
    }

    /// The nodes due on the plan's tally and not applying yet, as the
    /// schedule weighs them.
    pub(super) fn candidates(&self, kept: &[&Applying], tally: &Tally) -> Vec<Candidate> {
        let applying: BTreeSet<&str> = kept.iter().map(|a| a.name.as_str()).collect();
        tally
            .due()
            .filter(|name| !applying.contains(name))
            .filter_map(|name| self.ctx.nodes.get(&ObjectKey::cluster(name)))
            .map(|n| Candidate {
                name: n.name_any(),
                uid: n.metadata.uid.clone().unwrap_or_default(),
                ready: node_is_ready(&n),
            })
            .collect()
    }

    /// Another exclusive plan with nodes applying, when this one is exclusive.
    pub(super) fn exclusive_holder(&self, plan: &Plan) -> Option<String> {
        if !plan.spec.exclusive.unwrap_or(false) {
            return None;
        }
        self.ctx
            .plans
            .list()
            .into_iter()
            .filter(|p| p.spec.exclusive.unwrap_or(false) && p.metadata.uid != plan.metadata.uid)
            .find(|p| p.status.as_ref().is_some_and(|s| !s.applying.is_empty()))
            .map(|p| p.key())
            // What this replica wrote may not be in the cache yet.
            .or_else(|| {
                let applying = self
                    .ctx
                    .exclusive_applying
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                applying.iter().find(|k| **k != plan.key()).cloned()
            })
    }

    /// The nodes a deleted plan touched: those it lists, and any that
    /// still carry its cordon record or a NodeMaintenance of its.
    pub(super) fn nodes_touched(&self, plan: &Plan) -> BTreeSet<String> {
        let entries = plan
            .status
            .as_ref()
            .map(|s| s.applying.clone())
            .unwrap_or_default();
        let mut nodes: BTreeSet<String> = self.applying_names(&entries).into_iter().collect();
        let me = owner(plan);
        for n in self.ctx.nodes.list() {
            if recorded_changes(&n).is_some_and(|c| c.owner == me) {
                nodes.insert(n.name_any());
            }
        }
        for m in self.ctx.maintenances.list() {
            if plan_of(&m.metadata).is_some_and(|k| {
                k.untyped() == &ObjectKey::new(plan.namespace().as_deref(), &plan.name_any())
            }) {
                nodes.insert(m.spec.node_name.clone());
            }
        }
        nodes
    }

    /// The nodes whose NodeMaintenance of `plan` is still there: one fresh
    /// list by the plan's labels (what its maintenances carry; the role may
    /// list them, not get them).
    pub(super) async fn maintenances_left(&self, plan: &Plan) -> Result<Vec<String>> {
        let maintenances: Api<medik8s::NodeMaintenance> = Api::all(self.ctx.client.clone());
        let of_plan = format!(
            "{}={},{}={}",
            labels::PLAN,
            plan.name_any(),
            labels::PLAN_NAMESPACE,
            plan.namespace().unwrap_or_default()
        );
        Ok(maintenances
            .list(&ListParams::default().labels(&of_plan))
            .await?
            .items
            .into_iter()
            .map(|m| m.spec.node_name)
            .collect())
    }

    /// What admission could not check: the window's time zone, the
    /// Secrets the hash needs. Upstream's wording where it has one.
    pub(super) async fn validate(&self, plan: &Plan) -> Validated {
        let spec = &plan.spec;
        if let Some(d) = &spec.drain
            && d.delete_emptydir_data.is_some()
            && d.delete_local_data.is_some()
        {
            return Err("spec.drain cannot specify both deleteEmptydirData and deleteLocalData".into());
        }
        if let Some(delay) = spec.post_complete_delay.as_deref() {
            if delay.trim_start().starts_with('-') {
                return Err("spec.postCompleteDelay is negative".into());
            }
            if parse_go_duration(delay).is_none() {
                return Err(format!("spec.postCompleteDelay {delay:?} is not a duration"));
            }
        }
        let window = spec.window.as_ref().map(Window::parse).transpose()?;
        let ns = plan.namespace().unwrap_or_default();
        let api: Api<Secret> = Api::namespaced(self.ctx.client.clone(), &ns);
        let mut secrets = SecretData::new();
        for name in hash::hashed_secrets(spec) {
            match api.get_opt(name).await {
                Ok(Some(s)) => {
                    secrets.push(hash::secret_hash(&s));
                }
                Ok(None) => {
                    return Err(format!(
                        "spec.secrets: secret \"{name}\" not found in namespace {ns}"
                    ));
                }
                Err(e) => return Err(format!("spec.secrets: reading secret \"{name}\": {e}")),
            }
        }
        Ok((window, secrets))
    }

    /// The version: `spec.version`, else the channel's answer (asked at
    /// most once per poll interval). Ok carries how: Version or Channel.
    pub(super) async fn resolve(&self, plan: &Plan) -> Resolved {
        if let Some(v) = plan.spec.version.as_deref().filter(|v| !v.is_empty()) {
            return Ok((channel::munge(v), "Version"));
        }
        let Some(url) = plan.spec.channel.as_deref().filter(|c| !c.is_empty()) else {
            return Err("cannot resolve plan: missing channel and version".into());
        };
        let key = plan.key();
        let cached = {
            let channels = self.ctx.channels.lock().unwrap_or_else(|e| e.into_inner());
            channels
                .get(&key)
                .filter(|c| c.url == url && c.at.elapsed() < self.ctx.config.channel_poll)
                .map(|c| c.answer.clone())
        };
        let answer = match cached {
            Some(answer) => answer,
            None => {
                let asker = channel::Asker {
                    cluster_id: self.cluster_id().await,
                    latest_version: plan.status.as_ref().and_then(|s| s.latest_version.clone()),
                };
                let answer = channel::resolve(url, &asker).await.map_err(|e| e.to_string());
                let mut channels = self.ctx.channels.lock().unwrap_or_else(|e| e.into_inner());
                channels.insert(
                    key,
                    ChannelAnswer {
                        url: url.to_string(),
                        answer: answer.clone(),
                        at: Instant::now(),
                    },
                );
                answer
            }
        };
        answer.map(|v| (v, "Channel"))
    }

    /// The cluster's ID as upstream tells channels: the UID of
    /// `kube-system`, read once. Unreadable, channels are asked without it.
    async fn cluster_id(&self) -> Option<String> {
        let read = self
            .ctx
            .cluster_id
            .get_or_try_init(|| async {
                let api: Api<Namespace> = Api::all(self.ctx.client.clone());
                api.get("kube-system")
                    .await
                    .map(|ns| ns.metadata.uid.unwrap_or_default())
            })
            .await;
        match read {
            Ok(uid) => Some(uid.clone()),
            Err(e) => {
                tracing::warn!(error = %e, "kube-system unreadable: channels are asked without a cluster ID");
                None
            }
        }
    }
}

/// The nodes whose hostname label is one of `entries` (`nodes`: name and
/// label), in the entries' order; an entry no node carries stands for
/// itself (a node since gone, or a name an older status wrote), so the
/// step that finds no node releases it.
fn nodes_of_hostnames(entries: &[String], nodes: &[(String, String)]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for entry in entries {
        let found: Vec<&String> = nodes.iter().filter(|(_, h)| h == entry).map(|(n, _)| n).collect();
        let found = match found.is_empty() {
            true => vec![entry],
            false => found,
        };
        for name in found {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
    }
    names
}

fn hash_label(plan: &Plan, node: &Node) -> Option<String> {
    hash_label_of(&node_label(&plan.name_any()), node).map(str::to_string)
}

/// The plan's hash label on `node`, by the label's key made once: a pass
/// looks at every selected node, and at thousands of nodes making the key
/// (and copying the value) for each was most of a reconcile's time.
fn hash_label_of<'a>(key: &str, node: &'a Node) -> Option<&'a str> {
    node.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// A node's name without a copy.
pub(super) fn name_of(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or_default()
}

fn ready_since(node: &Node) -> Option<Timestamp> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")?
        .last_transition_time
        .as_ref()
        .map(|t| t.0)
}

/// How a Job stands; a failed one in upstream's words.
pub(super) fn job_state(job: &Job, node: &str) -> JobState {
    let conditions = job.status.as_ref().and_then(|s| s.conditions.as_ref());
    let find = |t: &str| conditions.and_then(|cs| cs.iter().find(|c| c.type_ == t && c.status == "True"));
    if find("Complete").is_some() {
        return JobState::Succeeded;
    }
    match find("Failed") {
        // Upstream's words: "Job <ns>/<name> failed on Node <node>: <reason>: <message>".
        Some(c) => JobState::Failed(format!(
            "Job {}/{} failed on Node {node}: {}: {}",
            job.namespace().unwrap_or_default(),
            job.name_any(),
            c.reason.as_deref().unwrap_or_default(),
            c.message.as_deref().unwrap_or_default(),
        )),
        None => JobState::Running,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn applying_entries_are_hostnames() {
        let nodes = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(n, h)| (n.to_string(), h.to_string()))
                .collect()
        };
        let strings = |s: &[&str]| -> Vec<String> { s.iter().map(|x| x.to_string()).collect() };
        /// Entries, nodes as name and hostname, the node names.
        type Row<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a [&'a str]);
        let table: &[Row] = &[
            (&["a"], &[("a", "a")], &["a"]),
            (
                &["ip-10-0-0-1"],
                &[("ip-10-0-0-1.ec2.internal", "ip-10-0-0-1")],
                &["ip-10-0-0-1.ec2.internal"],
            ),
            // An older status's node name, or a node since gone: itself.
            (&["gone"], &[("a", "a")], &["gone"]),
            // Two nodes sharing a hostname are both applying (upstream selects by label).
            (&["h"], &[("n1", "h"), ("n2", "h")], &["n1", "n2"]),
            (&["h", "n1"], &[("n1", "h")], &["n1"]),
            (&[], &[("a", "a")], &[]),
        ];
        for (entries, all, want) in table {
            assert_eq!(
                super::nodes_of_hostnames(&strings(entries), &nodes(all)),
                strings(want),
                "{entries:?}"
            );
        }
    }
}
