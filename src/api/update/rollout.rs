//! How fast a NodeVersion's rollout may go: surge, unavailability, ordering
//! and timeouts. Constellation hard-codes a surge of 1 (one replacement at a
//! time, so N outdated nodes take N cycles); nodewarden keeps that as the
//! default and lets the operator ask for more, the way Deployments do.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::api::node_maintenance::parse_duration;

/// Default `joinTimeout`: Constellation gives a new node 30 minutes to join.
pub const DEFAULT_JOIN_TIMEOUT: &str = "30m";

/// Default `haltAfterFailedJoins`: three new instances in a row that never
/// join say the image is bad, not the cloud's luck.
pub const DEFAULT_HALT_AFTER_FAILED_JOINS: u32 = 3;

/// Default `haltAfterUnreadyPods`: three workload pods that stay unready on
/// new nodes while their workloads run Ready on old ones.
pub const DEFAULT_HALT_AFTER_UNREADY_PODS: u32 = 3;

/// Default `podReadyTimeout`: how long a pod on a new node may be unready.
pub const DEFAULT_POD_READY_TIMEOUT: &str = "5m";

/// CEL: both limits 0 (as counts or as "0%"); an absent maxUnavailable is its default, 0.
const BOTH_ZERO_RULE: &str = "!(has(self.maxSurge) \
    && (type(self.maxSurge) == int ? self.maxSurge == 0 : self.maxSurge.matches('^0+%$')) \
    && (!has(self.maxUnavailable) || (type(self.maxUnavailable) == int \
        ? self.maxUnavailable == 0 : self.maxUnavailable.matches('^0+%$'))))";

/// CEL: a count of 0 or more, or a percentage such as "25%".
const COUNT_OR_PERCENT_RULE: &str = "type(self) == int ? self >= 0 : self.matches('^[0-9]+%$')";

/// CEL: as COUNT_OR_PERCENT_RULE, with at most 100% (like a Deployment's maxUnavailable).
const COUNT_OR_PERCENT_TO_100_RULE: &str =
    "type(self) == int ? self >= 0 : self.matches('^(100|[1-9]?[0-9])%$')";

/// CEL: a Go duration, the same shape `parse_duration` reads.
const DURATION_RULE: &str = "self.matches('^([0-9]+(\\\\.[0-9]+)?(ms|s|m|h))+$')";

/// CEL: a label key, as a Node's labels take them (`[prefix/]name`).
const LABEL_KEY_RULE: &str = "size(self) <= 316 && self.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$')";

/// `waves`: at most 6 sizes, each a count of 1 or more or a percentage
/// (checked per item: a rule over the whole list costs the API server's
/// CEL budget many times over).
fn wave_sizes(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "maxItems": 6,
        "items": {
            "x-kubernetes-int-or-string": true,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-validations": [{
                "rule": "type(self) == int ? self >= 1 : self.matches('^[0-9]+%$')",
                "message": "spec.rollout.waves must be counts (1 or more) or percentages such as 10%",
            }],
        },
    })
}

