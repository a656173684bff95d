//! The simulated cloud's state and its rules, with no IO: time comes in as an
//! argument (milliseconds since the Unix epoch), so tests drive the clock.
//!
//! An instance's state is never stored: it follows from its timestamps and
//! the time asked about. That is what lets a restarted sim-cloud continue
//! every pending timer — it reloads the timestamps and reads the clock.
//!
//! - `Creating` until `ready_at` (created + boot delay), then `Ready` (or
//!   `Failed` under the `failBoot` fault).
//! - Its Node is created at `join_at` (ready + join delay), unless the
//!   instance is under the `neverJoin` fault or was deleted first. That is the
//!   one transition with IO, so it is recorded (`joined_at`) once done.
//! - A delete makes it `Terminating` until `terminated_at` (the delete
//!   request plus the delete delay), then `Terminated`. Terminated instances are kept, so
//!   the cloud can tell "gone" from "never existed", and `GET /instances`
//!   proves that nothing leaked.
//!
//! The sim-cloud never deletes Nodes: as in Constellation, removing the Node
//! object of a deleted instance is the operator's job.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{GroupConfig, SimConfig};
use crate::faults;
use nodewarden_simwire::{Faults, GroupView, InstanceView, provider_id};
use nodewarden_simwire::{GroupRole, InstanceState, ScalingGroup};

/// The label a Node of a group spread over zones carries its zone in.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Milliseconds since the Unix epoch.
pub type Millis = u64;

/// The current wall-clock time. Wall clock (not a monotonic clock) because
/// timestamps must mean the same after a restart.
pub fn now() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as Millis)
        .unwrap_or(0)
}

fn millis(d: Duration) -> Millis {
    d.as_millis().min(Millis::MAX as u128) as Millis
}

/// The whole simulated cloud, exactly as persisted.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cloud {
    /// By group ID.
    pub groups: BTreeMap<String, Group>,
    /// By instance name (unique across the cloud).
    pub instances: BTreeMap<String, Instance>,
    /// Serial number of the next instance; never reused.
    pub next_serial: u64,
    /// The injected faults, as last set through the API.
    pub faults: Faults,
}

/// A scaling group: its setup from the config, and its image.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Group {
    /// Its ID, also the prefix of its instances' names.
    pub id: String,
    /// A short human name (the ID unless the config gives one).
    pub name: String,
    /// Whether its Nodes run workloads or the control plane.
    pub role: GroupRole,
    /// Image of new instances.
    pub image: String,
    /// `Creating` to `Ready`.
    pub boot_delay_ms: Millis,
    /// `Ready` to its Node.
    pub join_delay_ms: Millis,
    /// `Terminating` to `Terminated`.
    pub delete_delay_ms: Millis,
    /// Put on the group's Nodes.
    pub labels: BTreeMap<String, String>,
    /// The InternalIP of its first instance (see the config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal_ip_base: Option<std::net::Ipv4Addr>,
    /// The zones its instances are spread over.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zones: Vec<String>,
}

/// An instance, as persisted: its timestamps, from which its state follows
/// (see the module docs). The record is the wire's: what the API shows is
/// what is stored, plus the state derived from it ([`Lifecycle`]).
pub use nodewarden_simwire::Instance;

/// A Node that is due: everything needed to create it.
#[derive(Clone, Debug, PartialEq)]
pub struct JoinJob {
    /// The instance's name, which its Node takes.
    pub instance: String,
    /// Its group's ID.
    pub group: String,
    /// Its group's role.
    pub role: GroupRole,
    /// The image it runs (the Node's `osImage`).
    pub image: String,
    /// Its group's labels, for the Node.
    pub labels: BTreeMap<String, String>,
    /// Its InternalIP, if its group assigns them.
    pub internal_ip: Option<String>,
}

/// A request the model refuses.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// No group has this ID.
    #[error("group {0} not found")]
    UnknownGroup(String),
    /// The cloud never had an instance of this name.
    #[error("instance {0} not found")]
    UnknownInstance(String),
    /// The request is malformed (e.g. an empty image).
    #[error("{0}")]
    Invalid(String),
}

/// What an instance's timestamps mean for the simulator.
pub trait Lifecycle {
    /// The state at time `now`.
    fn state(&self, now: Millis) -> InstanceState;
    /// Its Node has yet to be created, and will be (at the given time).
    fn awaits_join(&self) -> Option<Millis>;
    /// How the API shows it at time `now`.
    fn view(&self, now: Millis) -> InstanceView;
}

