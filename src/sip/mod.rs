//! What a SIPCluster means (pure): which hosts each role keeps and claims,
//! what a host's records say (its address, its BMC), and the support
//! services' objects and configuration (HAProxy's from upstream's Go
//! templates where given).

pub mod hosts;
pub mod schedule;
pub mod services;
pub mod template;
