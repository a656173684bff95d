//! Rollouts in waves (pure, table tested): `spec.rollout.waves` gives each
//! wave's size (a count or a percentage of the rollout's nodes; the last
//! size repeats until every node is done), e.g. `[1, "10%", "100%"]` for one
//! node, then a tenth, then the rest. A wave's replacements start only
//! once the wave before is finished, every node on the target is Ready, and
//! `soakTime` has passed since that moment.
//!
//! Nodes already on the target count as done, so a rollout that resumes
//! (or returns to an image most nodes still run) goes on from where it is.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{DrainState, Facts};
use crate::api::update::rollout::scaled_int_or_percent;
use crate::api::update::waves::WaveStatus;

/// Where the rollout's nodes stand, for waves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// The rollout's nodes (replacements in flight not counted twice).
    pub total: usize,
    /// Nodes on the target, no replacement in flight for them.
    pub done: usize,
    /// Replacements started and not finished.
    pub in_flight: usize,
    /// Every node on the target is Ready, and the workload pods on the
    /// target's new nodes too.
    pub all_ready: bool,
}

/// What waves allow now.
#[derive(Clone, Debug, PartialEq)]
pub struct Allowance {
    /// The record to keep (`status.wave`).
    pub status: WaveStatus,
    /// Replacements that may start now.
    pub starts: usize,
    /// When to look again (a soak that ends with no event to wake us).
    pub recheck: Option<Duration>,
}

/// Where `f`'s nodes stand: each node counted once (a replacement in
/// flight and the node it replaces are one), done when on the target.
pub fn progress(f: &Facts) -> Progress {
    let counts = super::counts(f);
    // Joined nodes beyond the rollout's own: mints, heirs whose donor is
    // still there, surplus nodes.
    let extra = counts.surge.saturating_sub(f.joins.len());
    let total = counts.nodes.saturating_sub(extra);
    let mints = f
        .nodes
        .iter()
        .filter(|n| n.joining && n.heir_of.is_none())
        .count();
    let started_outdated = f
        .nodes
        .iter()
        .filter(|n| !n.up_to_date && (n.donor_to.is_some() || n.drain != DrainState::None))
        .count();
    Progress {
        total,
        done: total.saturating_sub(counts.outdated),
        in_flight: f.joins.len() + mints + started_outdated,
        all_ready: f.unready_pods == 0 && f.nodes.iter().filter(|n| n.up_to_date).all(|n| n.ready),
    }
}

/// The cumulative end of each wave over `total` nodes: sizes rounded up
/// (a wave is at least one node), the last size repeated, the last end `total`.
pub fn ends(waves: &[IntOrString], total: usize) -> Vec<usize> {
    let sizes: Vec<usize> = waves
        .iter()
        .map(|w| scaled_int_or_percent(w, total, true).unwrap_or(total).max(1))
        .collect();
    let Some(&last) = sizes.last() else {
        return vec![total];
    };
    let mut out = Vec::new();
    let mut end = 0;
    for size in sizes.iter().copied().chain(std::iter::repeat(last)) {
        end = (end + size).min(total);
        out.push(end);
        if end >= total {
            break;
        }
    }
    out
}

/// What the waves `ends` allow for `target` now, given the record before.
pub fn allow(
    prev: Option<&WaveStatus>,
    target: &str,
    ends: &[usize],
    progress: Progress,
    soak: Duration,
    now: &Time,
) -> Allowance {
    let mut status = match prev {
        Some(p) if p.target == target => p.clone(),
        // A new target begins at the first wave it has not passed yet.
        _ => WaveStatus {
            target: target.to_string(),
            wave: ends
                .iter()
                .take(ends.len().saturating_sub(1))
                .take_while(|end| **end <= progress.done)
                .count() as u32,
            started_at: Some(MicroTime(now.0)),
            finished_at: None,
        },
    };
    let mut recheck = None;
    loop {
        let index = (status.wave as usize).min(ends.len().saturating_sub(1));
        let end = ends.get(index).copied().unwrap_or(progress.total);
        let last = index + 1 >= ends.len();
        if progress.done < end || progress.in_flight > 0 {
            status.finished_at = None;
            let starts = end.saturating_sub(progress.done + progress.in_flight);
            return Allowance {
                status,
                starts,
                recheck,
            };
        }
        // This wave is finished: the next starts once all is Ready and soaked.
        let finished = status.finished_at.get_or_insert(MicroTime(now.0)).clone();
        // The last one too (its end is the rollout's), with nothing after it.
        if last {
            return Allowance {
                status,
                starts: 0,
                recheck: None,
            };
        }
        let soaked = elapsed(&finished, now) >= soak;
        if !(progress.all_ready && soaked) {
            recheck = (!soaked).then(|| soak.saturating_sub(elapsed(&finished, now)));
            return Allowance {
                status,
                starts: 0,
                recheck,
            };
        }
        status.wave += 1;
        status.started_at = Some(MicroTime(now.0));
        status.finished_at = None;
    }
}

