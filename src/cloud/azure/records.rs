//! Creates keyed by the caller's request ID, on a cloud whose create is
//! "capacity + 1". A scale set's VMs get instance IDs that only grow, so a
//! create is recorded in the scale set's own tags, in the same etag-guarded
//! PATCH that raises the capacity: `nodewarden-create-<key>` =
//! `pending:<seq>:<highest instance ID before>:<unix time>`. The first new
//! VM above that ID, in the order the creates were made, is the create's;
//! once seen it is claimed (`vm:<instance ID>:<unix time>`). A create asked again after
//! a lost answer finds its record and raises nothing; two creates at once
//! are serialized by the etag (`If-Match`), as is a create against a
//! delete: no capacity change computed from a stale read can land.
//!
//! ARM allows 50 tags on a resource, so records do not outlive their use: a
//! claim goes when its VM does or after [`CLAIM_KEEP_SECS`] (its create has
//! long returned: a PendingNode's join times out well before), and beyond
//! [`MAX_RECORDS`] the oldest claims go first.
//!
//! Everything here is pure: tags and instance IDs in, tags out.

use std::collections::BTreeMap;

/// Tag names of create records start with this.
pub const PREFIX: &str = "nodewarden-create-";
/// The tag counting creates, to order pending ones.
pub const SEQUENCE: &str = "nodewarden-create-seq";
/// How long a pending create may wait for its VM before it is given up
/// (a scale-out the scale set never carried out, e.g. for quota).
pub const PENDING_LIMIT_SECS: u64 = 15 * 60;
/// How long a claim is kept for a create asked again.
pub const CLAIM_KEEP_SECS: u64 = 30 * 60;
/// The most create records a scale set's tags hold (ARM allows 50 tags;
/// the cluster's own take three, the sequence one).
pub const MAX_RECORDS: usize = 40;

/// One create's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// The capacity was raised; its VM not yet seen.
    Pending {
        /// Its place among creates.
        seq: u64,
        /// The highest instance ID when it was made.
        after: u64,
        /// When it was made (unix seconds).
        since: u64,
    },
    /// Its VM, claimed at `since` (unix seconds).
    Claimed {
        /// The VM's instance ID.
        id: u64,
        /// When it was claimed.
        since: u64,
    },
}

impl Record {
    fn parse(value: &str) -> Option<Record> {
        let parts: Vec<&str> = value.split(':').collect();
        match parts.as_slice() {
            ["vm", id, since] => Some(Record::Claimed {
                id: id.parse().ok()?,
                since: since.parse().ok()?,
            }),
            ["pending", seq, after, since] => Some(Record::Pending {
                seq: seq.parse().ok()?,
                after: after.parse().ok()?,
                since: since.parse().ok()?,
            }),
            _ => None,
        }
    }

    fn value(&self) -> String {
        match self {
            Record::Pending { seq, after, since } => format!("pending:{seq}:{after}:{since}"),
            Record::Claimed { id, since } => format!("vm:{id}:{since}"),
        }
    }
}

/// The tag name of `key`'s record: characters ARM refuses in tag names
/// (`<>%&\?/`) replaced, at most 512 characters.
pub fn tag_name(key: &str) -> String {
    let clean: String = key
        .chars()
        .map(|c| if "<>%&\\?/".contains(c) { '-' } else { c })
        .collect();
    format!("{PREFIX}{clean}").chars().take(512).collect()
}

/// What a create does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Its VM is known and claimed: done.
    Done(u64),
    /// Write these tags (claims made, records given up); then done with
    /// the VM, when one is given, else look again.
    WriteTags {
        /// The scale set's whole new tag map.
        tags: BTreeMap<String, String>,
        /// The VM now claimed for this create.
        claimed: Option<u64>,
    },
    /// Raise the capacity by one with these tags.
    ScaleOut {
        /// The scale set's whole new tag map.
        tags: BTreeMap<String, String>,
    },
    /// Its scale-out is made and its VM not seen yet: look again.
    Wait,
}

/// The next step of the create keyed `key`, given the scale set's `tags`,
/// the instance IDs of its VMs now and the time (unix seconds).
pub fn next_step(key: &str, tags: &BTreeMap<String, String>, vms: &[u64], now: u64) -> Step {
    let name = tag_name(key);
    let mut records = records(tags);
    // Claims whose VM is gone or whose create has long returned, and
    // creates never carried out, are dropped.
    records.retain(|_, r| match r {
        Record::Claimed { id, since } => vms.contains(id) && now.saturating_sub(*since) < CLAIM_KEEP_SECS,
        Record::Pending { since, .. } => now.saturating_sub(*since) < PENDING_LIMIT_SECS,
    });
    let claims = assign(&records, vms);
    for (tag, id) in &claims {
        records.insert(tag.clone(), Record::Claimed { id: *id, since: now });
    }
    drop_oldest_claims(&mut records, MAX_RECORDS - 1);
    let changed = with_records(tags, &records) != *tags;
    match records.get(&name) {
        Some(Record::Claimed { id, .. }) if !changed => Step::Done(*id),
        Some(Record::Claimed { id, .. }) => Step::WriteTags {
            tags: with_records(tags, &records),
            claimed: Some(*id),
        },
        Some(Record::Pending { .. }) if changed => Step::WriteTags {
            tags: with_records(tags, &records),
            claimed: None,
        },
        Some(Record::Pending { .. }) => Step::Wait,
        None => {
            let seq = tags
                .get(SEQUENCE)
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(0)
                + 1;
            let after = highest(&records, vms);
            records.insert(
                name,
                Record::Pending {
                    seq,
                    after,
                    since: now,
                },
            );
            let mut tags = with_records(tags, &records);
            tags.insert(SEQUENCE.into(), seq.to_string());
            Step::ScaleOut { tags }
        }
    }
}