/// Settings of the rolling replacement. Every field is optional and has no
/// schema default: an absent field takes the operator's default (its
/// `--rollout-*` flags), else Constellation's behaviour. So a client that
/// writes the whole NodeVersion back without knowing `rollout` (the
/// constellation CLI's `apply` does) falls back to the operator's settings,
/// not to a surge of 1 mid-rollout.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new(BOTH_ZERO_RULE).message(
    "spec.rollout.maxSurge and spec.rollout.maxUnavailable must not both be 0: the rollout could never progress"
))]
pub struct Rollout {
    /// Extra nodes at once while replacing: a count or a percentage (rounded up).
    /// Unset: the NodeVersion's maxNodeBudget, else the operator's default, else 1.
    // 1 is Constellation's fixed surge; a percentage is of the nodes this NodeVersion governs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new(COUNT_OR_PERCENT_RULE)
        .message("spec.rollout.maxSurge must be a count (0 or more) or a percentage such as 25%"))]
    // Not nullable: null is pruned and defaulted (kube marks optional int-or-strings nullable).
    #[schemars(extend("nullable" = false))]
    pub max_surge: Option<IntOrString>,
    /// Nodes drained before their replacement is Ready: a count or a
    /// percentage (rounded down). Unset: the operator's default, else 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new(COUNT_OR_PERCENT_TO_100_RULE)
        .message("spec.rollout.maxUnavailable must be a count (0 or more) or a percentage from 0% to 100%"))]
    // Not nullable: null is pruned and defaulted (kube marks optional int-or-strings nullable).
    #[schemars(extend("nullable" = false))]
    pub max_unavailable: Option<IntOrString>,
    /// Replace control-plane nodes before workers (keep on when Kubernetes
    /// changes version). Unset: the operator's default, else true.
    // A kubelet must never be newer than its API server; false only lets
    // image-only rollouts of both roles overlap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_first: Option<bool>,
    /// How long a new node may take to join and be Ready before it is
    /// deleted (e.g. "30m"). Unset: the operator's default, else 30m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new(DURATION_RULE)
        .message("spec.rollout.joinTimeout must be a duration such as 90s, 30m or 1h30m"))]
    pub join_timeout: Option<String>,
    /// Give up draining an outdated node after this long (e.g. "1h").
    /// Unset: the operator's default, else wait as long as it takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new(DURATION_RULE)
        .message("spec.rollout.drainTimeout must be a duration such as 90s, 30m or 1h30m"))]
    pub drain_timeout: Option<String>,
    /// Halt the rollout after this many new instances in a row were given
    /// up (never joined within joinTimeout, or failed at the cloud): no
    /// instance is created and no node retired until the image changes or
    /// the NodeVersion is annotated `nodewarden.dev/resume-rollout`. 0
    /// never halts. Unset: the operator's default, else 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "int32"))]
    pub halt_after_failed_joins: Option<u32>,
    /// Halt the rollout once this many pods on new nodes of the target
    /// stayed unready for podReadyTimeout while pods of the same workload
    /// are Ready on other nodes (the new image breaks workloads): as
    /// haltAfterFailedJoins, until the image changes or the NodeVersion is
    /// annotated `nodewarden.dev/resume-rollout`. 0 never halts. Unset: the
    /// operator's default, else 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "int32"))]
    pub halt_after_unready_pods: Option<u32>,
    /// How long a workload pod on a new node may stay unready before it
    /// counts towards haltAfterUnreadyPods (e.g. "5m"). Waves and domains
    /// also wait for those pods to be Ready. Unset: the operator's
    /// default, else 5m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new(DURATION_RULE)
        .message("spec.rollout.podReadyTimeout must be a duration such as 90s, 30m or 1h30m"))]
    pub pod_ready_timeout: Option<String>,
    /// Replace in waves: each wave's size, a count or a percentage of the
    /// nodes (rounded up); the last size repeats until all are done. E.g.
    /// `[1, "10%", "100%"]`: one node, then a tenth, then the rest. A wave
    /// starts once the one before is done, every node on the target is
    /// Ready and soakTime has passed. Unset: no waves (maxSurge alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "wave_sizes")]
    pub waves: Option<Vec<IntOrString>>,
    /// How long to wait after a wave is done and Ready before the next
    /// starts (e.g. "10m"). Unset: the operator's default, else none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new(DURATION_RULE)
        .message("spec.rollout.soakTime must be a duration such as 90s, 30m or 1h30m"))]
    pub soak_time: Option<String>,
    /// Replace one failure domain at a time: the Node label whose values
    /// are the domains (e.g. `topology.kubernetes.io/zone`). Only one
    /// domain's nodes are drained or replaced at once, and the next domain
    /// starts once the one before has none outdated and every node on the
    /// target is Ready. Nodes without the label are a domain of their own.
    /// Unset: the operator's default, else no domains.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new(LABEL_KEY_RULE)
        .message("spec.rollout.topologyKey must be a label key such as topology.kubernetes.io/zone"))]
    pub topology_key: Option<String>,
}

/// Where a setting in force came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SettingSource {
    /// The NodeVersion's `spec.rollout` (or `spec.maxNodeBudget`).
    NodeVersion,
    /// The operator's `--rollout-*` flag.
    Operator,
    /// Neither: Constellation's behaviour.
    Builtin,
}

impl Rollout {
    /// Whether no field is set.
    pub fn is_unset(&self) -> bool {
        *self == Rollout::default()
    }