fn elapsed(since: &MicroTime, now: &Time) -> Duration {
    let secs = now.0.as_millisecond().saturating_sub(since.0.as_millisecond());
    Duration::from_millis(u64::try_from(secs).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).expect("a time"))
    }

    fn int(n: i32) -> IntOrString {
        IntOrString::Int(n)
    }

    fn pct(s: &str) -> IntOrString {
        IntOrString::String(s.into())
    }

    #[test]
    fn wave_ends_round_up_repeat_the_last_size_and_end_at_the_total() {
        let cases: [(Vec<IntOrString>, usize, Vec<usize>); 6] = [
            (vec![int(1), pct("10%"), pct("100%")], 30, vec![1, 4, 30]),
            (
                vec![int(1), pct("10%")],
                30,
                vec![1, 4, 7, 10, 13, 16, 19, 22, 25, 28, 30],
            ),
            (vec![int(2)], 5, vec![2, 4, 5]),
            (vec![pct("0%")], 3, vec![1, 2, 3]),
            (vec![int(10)], 4, vec![4]),
            (vec![], 4, vec![4]),
        ];
        for (waves, total, want) in cases {
            assert_eq!(ends(&waves, total), want, "{waves:?} over {total}");
        }
    }

    #[test]
    fn a_wave_starts_only_when_the_one_before_is_done_ready_and_soaked() {
        let ends = [1, 4, 10];
        let soak = Duration::from_secs(30);
        let wave = |wave: u32, started: i64, finished: Option<i64>| WaveStatus {
            target: "img".into(),
            wave,
            started_at: Some(MicroTime(at(started).0)),
            finished_at: finished.map(|s| MicroTime(at(s).0)),
        };
        let progress = |done, in_flight, all_ready| Progress {
            total: 10,
            done,
            in_flight,
            all_ready,
        };
        struct Case {
            what: &'static str,
            prev: Option<WaveStatus>,
            progress: Progress,
            now: i64,
            want: (WaveStatus, usize, Option<Duration>),
        }
        let cases = [
            Case {
                what: "the first wave: one node",
                prev: None,
                progress: progress(0, 0, true),
                now: 100,
                want: (wave(0, 100, None), 1, None),
            },
            Case {
                what: "its one node in flight: nothing more",
                prev: Some(wave(0, 90, None)),
                progress: progress(0, 1, true),
                now: 100,
                want: (wave(0, 90, None), 0, None),
            },
            Case {
                what: "finished: the soak begins now",
                prev: Some(wave(0, 90, None)),
                progress: progress(1, 0, true),
                now: 100,
                want: (wave(0, 90, Some(100)), 0, Some(soak)),
            },
            Case {
                what: "soaking: look again when it ends",
                prev: Some(wave(0, 90, Some(100))),
                progress: progress(1, 0, true),
                now: 120,
                want: (wave(0, 90, Some(100)), 0, Some(Duration::from_secs(10))),
            },
            Case {
                what: "soaked but a node not Ready: wait for it",
                prev: Some(wave(0, 90, Some(100))),
                progress: progress(1, 0, false),
                now: 140,
                want: (wave(0, 90, Some(100)), 0, None),
            },
            Case {
                what: "soaked and Ready: the second wave, three nodes",
                prev: Some(wave(0, 90, Some(100))),
                progress: progress(1, 0, true),
                now: 130,
                want: (wave(1, 130, None), 3, None),
            },
            Case {
                what: "the last wave takes the rest",
                prev: Some(wave(1, 150, Some(200))),
                progress: progress(4, 0, true),
                now: 240,
                want: (wave(2, 240, None), 6, None),
            },
            Case {
                what: "the last wave finished: nothing after it",
                prev: Some(wave(2, 240, None)),
                progress: progress(10, 0, true),
                now: 280,
                want: (wave(2, 240, Some(280)), 0, None),
            },
            Case {
                what: "a new target starts at the first wave, counting nodes already on it",
                prev: Some(wave(2, 250, None)),
                progress: progress(9, 0, true),
                now: 300,
                want: (
                    WaveStatus {
                        target: "img".into(),
                        wave: 2,
                        started_at: Some(MicroTime(at(300).0)),
                        finished_at: None,
                    },
                    1,
                    None,
                ),
            },
        ];
        for case in cases {
            let prev = case.prev.map(|mut p| {
                if case.what.starts_with("a new target") {
                    p.target = "old".into();
                }
                p
            });
            let got = allow(prev.as_ref(), "img", &ends, case.progress, soak, &at(case.now));
            assert_eq!((got.status, got.starts, got.recheck), case.want, "{}", case.what);
        }
    }
}