/// The create records among `tags` (malformed ones are left as they are).
fn records(tags: &BTreeMap<String, String>) -> BTreeMap<String, Record> {
    tags.iter()
        .filter(|(k, _)| k.starts_with(PREFIX) && k.as_str() != SEQUENCE)
        .filter_map(|(k, v)| Some((k.clone(), Record::parse(v)?)))
        .collect()
}

/// `tags` with its create records replaced by `records`.
fn with_records(
    tags: &BTreeMap<String, String>,
    records: &BTreeMap<String, Record>,
) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = tags
        .iter()
        .filter(|(k, v)| !(k.starts_with(PREFIX) && k.as_str() != SEQUENCE && Record::parse(v).is_some()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    out.extend(records.iter().map(|(k, r)| (k.clone(), r.value())));
    out
}

/// Drops the oldest claims until at most `keep` records are left (pending
/// creates are never dropped: their VMs are still to be found).
fn drop_oldest_claims(records: &mut BTreeMap<String, Record>, keep: usize) {
    let mut claims: Vec<(u64, String)> = records
        .iter()
        .filter_map(|(k, r)| match r {
            Record::Claimed { since, .. } => Some((*since, k.clone())),
            Record::Pending { .. } => None,
        })
        .collect();
    claims.sort();
    let excess = records.len().saturating_sub(keep);
    for (_, tag) in claims.into_iter().take(excess) {
        records.remove(&tag);
    }
}

/// The highest instance ID seen or recorded: a new create's VM is above it.
fn highest(records: &BTreeMap<String, Record>, vms: &[u64]) -> u64 {
    let recorded = records.values().map(|r| match r {
        Record::Claimed { id, .. } => *id,
        Record::Pending { after, .. } => *after,
    });
    vms.iter().copied().chain(recorded).max().unwrap_or(0)
}

/// New VMs matched to pending creates: in the creates' order, each takes
/// the lowest unclaimed VM above its `after` — instance IDs grow in the
/// order the scale-outs were made.
fn assign(records: &BTreeMap<String, Record>, vms: &[u64]) -> Vec<(String, u64)> {
    let mut taken: Vec<u64> = records
        .values()
        .filter_map(|r| match r {
            Record::Claimed { id, .. } => Some(*id),
            Record::Pending { .. } => None,
        })
        .collect();
    let mut pending: Vec<(u64, u64, &String)> = records
        .iter()
        .filter_map(|(k, r)| match r {
            Record::Pending { seq, after, .. } => Some((*seq, *after, k)),
            Record::Claimed { .. } => None,
        })
        .collect();
    pending.sort();
    let mut sorted = vms.to_vec();
    sorted.sort_unstable();
    let mut claims = Vec::new();
    for (_, after, tag) in pending {
        let Some(id) = sorted
            .iter()
            .copied()
            .find(|id| *id > after && !taken.contains(id))
        else {
            break; // A later create's VM cannot come before this one's.
        };
        taken.push(id);
        claims.push((tag.clone(), id));
    }
    claims
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const UID: (&str, &str) = ("constellation-uid", "u");

    #[test]
    fn a_create_raises_the_capacity_once_and_claims_the_first_new_vm() {
        let now = 1000;
        // First ask: scale out, recorded above the highest VM (4).
        let start = tags(&[UID]);
        let Step::ScaleOut { tags: after_out } = next_step("a", &start, &[3, 4], now) else {
            panic!("a scale-out");
        };
        assert_eq!(
            after_out,
            tags(&[UID, ("nodewarden-create-a", "pending:1:4:1000"), (SEQUENCE, "1")])
        );
        // Asked again before its VM shows: wait, raise nothing.
        assert_eq!(next_step("a", &after_out, &[3, 4], now + 5), Step::Wait);
        // VM 5 shows: claimed.
        let Step::WriteTags {
            tags: claimed,
            claimed: Some(5),
        } = next_step("a", &after_out, &[3, 4, 5], now + 9)
        else {
            panic!("a claim");
        };
        assert_eq!(
            claimed.get("nodewarden-create-a").map(String::as_str),
            Some("vm:5:1009")
        );
        assert_eq!(next_step("a", &claimed, &[3, 4, 5], now + 10), Step::Done(5));
        // Its VM deleted: the record goes with the next create's write, and
        // a create under the same key starts anew.
        let Step::ScaleOut { tags: again } = next_step("a", &claimed, &[3, 4], now + 20) else {
            panic!("a new scale-out");
        };
        assert_eq!(
            again.get("nodewarden-create-a").map(String::as_str),
            Some("pending:2:4:1020")
        );
    }

    #[test]
    fn creates_made_at_once_get_their_vms_in_their_order() {
        // b was made before a's VM showed, so both record 4.
        let start = tags(&[
            UID,
            ("nodewarden-create-a", "pending:1:4:100"),
            ("nodewarden-create-b", "pending:2:4:101"),
            (SEQUENCE, "2"),
        ]);
        assert_eq!(next_step("b", &start, &[4], 110), Step::Wait);
        // Only the first new VM: it is a's, b still waits (a's claim is written).
        let Step::WriteTags {
            tags: one,
            claimed: None,
        } = next_step("b", &start, &[4, 5], 110)
        else {
            panic!("a's claim written by b's create");
        };
        assert_eq!(
            one.get("nodewarden-create-a").map(String::as_str),
            Some("vm:5:110")
        );
        assert_eq!(next_step("a", &one, &[4, 5], 111), Step::Done(5));
        let Step::WriteTags { claimed: Some(6), .. } = next_step("b", &one, &[4, 5, 6], 112) else {
            panic!("b's VM");
        };
        // A create made later records above every claim and pending one.
        let Step::ScaleOut { tags: c } = next_step("c", &one, &[4, 5], 113) else {
            panic!("c's scale-out");
        };
        assert_eq!(
            c.get("nodewarden-create-c").map(String::as_str),
            Some("pending:3:5:113")
        );
    }

    #[test]
    fn a_scale_out_never_carried_out_is_given_up_after_the_limit() {
        let stale = tags(&[UID, ("nodewarden-create-a", "pending:1:4:0"), (SEQUENCE, "1")]);
        assert_eq!(next_step("a", &stale, &[4], PENDING_LIMIT_SECS - 1), Step::Wait);
        let Step::ScaleOut { tags: anew } = next_step("a", &stale, &[4], PENDING_LIMIT_SECS) else {
            panic!("a new scale-out");
        };
        assert_eq!(
            anew.get("nodewarden-create-a").map(String::as_str),
            Some(format!("pending:2:4:{PENDING_LIMIT_SECS}").as_str())
        );
        // Other tags, and malformed records, are kept as they are.
        let odd = tags(&[UID, ("nodewarden-create-x", "garbage")]);
        let Step::ScaleOut { tags: kept } = next_step("a", &odd, &[], 1) else {
            panic!("a scale-out");
        };
        assert_eq!(
            kept.get("nodewarden-create-x").map(String::as_str),
            Some("garbage")
        );
        assert_eq!(kept.get("constellation-uid").map(String::as_str), Some("u"));
    }

    #[test]
    fn claims_do_not_outlive_their_use_nor_fill_the_tags() {
        let claimed = tags(&[UID, ("nodewarden-create-a", "vm:5:100"), (SEQUENCE, "1")]);
        assert_eq!(
            next_step("a", &claimed, &[5], 100 + CLAIM_KEEP_SECS - 1),
            Step::Done(5)
        );
        let Step::ScaleOut { tags: later } = next_step("b", &claimed, &[5], 100 + CLAIM_KEEP_SECS) else {
            panic!("b's scale-out");
        };
        assert_eq!(later.get("nodewarden-create-a"), None, "an old claim dropped");
        // A scale set rolled far beyond the tag limit: the oldest claims go.
        let mut many = tags(&[UID]);
        for n in 0..60u64 {
            many.insert(format!("{PREFIX}k{n}"), format!("vm:{n}:{}", 1000 + n));
        }
        let vms: Vec<u64> = (0..60).collect();
        let Step::ScaleOut { tags: kept } = next_step("new", &many, &vms, 1100) else {
            panic!("a scale-out");
        };
        let records = kept
            .keys()
            .filter(|k| k.starts_with(PREFIX) && k.as_str() != SEQUENCE)
            .count();
        assert_eq!(records, MAX_RECORDS, "{kept:?}");
        assert!(kept.contains_key(&format!("{PREFIX}k59")) && !kept.contains_key(&format!("{PREFIX}k0")));
        assert!(kept.len() <= 50, "within ARM's tag limit: {}", kept.len());
    }

    #[test]
    fn tag_names_keep_to_what_arm_accepts() {
        assert_eq!(tag_name("a/b?c"), "nodewarden-create-a-b-c");
        assert_eq!(tag_name(&"k".repeat(600)).len(), 512);
    }
}