    /// Each field this rollout sets, else `defaults`' (field by field).
    pub fn over(&self, defaults: &Rollout) -> Rollout {
        Rollout {
            max_surge: self.max_surge.clone().or_else(|| defaults.max_surge.clone()),
            max_unavailable: self
                .max_unavailable
                .clone()
                .or_else(|| defaults.max_unavailable.clone()),
            control_plane_first: self.control_plane_first.or(defaults.control_plane_first),
            join_timeout: self
                .join_timeout
                .clone()
                .or_else(|| defaults.join_timeout.clone()),
            drain_timeout: self
                .drain_timeout
                .clone()
                .or_else(|| defaults.drain_timeout.clone()),
            halt_after_failed_joins: self.halt_after_failed_joins.or(defaults.halt_after_failed_joins),
            halt_after_unready_pods: self.halt_after_unready_pods.or(defaults.halt_after_unready_pods),
            pod_ready_timeout: self
                .pod_ready_timeout
                .clone()
                .or_else(|| defaults.pod_ready_timeout.clone()),
            waves: self.waves.clone().or_else(|| defaults.waves.clone()),
            soak_time: self.soak_time.clone().or_else(|| defaults.soak_time.clone()),
            topology_key: self
                .topology_key
                .clone()
                .or_else(|| defaults.topology_key.clone()),
        }
    }

    /// Each setting in force over `own` (the NodeVersion's) and `defaults`
    /// (the operator's): its JSON name, value and source, for people.
    pub fn describe(own: &Rollout, defaults: &Rollout) -> Vec<(&'static str, String, SettingSource)> {
        fn pick<T: Clone>(own: &Option<T>, defaults: &Option<T>) -> (Option<T>, SettingSource) {
            match (own, defaults) {
                (Some(v), _) => (Some(v.clone()), SettingSource::NodeVersion),
                (None, Some(v)) => (Some(v.clone()), SettingSource::Operator),
                (None, None) => (None, SettingSource::Builtin),
            }
        }
        let int_or_string = |v: IntOrString| match v {
            IntOrString::Int(n) => n.to_string(),
            IntOrString::String(s) => s,
        };
        let (surge, surge_from) = pick(&own.max_surge, &defaults.max_surge);
        let (unavailable, unavailable_from) = pick(&own.max_unavailable, &defaults.max_unavailable);
        let (first, first_from) = pick(&own.control_plane_first, &defaults.control_plane_first);
        let (join, join_from) = pick(&own.join_timeout, &defaults.join_timeout);
        let (drain, drain_from) = pick(&own.drain_timeout, &defaults.drain_timeout);
        let (halt, halt_from) = pick(&own.halt_after_failed_joins, &defaults.halt_after_failed_joins);
        let (pods, pods_from) = pick(&own.halt_after_unready_pods, &defaults.halt_after_unready_pods);
        let (pod_timeout, pod_timeout_from) = pick(&own.pod_ready_timeout, &defaults.pod_ready_timeout);
        let (waves, waves_from) = pick(&own.waves, &defaults.waves);
        let (soak, soak_from) = pick(&own.soak_time, &defaults.soak_time);
        let (topology, topology_from) = pick(&own.topology_key, &defaults.topology_key);
        let waves = waves.map(|w| {
            let sizes: Vec<String> = w.into_iter().map(int_or_string).collect();
            format!("[{}]", sizes.join(", "))
        });
        vec![
            (
                "maxSurge",
                surge.map(int_or_string).unwrap_or("1".into()),
                surge_from,
            ),
            (
                "maxUnavailable",
                unavailable.map(int_or_string).unwrap_or("0".into()),
                unavailable_from,
            ),
            ("controlPlaneFirst", first.unwrap_or(true).to_string(), first_from),
            (
                "joinTimeout",
                join.unwrap_or(DEFAULT_JOIN_TIMEOUT.into()),
                join_from,
            ),
            ("drainTimeout", drain.unwrap_or("none".into()), drain_from),
            (
                "haltAfterFailedJoins",
                halt.unwrap_or(DEFAULT_HALT_AFTER_FAILED_JOINS).to_string(),
                halt_from,
            ),
            (
                "haltAfterUnreadyPods",
                pods.unwrap_or(DEFAULT_HALT_AFTER_UNREADY_PODS).to_string(),
                pods_from,
            ),
            (
                "podReadyTimeout",
                pod_timeout.unwrap_or(DEFAULT_POD_READY_TIMEOUT.into()),
                pod_timeout_from,
            ),
            ("waves", waves.unwrap_or("none".into()), waves_from),
            ("soakTime", soak.unwrap_or("none".into()), soak_from),
            ("topologyKey", topology.unwrap_or("none".into()), topology_from),
        ]
    }
}