impl Lifecycle for Instance {
    /// The state at time `now`.
    fn state(&self, now: Millis) -> InstanceState {
        match self.terminated_at_ms {
            Some(t) if now >= t => InstanceState::Terminated,
            Some(_) => InstanceState::Terminating,
            None if now < self.ready_at_ms => InstanceState::Creating,
            None if self.fails => InstanceState::Failed,
            None => InstanceState::Ready,
        }
    }

    /// Its Node has yet to be created, and will be (at `join_at_ms`).
    fn awaits_join(&self) -> Option<Millis> {
        if self.joined_at_ms.is_some() || self.deleted_at_ms.is_some() || self.fails {
            return None;
        }
        self.join_at_ms
    }

    /// How the API shows it at time `now`.
    fn view(&self, now: Millis) -> InstanceView {
        InstanceView {
            provider_id: provider_id(&self.group, &self.name),
            state: self.state(now),
            never_join: self.join_at_ms.is_none(),
            instance: self.clone(),
        }
    }
}

impl Group {
    fn from_config(config: &GroupConfig) -> Group {
        let mut group = Group {
            id: config.id.clone(),
            name: String::new(),
            role: config.role,
            image: config.image.clone(),
            boot_delay_ms: 0,
            join_delay_ms: 0,
            delete_delay_ms: 0,
            labels: BTreeMap::new(),
            internal_ip_base: None,
            zones: Vec::new(),
        };
        group.apply(config);
        group
    }

    /// Takes everything but the image from the config: the image is the
    /// group's mutable state (set through the API), the rest is setup.
    fn apply(&mut self, config: &GroupConfig) {
        self.name = config.name.clone().unwrap_or_else(|| config.id.clone());
        self.role = config.role;
        self.boot_delay_ms = millis(config.boot_delay);
        self.join_delay_ms = millis(config.join_delay);
        self.delete_delay_ms = millis(config.delete_delay);
        self.labels = config.labels.clone();
        self.internal_ip_base = config.internal_ip_base;
        self.zones = config.zones.clone();
    }
}

impl Cloud {
    /// Brings the config in: new groups are added with their initial
    /// instances (already booted and due to join at once); known groups take
    /// the config's delays, labels and role but keep their image and
    /// instances. Groups no longer in the config stay: their instances exist.
    /// Returns whether anything changed.
    pub fn apply_config(&mut self, config: &SimConfig, now: Millis) -> bool {
        let before = self.clone();
        for group_config in &config.groups {
            match self.groups.get_mut(&group_config.id) {
                Some(group) => group.apply(group_config),
                None => {
                    self.groups
                        .insert(group_config.id.clone(), Group::from_config(group_config));
                    for _ in 0..group_config.initial_size {
                        self.add_instance(&group_config.id, None, now, now, Some(now), false);
                    }
                }
            }
        }
        *self != before
    }

    fn add_instance(
        &mut self,
        group: &str,
        request_id: Option<String>,
        now: Millis,
        ready_at: Millis,
        join_at: Option<Millis>,
        fails: bool,
    ) -> &Instance {
        let serial = self.next_serial;
        self.next_serial += 1;
        let name = format!("{group}-{serial:05}");
        let image = self
            .groups
            .get(group)
            .map(|g| g.image.clone())
            .unwrap_or_default();
        // The group's n-th instance gets its base address + n, as a subnet
        // hands out addresses (never one twice: instances are never forgotten).
        let made = self.instances.values().filter(|i| i.group == group).count();
        let internal_ip = self
            .groups
            .get(group)
            .and_then(|g| g.internal_ip_base)
            .and_then(|base| u32::from(base).checked_add(u32::try_from(made).ok()?))
            .map(|ip| std::net::Ipv4Addr::from(ip).to_string());
        let zone = self.least_used_zone(group);
        self.instances.entry(name.clone()).or_insert(Instance {
            name,
            group: group.to_string(),
            image,
            request_id,
            created_at_ms: now,
            ready_at_ms: ready_at,
            join_at_ms: join_at,
            fails,
            joined_at_ms: None,
            deleted_at_ms: None,
            terminated_at_ms: None,
            internal_ip,
            zone,
        })
    }

    /// The zone of `group` with the fewest of its live instances (the first
    /// such in the config's order), as a cloud balances a group's zones.
    fn least_used_zone(&self, group: &str) -> Option<String> {
        let zones = &self.groups.get(group)?.zones;
        let live = |zone: &str| {
            self.instances
                .values()
                .filter(|i| i.group == group && i.deleted_at_ms.is_none() && i.zone.as_deref() == Some(zone))
                .count()
        };
        zones.iter().min_by_key(|z| live(z)).cloned()
    }

