//! Property tests of the NodeMaintenance decisions: who keeps a node when
//! several maintenances claim it (`controllers::node_maintenance::decide`),
//! and the webhook's etcd quorum rule (`admission::rules`), over random
//! claims and random control planes.

use std::collections::BTreeSet;

use k8s_openapi::jiff::Timestamp;
use nodewarden::admission::rules::{ControlPlane, MaintenanceCreate, maintenance_create, quorum};
use nodewarden::controllers::node_maintenance::{Claim, Decision, Facts, decide};
use proptest::prelude::*;

/// Claims on one node: distinct owners and UIDs, creation times within a
/// few seconds (so ties in the one-second resolution are common), at most
/// one of them active (only one can have entered maintenance), some being
/// deleted.
fn claims() -> impl Strategy<Value = Vec<Claim>> {
    prop::collection::vec((0i64..3, any::<u16>(), any::<bool>(), 0u8..8), 1..6).prop_map(|raw| {
        let mut seen_uids = BTreeSet::new();
        let mut active_given = false;
        raw.into_iter()
            .enumerate()
            .filter(|(_, (_, uid, _, _))| seen_uids.insert(*uid))
            .map(|(i, (second, uid, deleting, activity))| {
                let active = activity == 0 && !active_given;
                active_given |= active;
                Claim {
                    owner: format!(
                        "{}/m{i}",
                        if i % 2 == 0 {
                            "nodemaintenance.medik8s.io"
                        } else {
                            "nodemaintenance.kubevirt.io"
                        }
                    ),
                    created: Timestamp::from_second(1_700_000_000 + second).ok(),
                    uid: Some(format!("{uid:05}")),
                    deleting,
                    active,
                }
            })
            .collect()
    })
}

fn decision(me: &Claim, others: &[Claim]) -> Decision {
    decide(&Facts {
        me,
        owner: &me.owner,
        node_name: "worker-1",
        node_exists: true,
        others,
        drain_timeout: None,
        admitted: true,
        lease: None,
        failed_as_duplicate: None,
        holder: None,
    })
}

/// Each claim not being deleted decides, seeing all the others.
fn drainers(claims: &[Claim]) -> Vec<String> {
    claims
        .iter()
        .filter(|c| !c.deleting)
        .filter(|me| {
            let others: Vec<Claim> = claims.iter().filter(|c| c.owner != me.owner).cloned().collect();
            decision(me, &others) == Decision::Drain
        })
        .map(|c| c.owner.clone())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    /// Exactly one live claim drains the node: the active one if any, else
    /// the earliest created, else the smallest UID; never chosen by name,
    /// and the same whatever order the claims are seen in.
    #[test]
    fn exactly_one_claim_keeps_the_node(claims in claims(), rotate in 0usize..6) {
        let live: Vec<&Claim> = claims.iter().filter(|c| !c.deleting).collect();
        let winners = drainers(&claims);
        if live.is_empty() {
            prop_assert!(winners.is_empty());
            return Ok(());
        }
        prop_assert_eq!(winners.len(), 1, "claims {:?} → drainers {:?}", &claims, &winners);
        let expected = live
            .iter()
            .min_by_key(|c| (!c.active, c.created, c.uid.clone()))
            .map(|c| c.owner.clone());
        prop_assert_eq!(Some(&winners[0]), expected.as_ref());

        // The order the claims are listed in changes nothing.
        let mut rotated = claims.clone();
        rotated.rotate_left(rotate % claims.len());
        prop_assert_eq!(drainers(&rotated), winners.clone());

        // Nor do the names: swapping names between claims moves the win
        // with the claim, not with the name.
        let mut renamed = claims.clone();
        let names: Vec<String> = renamed.iter().map(|c| c.owner.clone()).rev().collect();
        for (c, n) in renamed.iter_mut().zip(&names) {
            c.owner = n.clone();
        }
        let winner_index = claims.iter().position(|c| c.owner == winners[0]);
        let renamed_winner = winner_index.map(|i| renamed[i].owner.clone());
        prop_assert_eq!(drainers(&renamed).first().cloned(), renamed_winner);
    }

    /// Admitting control-plane maintenances one after another, in any
    /// order, never leaves fewer Ready control-plane nodes out of
    /// maintenance than etcd's quorum, and refuses only when it would.
    #[test]
    fn admission_never_breaks_etcd_quorum(
        members in 1usize..8,
        not_ready in prop::collection::vec(any::<bool>(), 8),
        order in Just((0usize..8).collect::<Vec<_>>()).prop_shuffle(),
    ) {
        let nodes: BTreeSet<String> = (0..members).map(|i| format!("cp-{i}")).collect();
        let mut available: BTreeSet<String> =
            (0..members).filter(|&i| !not_ready[i]).map(|i| format!("cp-{i}")).collect();
        let mut in_maintenance: Vec<String> = Vec::new();
        for i in order.into_iter().filter(|&i| i < members) {
            let node = format!("cp-{i}");
            let etcd = nodes.iter().map(|n| (n.clone(), format!("static pod kube-system/etcd-{n}"))).collect();
            let cp = ControlPlane { members: etcd, available: available.clone() };
            let verdict = maintenance_create(&MaintenanceCreate {
                node_name: &node,
                requester: Default::default(),
                node_exists: true,
                existing: &[],
                control_plane: Some(&cp),
            });
            let left = available.iter().filter(|n| **n != node).count();
            match verdict {
                Ok(()) => {
                    prop_assert!(left >= quorum(members), "admitted {node}: {left} left of {members}");
                    available.remove(&node);
                    in_maintenance.push(node);
                }
                Err(message) => {
                    prop_assert!(left < quorum(members), "refused {node} with {left} left: {message}");
                    prop_assert!(message.contains("etcd needs more than half"), "{message}");
                }
            }
            prop_assert!(available.len() >= quorum(members) || in_maintenance.is_empty());
        }
    }
}
