//! Acting: one node's step carried out through the fenced client, and what
//! a node is released from: the NodeMaintenance that drains it (the drain is
//! the NodeMaintenance controller's), the cordon, the Jobs, the labels.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{
    Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams, PropagationPolicy,
};
use kube::runtime::events::EventType;

use super::decide::cordoned_by_upstream;
use super::gather::job_state;
use super::{PlanReconciler, Target, maintenance_name, owner};
use crate::api::node_maintenance::{DRAIN_FOR_LABEL, DRAIN_FOR_PLAN, medik8s};
use crate::api::plan::{Plan, node_label};
use crate::controllers::{delete_if_present, same_object};
use crate::drain::kubectl::{self, KubectlDrain};
use crate::drain::node::Quarantine;
use crate::error::{Error, Result};
use crate::runtime::store::ObjectKey;
use crate::telemetry::trace::TRACEPARENT_ANNOTATION;
use crate::upgrade::job::{
    JobNode, inherited_labels, job_name, prepare_job, prepare_job_name, stamp_template_digest, upgrade_job,
};
use crate::upgrade::labels;
use crate::upgrade::schedule::{JobState, Step};

impl PlanReconciler {
    /// Carries out one node's step.
    pub(super) async fn step(&self, plan: &Plan, node: &str, step: Step, target: &Target) -> Result<()> {
        if matches!(step, Step::Wait | Step::Finish) {
            return Ok(());
        }
        self.ctx.leader.ensure_leader()?;
        match step {
            Step::Wait | Step::Finish => Ok(()),
            Step::Drain => self.create_maintenance(plan, node, target).await,
            Step::Cordon => self.cordon(plan, node).await,
            Step::CreateJob => self.create_job(plan, node, target).await,
            Step::Prepare => self.create_prepare_job(plan, node, target).await,
            Step::RetryPrepare => self.retry_prepare(plan, node, target).await,
            Step::RetryJob => self.retry_job(plan, node, target).await,
            Step::Label => self.label(plan, node, target).await,
            Step::Release => self.release(plan, node, &target.hash).await,
        }
    }