    /// Starts a new instance in `group`. With a `request_id` already used in
    /// that group, returns that instance instead (and `false`: not new).
    pub fn create(
        &mut self,
        group: &str,
        request_id: Option<String>,
        now: Millis,
    ) -> Result<(Instance, bool), ModelError> {
        let g = self
            .groups
            .get(group)
            .ok_or_else(|| ModelError::UnknownGroup(group.to_string()))?;
        if let Some(id) = &request_id
            && let Some(existing) = self
                .instances
                .values()
                .find(|i| i.group == group && i.request_id.as_ref() == Some(id))
        {
            return Ok((existing.clone(), false));
        }
        let ready_at = now.saturating_add(g.boot_delay_ms);
        let join_at = ready_at.saturating_add(g.join_delay_ms);
        let never_join = faults::take_never_join(&mut self.faults);
        let fails = faults::take_fail_boot(&mut self.faults);
        let join_at = (!never_join).then_some(join_at);
        let instance = self.add_instance(group, request_id, now, ready_at, join_at, fails);
        Ok((instance.clone(), true))
    }

    /// Starts deleting an instance. Deleting one that is already terminating
    /// or terminated changes nothing and succeeds, as clouds do.
    pub fn delete(&mut self, name: &str, now: Millis) -> Result<Instance, ModelError> {
        let fault_delay = self.faults.delete_delay.map(millis);
        let instance = self
            .instances
            .get_mut(name)
            .ok_or_else(|| ModelError::UnknownInstance(name.to_string()))?;
        if instance.deleted_at_ms.is_none() {
            let delay = fault_delay
                .or_else(|| self.groups.get(&instance.group).map(|g| g.delete_delay_ms))
                .unwrap_or(0);
            instance.deleted_at_ms = Some(now);
            instance.terminated_at_ms = Some(now.saturating_add(delay));
        }
        Ok(instance.clone())
    }

    /// One instance by name, Terminated ones included.
    pub fn instance(&self, name: &str) -> Result<&Instance, ModelError> {
        self.instances
            .get(name)
            .ok_or_else(|| ModelError::UnknownInstance(name.to_string()))
    }

    /// One group by ID.
    pub fn group(&self, id: &str) -> Result<&Group, ModelError> {
        self.groups
            .get(id)
            .ok_or_else(|| ModelError::UnknownGroup(id.to_string()))
    }

    /// Sets the image new instances of the group boot from.
    pub fn set_group_image(&mut self, id: &str, image: &str) -> Result<(), ModelError> {
        if image.is_empty() {
            return Err(ModelError::Invalid("the image must not be empty".into()));
        }
        let group = self
            .groups
            .get_mut(id)
            .ok_or_else(|| ModelError::UnknownGroup(id.to_string()))?;
        group.image = image.to_string();
        Ok(())
    }

    /// Every group, with its size: instances not being deleted.
    pub fn group_views(&self) -> Vec<GroupView> {
        self.groups
            .values()
            .map(|g| {
                let size = self
                    .instances
                    .values()
                    .filter(|i| i.group == g.id && i.deleted_at_ms.is_none())
                    .count();
                GroupView {
                    group: ScalingGroup {
                        id: g.id.clone(),
                        role: g.role,
                        name: g.name.clone(),
                        size: u32::try_from(size).unwrap_or(u32::MAX),
                        image: g.image.clone(),
                    },
                    boot_delay_ms: g.boot_delay_ms,
                    join_delay_ms: g.join_delay_ms,
                    delete_delay_ms: g.delete_delay_ms,
                    labels: g.labels.clone(),
                }
            })
            .collect()
    }

    /// The Nodes due at `now`.
    pub fn due_joins(&self, now: Millis) -> Vec<JoinJob> {
        self.instances
            .values()
            .filter(|i| i.awaits_join().is_some_and(|at| at <= now))
            .filter_map(|i| {
                let group = self.groups.get(&i.group)?;
                let mut labels = group.labels.clone();
                if let Some(zone) = &i.zone {
                    labels.insert(ZONE_LABEL.to_string(), zone.clone());
                }
                Some(JoinJob {
                    instance: i.name.clone(),
                    group: i.group.clone(),
                    role: group.role,
                    image: i.image.clone(),
                    labels,
                    internal_ip: i.internal_ip.clone(),
                })
            })
            .collect()
    }