/// A rollout's limits resolved against a node count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RolloutLimits {
    /// Replacement nodes that may exist at once beyond the nodes they replace.
    pub max_surge: usize,
    /// Nodes that may be out of service at once.
    pub max_unavailable: usize,
}

impl Rollout {
    /// `maxSurge` for a rollout over `total` nodes; a percentage rounds up
    /// (like a Deployment's), so any surge above 0% allows at least one node.
    /// Unset, or malformed (CEL refuses them; only objects older than the
    /// rule can hold one), it is `unset` (the NodeVersion's maxNodeBudget or 1).
    pub fn max_surge_for(&self, total: usize, unset: usize) -> usize {
        self.max_surge
            .as_ref()
            .and_then(|s| scaled_int_or_percent(s, total, true))
            .unwrap_or(unset)
    }

    /// `maxUnavailable` for a rollout over `total` nodes; a percentage rounds
    /// down (like a Deployment's). A malformed value counts as the default, 0.
    pub fn max_unavailable_for(&self, total: usize) -> usize {
        self.max_unavailable
            .as_ref()
            .and_then(|u| scaled_int_or_percent(u, total, false))
            .unwrap_or(0)
    }

    /// `controlPlaneFirst`, true when unset.
    pub fn control_plane_first(&self) -> bool {
        self.control_plane_first.unwrap_or(true)
    }

    /// Both limits for `total` nodes, with `unset_surge` standing in for an
    /// unset maxSurge. When both resolve to 0 (percentages of a small pool,
    /// e.g. 0% and 10% of 5) one node may be unavailable, as a Deployment
    /// does, so the rollout still progresses.
    pub fn limits_for(&self, total: usize, unset_surge: usize) -> RolloutLimits {
        let max_surge = self.max_surge_for(total, unset_surge);
        let mut max_unavailable = self.max_unavailable_for(total);
        if max_surge == 0 && max_unavailable == 0 {
            max_unavailable = 1;
        }
        RolloutLimits {
            max_surge,
            max_unavailable,
        }
    }

    /// `joinTimeout` as a Duration (the default, 30 minutes, if malformed).
    pub fn join_timeout(&self) -> Duration {
        parse_duration(self.join_timeout.as_deref().unwrap_or(DEFAULT_JOIN_TIMEOUT))
            .or_else(|| parse_duration(DEFAULT_JOIN_TIMEOUT))
            .unwrap_or(Duration::from_secs(30 * 60))
    }

    /// `soakTime` as a Duration; none when unset or malformed.
    pub fn soak_time(&self) -> Duration {
        self.soak_time
            .as_deref()
            .and_then(parse_duration)
            .unwrap_or(Duration::ZERO)
    }

    /// `haltAfterFailedJoins`, 3 when unset (0: never halt).
    pub fn halt_after_failed_joins(&self) -> u32 {
        self.halt_after_failed_joins
            .unwrap_or(DEFAULT_HALT_AFTER_FAILED_JOINS)
    }

    /// `haltAfterUnreadyPods`, 3 when unset (0: never halt).
    pub fn halt_after_unready_pods(&self) -> u32 {
        self.halt_after_unready_pods
            .unwrap_or(DEFAULT_HALT_AFTER_UNREADY_PODS)
    }

    /// `podReadyTimeout` as a Duration (the default, 5 minutes, if malformed).
    pub fn pod_ready_timeout(&self) -> Duration {
        self.pod_ready_timeout
            .as_deref()
            .and_then(parse_duration)
            .unwrap_or(Duration::from_secs(5 * 60))
    }

    /// `drainTimeout` as a Duration; None means wait for the drain forever
    /// (also when malformed: never cut a drain short on a value we cannot read).
    pub fn drain_timeout(&self) -> Option<Duration> {
        self.drain_timeout.as_deref().and_then(parse_duration)
    }
}

/// Whether `key` is a label key (`[prefix/]name`), as LABEL_KEY_RULE
/// checks at admission: the flag `--rollout-topology-key` is checked the same.
pub fn is_label_key(key: &str) -> bool {
    fn dns_label(s: &str) -> bool {
        let b = s.as_bytes();
        !b.is_empty()
            && b.len() <= 63
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b[0] != b'-'
            && b[b.len() - 1] != b'-'
    }
    fn name(s: &str) -> bool {
        let b = s.as_bytes();
        !b.is_empty()
            && b.len() <= 63
            && b.iter().all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
    }
    match key.split_once('/') {
        Some((prefix, rest)) => prefix.len() <= 253 && prefix.split('.').all(dns_label) && name(rest),
        None => name(key),
    }
}

