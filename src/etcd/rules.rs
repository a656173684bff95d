//! Which etcd member goes with a retired control-plane node, and whether
//! removing it now is safe. Pure: the members and their health come in as
//! arguments (see [`super::client`] for how they are read).
//!
//! A member is the node's when one of its peer URLs has the node's
//! InternalIP as host (as Constellation matches them; the port and scheme
//! do not matter). Learners carry no vote: they neither count for quorum
//! nor need to be healthy.
//!
//! A replaced node's member goes only once its heir has one: otherwise each
//! replacement whose join has not added the heir's member yet would shrink
//! the cluster, and a rollout of three would end on a single member.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

/// One etcd member as the member list shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Member {
    /// Its ID (never reused by etcd).
    pub id: u64,
    /// Its name; empty until the member started (added, not yet joined).
    pub name: String,
    /// Where its peers reach it.
    pub peer_urls: Vec<String>,
    /// Where clients reach it; empty until it started.
    pub client_urls: Vec<String>,
    /// A non-voting member.
    pub is_learner: bool,
}

impl Member {
    /// How messages name it: its name (or "unstarted") and its ID in hex,
    /// as `etcdctl member list` shows IDs.
    pub fn label(&self) -> String {
        let name = if self.name.is_empty() {
            "unstarted member"
        } else {
            self.name.as_str()
        };
        match self.peer_urls.first() {
            Some(url) => format!("{name} ({:x}, {url})", self.id),
            None => format!("{name} ({:x})", self.id),
        }
    }

    /// Whether one of its peer URLs is on `ip`.
    pub fn is_on(&self, ip: IpAddr) -> bool {
        self.peer_urls.iter().any(|u| url_ip(u) == Some(ip))
    }
}

/// The IP a URL's host names (None: a DNS name, or not a URL).
pub fn url_ip(url: &str) -> Option<IpAddr> {
    let uri: http::Uri = url.parse().ok()?;
    let host = uri.host()?;
    host.trim_start_matches('[').trim_end_matches(']').parse().ok()
}

/// What a health check of one member found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Health {
    /// It answered that it is healthy.
    Healthy,
    /// It did not, for this reason.
    Unhealthy(String),
}

/// Why a member cannot be removed now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blocked {
    /// Members that would remain are unhealthy: (member, why).
    Unhealthy(Vec<(String, String)>),
    /// It is the only voting member: removing it would end the cluster.
    LastMember(String),
    /// Several members have a peer URL on the node's IP: which one is the
    /// node's cannot be told.
    Ambiguous(Vec<String>),
    /// The node's heir (on this IP) has no etcd member yet.
    NoHeirMember(IpAddr),
    /// The healthy voting members left would be fewer than the quorum of
    /// the smaller cluster.
    Quorum {
        /// Healthy voting members after the removal.
        healthy: usize,
        /// Voting members after the removal.
        voters: usize,
        /// The unhealthy ones: (member, why).
        unhealthy: Vec<(String, String)>,
    },
}

impl fmt::Display for Blocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Blocked::Unhealthy(members) => write!(f, "etcd member(s) unhealthy: {}", listed(members)),
            Blocked::LastMember(m) => write!(f, "{m} is etcd's only voting member"),
            Blocked::NoHeirMember(ip) => write!(
                f,
                "the replacement node ({ip}) has no etcd member yet (its join adds one)"
            ),
            Blocked::Ambiguous(ms) => write!(f, "several etcd members on the node's IP: {}", ms.join(", ")),
            Blocked::Quorum {
                healthy,
                voters,
                unhealthy,
            } => write!(
                f,
                "only {healthy} of {voters} remaining etcd voting members would be healthy, below quorum {}; unhealthy: {}",
                quorum(*voters),
                listed(unhealthy)
            ),
        }
    }
}

/// "member: why; member: why".
fn listed(members: &[(String, String)]) -> String {
    let list: Vec<String> = members.iter().map(|(m, why)| format!("{m}: {why}")).collect();
    list.join("; ")
}

/// What to do with the etcd member of a node being retired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Remove this member now.
    Remove(Member),
    /// No member has a peer URL on the node's IP: etcd runs elsewhere
    /// (external etcd), or the member was removed already. Nothing to do.
    NoMember,
    /// Not now (the node's retirement waits).
    Wait(Blocked),
}

/// The quorum of `voters` voting members.
pub fn quorum(voters: usize) -> usize {
    voters / 2 + 1
}

/// The members whose health decides: the voting members not on `ip`.
pub fn to_check(ip: IpAddr, members: &[Member]) -> Vec<&Member> {
    members.iter().filter(|m| !m.is_learner && !m.is_on(ip)).collect()
}