    /// When the next Node is due (possibly already past), if any is.
    pub fn next_join_at(&self) -> Option<Millis> {
        self.instances.values().filter_map(Instance::awaits_join).min()
    }

    /// Records that the instance's Node now exists.
    pub fn mark_joined(&mut self, name: &str, now: Millis) {
        if let Some(instance) = self.instances.get_mut(name) {
            instance.joined_at_ms.get_or_insert(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Millis = 1_700_000_000_000;

    fn config() -> SimConfig {
        SimConfig::parse(
            r#"
groups:
  - id: w
    role: Worker
    initialSize: 2
    image: v1
    bootDelay: 2s
    joinDelay: 1s
    deleteDelay: 3s
    labels: {zone: a}
  - id: cp
    role: ControlPlane
    image: v1
    internalIpBase: 10.0.1.254
"#,
        )
        .expect("a config")
    }

    fn cloud() -> Cloud {
        let mut cloud = Cloud::default();
        assert!(cloud.apply_config(&config(), T0));
        cloud
    }

    #[test]
    fn initial_instances_are_ready_and_due_to_join_at_once() {
        let cloud = cloud();
        assert_eq!(cloud.instances.len(), 2);
        assert!(
            cloud
                .instances
                .values()
                .all(|i| i.state(T0) == InstanceState::Ready)
        );
        let due = cloud.due_joins(T0);
        assert_eq!(due.len(), 2);
        assert_eq!(due[0].labels["zone"], "a");
        assert_eq!(cloud.group_views()[1].group.size, 2);
    }

    #[test]
    fn reapplying_the_config_keeps_instances_and_image() {
        let mut cloud = cloud();
        cloud.set_group_image("w", "v2").expect("known group");
        let mut changed = config();
        changed.groups[0].boot_delay = Duration::from_secs(9);
        changed.groups[0].initial_size = 5;
        assert!(cloud.apply_config(&changed, T0 + 10));
        assert_eq!(
            cloud.instances.len(),
            2,
            "initial size counts on first start only"
        );
        let w = cloud.group("w").expect("known group");
        assert_eq!((w.image.as_str(), w.boot_delay_ms), ("v2", 9000));
        assert!(
            !cloud.apply_config(&changed, T0 + 20),
            "nothing new the second time"
        );
    }

    #[test]
    fn a_created_instance_boots_then_joins_after_its_delays() {
        let mut cloud = cloud();
        for i in cloud.instance_names() {
            cloud.mark_joined(&i, T0);
        }
        let (instance, new) = cloud.create("w", None, T0).expect("created");
        assert!(new);
        assert_eq!(instance.name, "w-00002");
        assert_eq!(instance.state(T0), InstanceState::Creating);
        assert_eq!(instance.state(T0 + 1999), InstanceState::Creating);
        assert_eq!(instance.state(T0 + 2000), InstanceState::Ready);
        assert_eq!(cloud.next_join_at(), Some(T0 + 3000));
        assert!(cloud.due_joins(T0 + 2999).is_empty());
        assert_eq!(cloud.due_joins(T0 + 3000).len(), 1);
        cloud.mark_joined(&instance.name, T0 + 3001);
        assert!(cloud.due_joins(T0 + 9999).is_empty());
        assert_eq!(cloud.next_join_at(), None);
    }

    #[test]
    fn delete_terminates_after_the_delete_delay_and_is_idempotent() {
        let mut cloud = cloud();
        let (instance, _) = cloud.create("w", None, T0).expect("created");
        let deleted = cloud.delete(&instance.name, T0 + 500).expect("known");
        assert_eq!(deleted.state(T0 + 500), InstanceState::Terminating);
        assert_eq!(deleted.state(T0 + 3499), InstanceState::Terminating);
        assert_eq!(deleted.state(T0 + 3500), InstanceState::Terminated);
        let again = cloud.delete(&instance.name, T0 + 9000).expect("known");
        assert_eq!(
            again.terminated_at_ms,
            Some(T0 + 3500),
            "a second delete changes nothing"
        );
        assert!(
            cloud
                .due_joins(T0 + 9000)
                .iter()
                .all(|j| j.instance != instance.name)
        );
        assert_eq!(cloud.group_views()[1].group.size, 2, "deleting shrinks the group");
        assert_eq!(
            cloud.delete("nope", T0),
            Err(ModelError::UnknownInstance("nope".into()))
        );
    }

    #[test]
    fn new_instances_take_the_group_image_of_their_creation() {
        let mut cloud = cloud();
        cloud.set_group_image("w", "v2").expect("known group");
        let (instance, _) = cloud.create("w", None, T0).expect("created");
        assert_eq!(instance.image, "v2");
        assert!(cloud.instances.values().filter(|i| i.image == "v1").count() == 2);
        assert!(cloud.set_group_image("w", "").is_err());
        assert!(cloud.set_group_image("zz", "v3").is_err());
    }

    #[test]
    fn faults_mark_the_next_instances_and_then_run_out() {
        let mut cloud = cloud();
        cloud.faults.never_join = 1;
        cloud.faults.fail_boot = 1;
        cloud.faults.delete_delay = Some(Duration::from_secs(60));
        let (broken, _) = cloud.create("w", None, T0).expect("created");
        assert_eq!(broken.join_at_ms, None);
        assert!(broken.view(T0).never_join);
        assert_eq!(broken.state(T0 + 2000), InstanceState::Failed);
        let (fine, _) = cloud.create("w", None, T0).expect("created");
        assert!(fine.join_at_ms.is_some() && !fine.fails);
        assert!(
            cloud
                .due_joins(T0 + 100_000)
                .iter()
                .all(|j| j.instance != broken.name)
        );
        let deleted = cloud.delete(&fine.name, T0).expect("known");
        assert_eq!(deleted.terminated_at_ms, Some(T0 + 60_000));
    }

    #[test]
    fn a_repeated_request_id_returns_the_same_instance() {
        let mut cloud = cloud();
        let (first, new) = cloud.create("w", Some("req-1".into()), T0).expect("created");
        assert!(new);
        let (again, new) = cloud.create("w", Some("req-1".into()), T0 + 5).expect("found");
        assert!(!new);
        assert_eq!(again.name, first.name);
        let (other, new) = cloud.create("cp", Some("req-1".into()), T0).expect("created");
        assert!(new, "request IDs are per group");
        assert_ne!(other.name, first.name);
        assert_eq!(
            cloud.create("zz", None, T0).map(|_| ()),
            Err(ModelError::UnknownGroup("zz".into()))
        );
    }

    #[test]
    fn serials_are_never_reused() {
        let mut cloud = cloud();
        let (a, _) = cloud.create("w", None, T0).expect("created");
        cloud.delete(&a.name, T0).expect("known");
        let (b, _) = cloud.create("w", None, T0).expect("created");
        assert_ne!(a.name, b.name);
    }

    #[test]
    fn a_group_hands_out_consecutive_internal_ips() {
        let mut cloud = cloud();
        let ips: Vec<Option<String>> = (0..3)
            .map(|_| cloud.create("cp", None, T0).expect("created").0.internal_ip)
            .collect();
        let want = ["10.0.1.254", "10.0.1.255", "10.0.2.0"].map(|ip| Some(ip.to_string()));
        assert_eq!(ips, want);
        let (worker, _) = cloud.create("w", None, T0).expect("created");
        assert_eq!(worker.internal_ip, None, "a group without a base assigns none");
        let due = cloud.due_joins(T0 + 10_000);
        assert!(due.iter().any(|j| j.internal_ip.as_deref() == Some("10.0.2.0")));
    }

    #[test]
    fn a_group_over_zones_puts_each_instance_in_its_least_used_zone() {
        let mut config = config();
        config.groups[0].zones = vec!["z1".into(), "z2".into(), "z3".into()];
        let mut cloud = Cloud::default();
        assert!(cloud.apply_config(&config, T0));
        let mut made: Vec<Instance> = (0..4)
            .map(|_| cloud.create("w", None, T0).expect("created").0.clone())
            .collect();
        // The config's two initial instances went to z1 and z2.
        let zones: Vec<_> = made.iter().map(|i| i.zone.clone().unwrap_or_default()).collect();
        assert_eq!(zones, ["z3", "z1", "z2", "z3"]);
        // A deleted instance frees its zone for the next one.
        let gone = made.remove(1);
        cloud.delete(&gone.name, T0).expect("known");
        let (next, _) = cloud.create("w", None, T0).expect("created");
        assert_eq!(next.zone.as_deref(), Some("z1"));
        let due = cloud.due_joins(T0 + 100_000);
        let job = due.iter().find(|j| j.instance == next.name).expect("due");
        assert_eq!(job.labels[ZONE_LABEL], "z1");
        assert_eq!(job.labels["zone"], "a", "the group's labels stay");
    }

    impl Cloud {
        fn instance_names(&self) -> Vec<String> {
            self.instances.keys().cloned().collect()
        }
    }
}
