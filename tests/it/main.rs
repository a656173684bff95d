//! nodewarden's integration tests, one binary: every module runs against
//! the real local control plane (`e2e/controlplane/cluster.sh`, started
//! once for the run by the first test that needs it), with the harness of
//! `crates/testkit` as `support`. The chaos runs (`tests/chaos.rs`,
//! `tests/chaos_storms.rs`) restart the shared API server, so they stay
//! binaries of their own.
//!
//! One module per concern; `cargo test --test it <module>::` runs one.
//! `just test` runs the modules whose tests bound a time (failover,
//! handover, calls per window) after the others, two at a time: its `timed`
//! list. A module with a time bound goes on that list; the others run four
//! at a time.

use nodewarden_testkit as support;

mod admission;
mod admission_ha;
mod admission_hardening;
mod aws;
mod aws_ha;
mod azure;
mod chart;
mod cloud_faults;
mod cloud_ha;
mod controller;
mod controlplane;
mod etcd_defaults;
mod etcd_members;
mod event_filtering;
mod gcp;
mod handover;
mod install;
mod late_writes;
mod leader_election;
mod maintenance_props;
mod manifests;
mod node_maintenance;
mod observability;
mod plan_schedule_props;
mod plans;
mod plans_ha;
mod production;
mod random_specs;
mod reflector;
mod rollout;
mod rollout_halt;
mod rollout_planner_props;
mod rollout_waves;
mod rollout_zones;
mod sim_cloud;
mod sip;
mod sip_ha;
mod sip_schedule_props;
mod small_controllers;
mod update_api;
mod workqueue_props;
