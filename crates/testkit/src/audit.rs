//! The API server's audit log (see cluster.sh's policy: every write by
//! nodewarden's ServiceAccount, Lease bodies included) read back to check that
//! no replica wrote anything outside its lease term.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::Value;

/// One write request, as the API server received it.
#[derive(Clone, Debug)]
pub struct AuditedWrite {
    /// When the API server received it.
    pub at: Timestamp,
    /// The id of the token that made it (`JTI=…` without the prefix).
    pub token_id: String,
    pub verb: String,
    /// `resource[/subresource] namespace/name`, for messages.
    pub target: String,
    pub code: i64,
    /// For a write of a Lease: the holder it names ("" releases it).
    pub lease: Option<(String, String, String)>,
}

/// Every write the audit log recorded at or after `since`. Events of other
/// users are not in the log (the policy records none).
pub fn writes_since(log: &Path, since: Timestamp) -> Vec<AuditedWrite> {
    let text = std::fs::read_to_string(log).unwrap_or_else(|e| panic!("reading {}: {e}", log.display()));
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|e| parse(&e))
        .filter(|w| w.at >= since)
        .collect()
}

fn parse(event: &Value) -> Option<AuditedWrite> {
    let at: Timestamp = event["requestReceivedTimestamp"].as_str()?.parse().ok()?;
    let token_id = event["user"]["extra"]["authentication.kubernetes.io/credential-id"]
        .as_array()?
        .iter()
        .filter_map(|v| v.as_str())
        .find_map(|v| v.strip_prefix("JTI="))?
        .to_string();
    let object = &event["objectRef"];
    let field = |k: &str| object[k].as_str().unwrap_or_default().to_string();
    let resource = match object["subresource"].as_str() {
        Some(sub) => format!("{}/{sub}", field("resource")),
        None => field("resource"),
    };
    let lease = (field("resource") == "leases").then(|| {
        let holder = event["requestObject"]["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        (field("namespace"), field("name"), holder)
    });
    Some(AuditedWrite {
        at,
        token_id,
        verb: event["verb"].as_str().unwrap_or_default().to_string(),
        target: format!("{resource} {}/{}", field("namespace"), field("name")),
        code: event["responseStatus"]["code"].as_i64().unwrap_or_default(),
        lease,
    })
}

/// What the lease-term check found.
#[derive(Debug, Default)]
pub struct TermCheck {
    /// Writes by a replica outside its term, described.
    pub breaches: Vec<String>,
    /// Writes checked (the election Lease's own excluded), by replica.
    pub checked: BTreeMap<String, usize>,
    /// Terms seen: who took the election Lease, in order.
    pub terms: Vec<String>,
}

/// Checks every write by a replica (known by its token id in `replicas`)
/// against the terms of the election Lease `namespace/name`: a replica's term
/// starts with a successful write of the Lease naming it, and ends
/// `lease_duration` after its last successful renewal or at once when
/// another replica takes the Lease or it releases it. A write received
/// outside the writer's term is a breach — whatever its answer, as a stale
/// leader trying to act is the fault. The election Lease's own writes are
/// the election itself and are not judged.
pub fn writes_outside_terms(
    writes: &[AuditedWrite],
    replicas: &BTreeMap<String, String>,
    (namespace, name): (&str, &str),
    lease_duration: Duration,
) -> TermCheck {
    let mut sorted: Vec<&AuditedWrite> = writes
        .iter()
        .filter(|w| replicas.contains_key(&w.token_id))
        .collect();
    sorted.sort_by_key(|w| w.at);
    let duration = SignedDuration::try_from(lease_duration).expect("a lease duration");
    let mut check = TermCheck::default();
    // The holder of the last successful election write and when it was made.
    let mut current: Option<(String, Timestamp)> = None;
    for w in sorted {
        let who = &replicas[&w.token_id];
        if let Some((ns, n, holder)) = &w.lease
            && ns == namespace
            && n == name
        {
            if (200..300).contains(&w.code) {
                if current.as_ref().is_none_or(|(h, _)| h != holder) && !holder.is_empty() {
                    check.terms.push(holder.clone());
                }
                current = Some((holder.clone(), w.at));
            }
            continue;
        }
        *check.checked.entry(who.clone()).or_default() += 1;
        let in_term = match &current {
            Some((holder, renewed)) => holder == who && w.at.duration_since(*renewed) <= duration,
            None => false,
        };
        if !in_term {
            let state = match &current {
                Some((holder, renewed)) => format!(
                    "the Lease was last written for {holder:?} {:.3}s before",
                    w.at.duration_since(*renewed).as_secs_f64()
                ),
                None => "before any replica took the Lease".to_string(),
            };
            check.breaches.push(format!(
                "{who} wrote {} {} (answer {}) at {} — {state}",
                w.verb, w.target, w.code, w.at
            ));
        }
    }
    check
}
