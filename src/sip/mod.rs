//! What a SIPCluster means (pure): which hosts each role keeps and claims,
//! what a host's records say (its address, its BMC), and the support
//! services' objects and configuration.

pub mod hosts;
pub mod schedule;
pub mod services;
