//! The SIPCluster controller's own figures: hosts by role and state
//! (leader only) and the failed hosts it replaced.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::telemetry::Metrics;

/// Label set of `sip_hosts`: the SIPCluster, a role and a state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SipHostLabels {
    /// The SIPCluster's namespace (not `namespace`: scrapes add that label for the pod's).
    pub cluster_namespace: String,
    /// The SIPCluster's name.
    pub cluster: String,
    /// `ControlPlane` or `Worker`.
    pub role: String,
    /// `active`, `standby`, or `wanted` (active + standby asked for).
    pub state: String,
}

/// Label set of `sip_host_replacements`: the SIPCluster and the role.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SipRoleLabels {
    /// The SIPCluster's namespace.
    pub cluster_namespace: String,
    /// The SIPCluster's name.
    pub cluster: String,
    /// `ControlPlane` or `Worker`.
    pub role: String,
}

/// The SIPCluster families, registered by the SIPCluster controller.
#[derive(Clone)]
pub struct SipMetrics {
    /// Hosts of each SIPCluster by role and state (set by the leader).
    pub sip_hosts: Family<SipHostLabels, Gauge>,
    /// Failed active hosts replaced, by SIPCluster and role.
    pub sip_host_replacements: Family<SipRoleLabels, Counter>,
}

impl SipMetrics {
    /// The families, registered with `metrics`; the host counts are
    /// cleared when leadership is lost.
    pub fn register(metrics: &Metrics) -> Self {
        let m = SipMetrics {
            sip_hosts: Family::default(),
            sip_host_replacements: Family::default(),
        };
        metrics.register(
            "sip_hosts",
            "Hosts of each SIPCluster by role and state: active, standby, wanted (leader only)",
            m.sip_hosts.clone(),
        );
        metrics.register(
            "sip_host_replacements",
            "Failed active hosts of a SIPCluster replaced (by a standby or a free host)",
            m.sip_host_replacements.clone(),
        );
        let hosts = m.sip_hosts.clone();
        metrics.leader_only(move || hosts.clear());
        m
    }

    /// Sets a SIPCluster's host counts of one role.
    pub fn set_sip_hosts(&self, namespace: &str, cluster: &str, role: &str, counts: [(&str, usize); 3]) {
        for (state, n) in counts {
            let labels = SipHostLabels {
                cluster_namespace: namespace.into(),
                cluster: cluster.into(),
                role: role.into(),
                state: state.into(),
            };
            self.sip_hosts
                .get_or_create(&labels)
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// A deleted SIPCluster: its series go.
    pub fn forget_sip(&self, namespace: &str, cluster: &str) {
        for role in crate::api::sip::ROLES {
            for state in ["active", "standby", "wanted"] {
                self.sip_hosts.remove(&SipHostLabels {
                    cluster_namespace: namespace.into(),
                    cluster: cluster.into(),
                    role: role.into(),
                    state: state.into(),
                });
            }
        }
    }
}
