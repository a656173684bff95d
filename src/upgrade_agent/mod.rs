//! Constellation's upgrade-agent, which upgrades the control plane in place:
//! given a Kubernetes version and the components to install, it runs
//! `kubeadm upgrade plan` and `kubeadm upgrade apply` on its node. A
//! changed `kubernetesClusterVersion` of the NodeVersion is sent to it
//! before nodes are replaced (the NodeVersion controller's
//! `control_plane` phase). `proto` is the wire contract; `client` the call.

pub mod client;
pub mod proto;
pub mod relay;

pub use client::{AgentClient, AgentError};
pub use proto::{Component, ExecuteUpdateRequest};