/// What to do with the member of the node at `ip` (replaced by the node at
/// `heir`, if any), given the member list and the health of the members
/// [`to_check`] names (one missing counts as unhealthy). Removal only while
/// every voting member that remains is healthy, at least one remains,
/// quorum holds after it, and the heir has its member.
pub fn decide(
    ip: IpAddr,
    heir: Option<IpAddr>,
    members: &[Member],
    health: &BTreeMap<u64, Health>,
) -> Decision {
    let on_node: Vec<&Member> = members.iter().filter(|m| m.is_on(ip)).collect();
    let target = match on_node.as_slice() {
        [] => return Decision::NoMember,
        [one] => *one,
        several => return Decision::Wait(Blocked::Ambiguous(several.iter().map(|m| m.label()).collect())),
    };
    // A learner has no vote: its removal changes no quorum.
    if target.is_learner {
        return Decision::Remove(target.clone());
    }
    let remaining = to_check(ip, members);
    if remaining.is_empty() {
        return Decision::Wait(Blocked::LastMember(target.label()));
    }
    let unhealthy: Vec<(String, String)> = remaining
        .iter()
        .filter_map(|m| match health.get(&m.id) {
            Some(Health::Healthy) => None,
            Some(Health::Unhealthy(why)) => Some((m.label(), why.clone())),
            None => Some((m.label(), "not checked".to_string())),
        })
        .collect();
    let healthy = remaining.len() - unhealthy.len();
    if healthy < quorum(remaining.len()) {
        return Decision::Wait(Blocked::Quorum {
            healthy,
            voters: remaining.len(),
            unhealthy,
        });
    }
    if !unhealthy.is_empty() {
        return Decision::Wait(Blocked::Unhealthy(unhealthy));
    }
    if let Some(heir) = heir
        && !members.iter().any(|m| m.is_on(heir))
    {
        return Decision::Wait(Blocked::NoHeirMember(heir));
    }
    Decision::Remove(target.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u64, name: &str, ip: &str) -> Member {
        Member {
            id,
            name: name.into(),
            peer_urls: vec![format!("https://{ip}:2380")],
            client_urls: vec![format!("https://{ip}:2379")],
            is_learner: false,
        }
    }

    fn learner(id: u64, name: &str, ip: &str) -> Member {
        Member {
            is_learner: true,
            ..member(id, name, ip)
        }
    }

    fn unstarted(id: u64, ip: &str) -> Member {
        Member {
            id,
            peer_urls: vec![format!("https://{ip}:2380")],
            ..Default::default()
        }
    }

    #[test]
    fn peer_urls_match_by_ip_whatever_the_scheme_or_port() {
        let ip: IpAddr = "10.0.0.2".parse().expect("an IP");
        let m = |url: &str| Member {
            peer_urls: vec![url.into()],
            ..Default::default()
        };
        assert!(m("https://10.0.0.2:2380").is_on(ip));
        assert!(m("http://10.0.0.2:12380").is_on(ip));
        assert!(!m("https://10.0.0.20:2380").is_on(ip));
        assert!(!m("https://etcd-0.example:2380").is_on(ip));
        assert!(!m("not a url").is_on(ip));
        let v6: IpAddr = "fd00::2".parse().expect("an IP");
        assert!(m("https://[fd00::2]:2380").is_on(v6));
    }

    #[test]
    fn a_member_is_removed_only_while_the_rest_is_healthy_and_keeps_quorum() {
        use Health::*;
        let ip: IpAddr = "10.0.0.2".parse().expect("an IP");
        let (a, b, c, d) = (
            member(0xa, "a", "10.0.0.2"),
            member(0xb, "b", "10.0.0.3"),
            member(0xc, "c", "10.0.0.4"),
            member(0xd, "d", "10.0.0.5"),
        );
        let sick = || Unhealthy("no answer".into());
        let health =
            |entries: &[(u64, Health)]| -> BTreeMap<u64, Health> { entries.iter().cloned().collect() };
        let all_well = health(&[(0xb, Healthy), (0xc, Healthy), (0xd, Healthy)]);
        let heir: Option<IpAddr> = "10.0.0.5".parse().ok();
        // (what, members, health, decision); the heir is d (10.0.0.5) unless the case says.
        type Case = (&'static str, Vec<Member>, BTreeMap<u64, Health>, Decision);
        let cases: Vec<Case> = vec![
            (
                "the heir has no member yet: wait for its join",
                vec![a.clone(), b.clone(), c.clone()],
                all_well.clone(),
                Decision::Wait(Blocked::NoHeirMember("10.0.0.5".parse().expect("an IP"))),
            ),
            (
                "a replacement joined: 4 members, the rest healthy",
                vec![a.clone(), b.clone(), c.clone(), d.clone()],
                all_well.clone(),
                Decision::Remove(a.clone()),
            ),
            (
                "the node's own member is down: removing it is what helps",
                vec![a.clone(), b.clone(), c.clone(), d.clone()],
                health(&[(0xa, sick()), (0xb, Healthy), (0xc, Healthy), (0xd, Healthy)]),
                Decision::Remove(a.clone()),
            ),
            (
                "another member is down: wait, naming it",
                vec![a.clone(), b.clone(), c.clone(), d.clone()],
                health(&[(0xb, Healthy), (0xc, sick()), (0xd, Healthy)]),
                Decision::Wait(Blocked::Unhealthy(vec![(c.label(), "no answer".into())])),
            ),
            (
                "a member not checked counts as unhealthy",
                vec![a.clone(), b.clone(), c.clone(), d.clone()],
                health(&[(0xb, Healthy), (0xd, Healthy)]),
                Decision::Wait(Blocked::Unhealthy(vec![(c.label(), "not checked".into())])),
            ),
            (
                "a member added but not started yet is not healthy",
                vec![a.clone(), b.clone(), c.clone(), unstarted(0xe, "10.0.0.6")],
                health(&[
                    (0xb, Healthy),
                    (0xc, Healthy),
                    (0xe, Unhealthy("not started".into())),
                ]),
                Decision::Wait(Blocked::Unhealthy(vec![(
                    unstarted(0xe, "10.0.0.6").label(),
                    "not started".into(),
                )])),
            ),
            (
                "two of three remaining down: quorum would be lost",
                vec![a.clone(), b.clone(), c.clone(), d.clone()],
                health(&[(0xb, Healthy), (0xc, sick()), (0xd, sick())]),
                Decision::Wait(Blocked::Quorum {
                    healthy: 1,
                    voters: 3,
                    unhealthy: vec![(c.label(), "no answer".into()), (d.label(), "no answer".into())],
                }),
            ),
            (
                "the only member",
                vec![a.clone()],
                BTreeMap::new(),
                Decision::Wait(Blocked::LastMember(a.label())),
            ),
            (
                "no member on the node's IP: external etcd, or removed already",
                vec![b.clone(), c.clone(), d.clone()],
                all_well.clone(),
                Decision::NoMember,
            ),
            (
                "two members on the node's IP",
                vec![a.clone(), member(0xf, "a2", "10.0.0.2"), b.clone()],
                all_well.clone(),
                Decision::Wait(Blocked::Ambiguous(vec![
                    a.label(),
                    member(0xf, "a2", "10.0.0.2").label(),
                ])),
            ),
            (
                "a learner on the node goes whatever the rest's health",
                vec![learner(0xa, "a", "10.0.0.2"), b.clone(), c.clone()],
                health(&[(0xb, sick()), (0xc, sick())]),
                Decision::Remove(learner(0xa, "a", "10.0.0.2")),
            ),
            (
                "a sick learner elsewhere does not block",
                vec![
                    a.clone(),
                    b.clone(),
                    c.clone(),
                    d.clone(),
                    learner(0xe, "e", "10.0.0.6"),
                ],
                all_well.clone(),
                Decision::Remove(a.clone()),
            ),
        ];
        for (what, members, health, want) in cases {
            assert_eq!(decide(ip, heir, &members, &health), want, "{what}");
        }
        // A node without an heir (a surplus node) needs none.
        let members = [a.clone(), b.clone(), c.clone()];
        assert_eq!(decide(ip, None, &members, &all_well), Decision::Remove(a.clone()));
    }

    #[test]
    fn only_remaining_voters_are_checked() {
        let ip: IpAddr = "10.0.0.2".parse().expect("an IP");
        let members = [
            member(1, "a", "10.0.0.2"),
            member(2, "b", "10.0.0.3"),
            learner(3, "c", "10.0.0.4"),
        ];
        let ids: Vec<u64> = to_check(ip, &members).iter().map(|m| m.id).collect();
        assert_eq!(ids, vec![2]);
    }

    #[test]
    fn reasons_name_the_members() {
        let blocked = Blocked::Unhealthy(vec![("c (c, https://10.0.0.4:2380)".into(), "no answer".into())]);
        assert_eq!(
            blocked.to_string(),
            "etcd member(s) unhealthy: c (c, https://10.0.0.4:2380): no answer"
        );
        let quorum_lost = Blocked::Quorum {
            healthy: 1,
            voters: 3,
            unhealthy: vec![("b".into(), "down".into()), ("c".into(), "down".into())],
        };
        assert_eq!(
            quorum_lost.to_string(),
            "only 1 of 3 remaining etcd voting members would be healthy, below quorum 2; unhealthy: b: down; c: down"
        );
        assert_eq!(
            unstarted(0x1f, "10.0.0.9").label(),
            "unstarted member (1f, https://10.0.0.9:2380)"
        );
    }
}