    async fn create_maintenance(&self, plan: &Plan, node: &str, target: &Target) -> Result<()> {
        let mut labels = inherited_labels(plan);
        labels.insert(labels::PLAN.into(), plan.name_any());
        // The webhook judges a Plan's drain by its own rule (the label).
        labels.insert(DRAIN_FOR_LABEL.into(), DRAIN_FOR_PLAN.into());
        labels.insert(
            labels::PLAN_NAMESPACE.into(),
            plan.namespace().unwrap_or_default(),
        );
        // The node's record (and trace) was written when it was chosen.
        let traceparent = plan
            .status
            .iter()
            .flat_map(|s| s.nodes.iter())
            .find(|r| r.name == node)
            .map(|r| r.traceparent.clone())
            .unwrap_or_default();
        let mut annotations = BTreeMap::new();
        if !traceparent.is_empty() {
            annotations.insert(TRACEPARENT_ANNOTATION.to_string(), traceparent);
        }
        // The drain follows kubectl's rules with the plan's options, as upstream's.
        let drain = KubectlDrain::of(&plan.spec.drain.clone().unwrap_or_default());
        annotations.insert(
            kubectl::ANNOTATION.to_string(),
            serde_json::to_string(&drain).unwrap_or_default(),
        );
        let m = medik8s::NodeMaintenance {
            metadata: ObjectMeta {
                name: Some(maintenance_name(plan, node)),
                labels: Some(labels),
                annotations: Some(annotations),
                ..Default::default()
            },
            spec: medik8s::NodeMaintenanceSpec {
                node_name: node.to_string(),
                reason: Some(format!(
                    "Plan {} upgrades the node to {}",
                    plan.key(),
                    target.version
                )),
                // No deadline of its own: past spec.drain.timeout the plan
                // reports the drain failed while it goes on (see
                // `maintenance_state`), instead of a transient PDB block
                // stopping the plan for good.
                drain_timeout: None,
                on_drain_timeout: None,
            },
            status: None,
        };
        let api: Api<medik8s::NodeMaintenance> = Api::all(self.ctx.client.clone());
        match api.create(&PostParams::default(), &m).await {
            Ok(_) => {
                self.event(
                    plan,
                    EventType::Normal,
                    "Draining",
                    format!("draining node {node}"),
                );
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn cordon(&self, plan: &Plan, node: &str) -> Result<()> {
        let api: Api<Node> = Api::all(self.ctx.client.clone());
        // Written back whole, so read fresh: the cache keeps a trimmed Node.
        let Some(current) = api.get_opt(node).await? else {
            return Ok(());
        };
        let want = Quarantine {
            cordon: true,
            taints: Vec::new(),
            labels: BTreeMap::new(),
        };
        // Held by another since the cache saw it: retried, and the next
        // round waits for them (see `held_by`).
        let changed =
            crate::drain::node::apply(&current, &want, &owner(plan)).map_err(|e| Error::Changed {
                kind: "Node",
                name: node.to_string(),
                reason: e.to_string(),
            })?;
        if let Some(changed) = changed {
            api.replace(node, &PostParams::default(), &changed).await?;
            self.event(plan, EventType::Normal, "Cordon", format!("cordoned node {node}"));
        }
        Ok(())
    }

    async fn create_job(&self, plan: &Plan, node: &str, target: &Target) -> Result<()> {
        let Some(current) = self.ctx.nodes.get(&ObjectKey::cluster(node)) else {
            return Ok(());
        };
        let mut job = upgrade_job(
            plan,
            &JobNode::of(&current),
            &target.version,
            &target.hash,
            &self.ctx.config.jobs,
        );
        // What it runs, so an edit of the plan after a failure is seen.
        stamp_template_digest(&mut job);
        self.create_job_once(plan, job, format!("upgrades node {node}"))
            .await
    }

    /// The node's prepare Job, before anything else is done to it.
    async fn create_prepare_job(&self, plan: &Plan, node: &str, target: &Target) -> Result<()> {
        let Some(current) = self.ctx.nodes.get(&ObjectKey::cluster(node)) else {
            return Ok(());
        };
        let Some(job) = prepare_job(
            plan,
            &JobNode::of(&current),
            &target.version,
            &target.hash,
            &self.ctx.config.jobs,
        ) else {
            return Ok(());
        };
        self.create_job_once(plan, job, format!("prepares node {node}"))
            .await
    }

    /// Creates a Job of a fixed name: one per node, step and hash. Made
    /// before (by this replica or the last leader) counts as done.
    async fn create_job_once(&self, plan: &Plan, job: Job, what: String) -> Result<()> {
        let api: Api<Job> = Api::namespaced(self.ctx.client.clone(), &plan.namespace().unwrap_or_default());
        match api.create(&PostParams::default(), &job).await {
            Ok(j) => {
                self.event(
                    plan,
                    EventType::Normal,
                    "SyncJob",
                    format!("Job {} {what}", j.name_any()),
                );
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// A failed prepare Job is reported and deleted, and the next pass
    /// makes it again: upstream recreates a failed Job, and a prepare that
    /// waits for something (the servers of a k3s pair) must go on waiting.
    /// Nothing has been cordoned or drained yet, so nothing waits on it.
    async fn retry_prepare(&self, plan: &Plan, node: &str, target: &Target) -> Result<()> {
        let ns = plan.namespace().unwrap_or_default();
        let name = prepare_job_name(&plan.name_any(), node, &target.hash);
        let Some(job) = self.ctx.jobs.get(&ObjectKey::new(Some(&ns), &name)) else {
            return Ok(());
        };
        if let JobState::Failed(why) = job_state(&job, node) {
            self.event(plan, EventType::Warning, "JobFailed", format!("{why}; retrying"));
        }
        let api: Api<Job> = Api::namespaced(self.ctx.client.clone(), &ns);
        delete_if_present(&api, &name, &background_deletion(&job)).await?;
        Ok(())
    }

    /// A failed Job made from an earlier spec of the plan is deleted; the
    /// next pass makes it with the edit, at once, where waiting for its TTL
    /// would keep the plan failed for minutes (upstream's apply replaces a
    /// Job whose spec changed).
    async fn retry_job(&self, plan: &Plan, node: &str, target: &Target) -> Result<()> {
        let ns = plan.namespace().unwrap_or_default();
        let name = job_name(&plan.name_any(), node, &target.hash);
        let Some(job) = self.ctx.jobs.get(&ObjectKey::new(Some(&ns), &name)) else {
            return Ok(());
        };
        self.event(
            plan,
            EventType::Normal,
            "SyncJob",
            format!("Job {name} failed and the plan changed since: made again with the change"),
        );
        let api: Api<Job> = Api::namespaced(self.ctx.client.clone(), &ns);
        delete_if_present(&api, &name, &background_deletion(&job)).await?;
        Ok(())
    }

    /// The node gets the hash and postCompleteLabels (with the version and hash expanded).
    async fn label(&self, plan: &Plan, node: &str, target: &Target) -> Result<()> {
        let mut labels = serde_json::Map::new();
        labels.insert(node_label(&plan.name_any()), target.hash.clone().into());
        for (k, v) in &plan.spec.post_complete_labels {
            let v = v
                .replace("$(LATEST_VERSION)", &target.version)
                .replace("$(LATEST_HASH)", &target.hash);
            labels.insert(k.clone(), v.into());
        }
        let patch = serde_json::json!({ "metadata": { "labels": labels } });
        let api: Api<Node> = Api::all(self.ctx.client.clone());
        api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        self.event(
            plan,
            EventType::Normal,
            "JobComplete",
            format!("node {node} upgraded to {}", target.version),
        );
        Ok(())
    }

    /// Deletes every Job of this plan (by owner UID, so never a recreated
    /// plan's), finished ones too. They are owned by the plan, but a deleted
    /// plan does not leave its cleanup to the garbage collector's pace — nor
    /// to a collector that lost track after an API server restart (seen in
    /// tests/chaos_storms.rs: a finished Job outlived its plan by minutes).
    pub(super) async fn delete_jobs(&self, plan: &Plan) -> Result<()> {
        let ns = plan.namespace().unwrap_or_default();
        let Some(uid) = plan.uid() else {
            return Ok(());
        };
        let jobs: Api<Job> = Api::namespaced(self.ctx.client.clone(), &ns);
        for job in self.ctx.jobs.list() {
            let ours = job.namespace().as_deref() == Some(ns.as_str())
                && job.owner_references().iter().any(|o| o.uid == uid);
            if ours {
                self.ctx.leader.ensure_leader()?;
                delete_if_present(&jobs, &job.name_any(), &background_deletion(&job)).await?;
            }
        }
        Ok(())
    }

    /// Undoes exactly what the plan did on `node`: its NodeMaintenance
    /// (whose undo uncordons only if it cordoned), its cordon record, its
    /// unfinished Jobs.
    pub(super) async fn release(&self, plan: &Plan, node: &str, hash: &str) -> Result<()> {
        let maintenances: Api<medik8s::NodeMaintenance> = Api::all(self.ctx.client.clone());
        // The maintenance there now (a fresh list: the role may not get
        // them), deleted by its UID: a delete landing late, after another
        // leader began the node's next drain under the same name, is refused
        // instead of ending that drain.
        let name = maintenance_name(plan, node);
        let by_name = ListParams::default().fields(&format!("metadata.name={name}"));
        for m in maintenances.list(&by_name).await?.items {
            delete_if_present(&maintenances, &name, &same_object(&m.metadata)).await?;
        }
        // Written back whole, so read fresh: the cache keeps a trimmed Node.
        let api: Api<Node> = Api::all(self.ctx.client.clone());
        if self.ctx.nodes.get(&ObjectKey::cluster(node)).is_some()
            && let Some(current) = api.get_opt(node).await?
            && let Some(restored) = crate::drain::node::undo(&current, &owner(plan))
        {
            api.replace(node, &PostParams::default(), &restored).await?;
        } else if let Some(current) = api.get_opt(node).await? {
            // Upstream's own cordon, lifted as upstream lifts it (on the
            // resourceVersion read: a late write loses to any change since).
            let job = self.ctx.jobs.get(&ObjectKey::new(
                plan.namespace().as_deref(),
                &job_name(&plan.name_any(), node, hash),
            ));
            if cordoned_by_upstream(plan, &current, job.as_deref()) {
                let mut uncordoned = current.clone();
                if let Some(spec) = uncordoned.spec.as_mut() {
                    spec.unschedulable = None;
                }
                api.replace(node, &PostParams::default(), &uncordoned).await?;
            }
        }
        let ns = plan.namespace().unwrap_or_default();
        let jobs: Api<Job> = Api::namespaced(self.ctx.client.clone(), &ns);
        for job in self.ctx.jobs.list() {
            let ours = job.namespace().as_deref() == Some(ns.as_str())
                && job.labels().get(labels::PLAN) == Some(&plan.name_any())
                && job.labels().get(labels::NODE).map(String::as_str) == Some(node);
            if ours && job_state(&job, node) == JobState::Running {
                delete_if_present(&jobs, &job.name_any(), &background_deletion(&job)).await?;
            }
        }
        Ok(())
    }
}

/// `job` deleted with its pods (the API's default for Jobs keeps them), and
/// only `job`: a delete landing late, after a plan of the same name made a
/// Job of the same name (one per node and hash), is refused.
fn background_deletion(job: &Job) -> DeleteParams {
    DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..same_object(&job.metadata)
    }
}
