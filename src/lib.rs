#![warn(missing_docs)]
//! nodewarden: a Kubernetes operator that keeps every node on the OS image and
//! Kubernetes version its operators asked for.
//!
//! Layout: `api` holds the custom resource types (no IO), `runtime` the
//! hand-written watch/queue/leader machinery (the `nodewarden-runtime`
//! crate, which cannot import anything of this one), `http` the health and
//! metrics server, `telemetry` logging and metrics setup.

pub mod admission;
pub mod api;
pub mod client;
pub mod cloud;
pub mod controllers;
pub mod drain;
pub mod error;
pub mod etcd;
pub mod handover;
pub mod http;
pub mod node;
pub mod operator;
pub mod rollout;
pub mod signal;
pub use nodewarden_runtime as runtime;
pub mod sip;
pub mod telemetry;
pub mod upgrade;
pub mod upgrade_agent;