/// Resolves a count-or-percentage against `total`, like Kubernetes'
/// `GetScaledValueFromIntOrPercent`: "25%" of 10 is 3 rounding up, 2 rounding
/// down. None for a negative count or a string that is not `<digits>%`.
pub fn scaled_int_or_percent(value: &IntOrString, total: usize, round_up: bool) -> Option<usize> {
    match value {
        IntOrString::Int(n) => usize::try_from(*n).ok(),
        IntOrString::String(s) => {
            let digits = s.strip_suffix('%')?;
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let percent: u128 = digits.parse().ok()?;
            let scaled = percent.checked_mul(total as u128)?;
            let value = if round_up {
                scaled.div_ceil(100)
            } else {
                scaled / 100
            };
            usize::try_from(value).ok()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_keys() {
        for key in ["topology.kubernetes.io/zone", "zone", "a_b.c-D9", "x/y"] {
            assert!(is_label_key(key), "{key}");
        }
        for key in [
            "",
            "/zone",
            "Zone.io/x",
            "a/",
            "-zone",
            "zone-",
            "a/b/c",
            "zone a",
            "x..y/z",
        ] {
            assert!(!is_label_key(key), "{key}");
        }
    }

    fn int(n: i32) -> IntOrString {
        IntOrString::Int(n)
    }

    fn pct(s: &str) -> IntOrString {
        IntOrString::String(s.to_string())
    }

    #[test]
    fn scaled_values_round_like_deployments() {
        let cases = [
            // (value, total, round_up, want)
            (int(3), 10, true, Some(3)),
            (int(3), 10, false, Some(3)),
            (int(0), 10, true, Some(0)),
            (int(-1), 10, true, None),
            (pct("25%"), 10, true, Some(3)),
            (pct("25%"), 10, false, Some(2)),
            (pct("25%"), 12, true, Some(3)),
            (pct("1%"), 5, true, Some(1)),
            (pct("1%"), 5, false, Some(0)),
            (pct("0%"), 100, true, Some(0)),
            (pct("100%"), 7, false, Some(7)),
            (pct("150%"), 4, true, Some(6)),
            (pct("25%"), 0, true, Some(0)),
            (pct("25"), 10, true, None),
            (pct("%"), 10, true, None),
            (pct("-5%"), 10, true, None),
            (pct("2.5%"), 10, true, None),
            (pct("abc"), 10, true, None),
        ];
        for (value, total, round_up, want) in cases {
            assert_eq!(
                scaled_int_or_percent(&value, total, round_up),
                want,
                "{value:?} of {total} (round up: {round_up})"
            );
        }
    }

    fn rollout(surge: IntOrString, unavailable: IntOrString) -> Rollout {
        Rollout {
            max_surge: Some(surge),
            max_unavailable: Some(unavailable),
            ..Rollout::default()
        }
    }

    #[test]
    fn limits_resolve_surge_up_unavailable_down_and_never_both_zero() {
        let cases = [
            // (surge, unavailable, total, want surge, want unavailable)
            (int(1), int(0), 12, 1, 0), // Constellation's behaviour
            (pct("25%"), int(0), 12, 3, 0),
            (pct("10%"), pct("10%"), 12, 2, 1),
            (int(0), int(2), 12, 0, 2),
            (pct("0%"), pct("10%"), 5, 0, 1), // fencepost: both 0 → one unavailable
            (int(0), int(0), 3, 0, 1),
            (pct("50%"), pct("50%"), 0, 0, 1),
            (pct("bad"), pct("bad"), 10, 1, 0), // malformed → defaults
        ];
        for (surge, unavailable, total, want_surge, want_unavailable) in cases {
            let r = rollout(surge.clone(), unavailable.clone());
            assert_eq!(
                r.limits_for(total, 1),
                RolloutLimits {
                    max_surge: want_surge,
                    max_unavailable: want_unavailable
                },
                "surge {surge:?}, unavailable {unavailable:?}, {total} nodes"
            );
        }
        let r = rollout(pct("25%"), pct("25%"));
        assert_eq!(r.max_surge_for(10, 1), 3);
        assert_eq!(r.max_unavailable_for(10), 2);
    }

    #[test]
    fn an_unset_surge_takes_the_stand_in() {
        let cases = [
            // (maxSurge, stand-in, total, want surge)
            (None, 1, 12, 1),
            (None, 4, 12, 4),
            (Some(int(2)), 4, 12, 2),
            (Some(int(0)), 4, 12, 0),
            (Some(pct("bad")), 3, 12, 3),
        ];
        for (surge, unset, total, want) in cases {
            let r = Rollout {
                max_surge: surge.clone(),
                ..Rollout::default()
            };
            assert_eq!(r.max_surge_for(total, unset), want, "{surge:?}, stand-in {unset}");
        }
    }

    #[test]
    fn timeouts_parse_with_defaults() {
        let cases = [
            // (joinTimeout, drainTimeout, want join seconds, want drain seconds)
            ("30m", None, 1800, None),
            ("1h30m", Some("90s"), 5400, Some(90)),
            ("10m", Some("2h"), 600, Some(7200)),
            ("soon", Some("later"), 1800, None),
        ];
        for (join, drain, want_join, want_drain) in cases {
            let r = Rollout {
                join_timeout: Some(join.to_string()),
                drain_timeout: drain.map(str::to_string),
                ..Rollout::default()
            };
            assert_eq!(r.join_timeout(), Duration::from_secs(want_join), "{join}");
            assert_eq!(
                r.drain_timeout(),
                want_drain.map(Duration::from_secs),
                "{drain:?}"
            );
        }
    }

    #[test]
    fn absent_fields_take_constellations_defaults() {
        let r: Rollout = serde_json::from_str("{}").expect("an empty rollout parses");
        assert!(r.is_unset());
        assert_eq!(r.max_surge_for(10, 1), 1);
        assert_eq!(r.max_unavailable_for(10), 0);
        assert!(r.control_plane_first());
        assert_eq!(r.join_timeout(), Duration::from_secs(1800));
        assert_eq!(r.drain_timeout(), None);
        assert_eq!(serde_json::to_string(&r).expect("serializes"), "{}");
        let r: Rollout = serde_json::from_str(r#"{"maxSurge": "25%", "maxUnavailable": 2}"#).expect("parses");
        assert_eq!((r.max_surge, r.max_unavailable), (Some(pct("25%")), Some(int(2))));
    }

    #[test]
    fn the_nodeversions_fields_override_the_operators_one_by_one() {
        let operator = Rollout {
            max_surge: Some(int(3)),
            join_timeout: Some("10m".into()),
            control_plane_first: Some(false),
            ..Rollout::default()
        };
        let own = Rollout {
            max_surge: Some(pct("50%")),
            max_unavailable: Some(int(1)),
            ..Rollout::default()
        };
        let in_force = own.over(&operator);
        assert_eq!(in_force.max_surge, Some(pct("50%")));
        assert_eq!(in_force.max_unavailable, Some(int(1)));
        assert_eq!(in_force.join_timeout.as_deref(), Some("10m"));
        assert_eq!(in_force.control_plane_first, Some(false));
        // Written back without `rollout`: the operator's settings, not 1.
        assert_eq!(Rollout::default().over(&operator).max_surge_for(10, 1), 3);
        let described = Rollout::describe(&own, &operator);
        let want = [
            ("maxSurge", "50%", SettingSource::NodeVersion),
            ("maxUnavailable", "1", SettingSource::NodeVersion),
            ("controlPlaneFirst", "false", SettingSource::Operator),
            ("joinTimeout", "10m", SettingSource::Operator),
            ("drainTimeout", "none", SettingSource::Builtin),
            ("haltAfterFailedJoins", "3", SettingSource::Builtin),
            ("haltAfterUnreadyPods", "3", SettingSource::Builtin),
            ("podReadyTimeout", "5m", SettingSource::Builtin),
            ("waves", "none", SettingSource::Builtin),
            ("soakTime", "none", SettingSource::Builtin),
            ("topologyKey", "none", SettingSource::Builtin),
        ];
        let got: Vec<(&str, &str, SettingSource)> =
            described.iter().map(|(k, v, s)| (*k, v.as_str(), *s)).collect();
        assert_eq!(got, want);
    }
}
