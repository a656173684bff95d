//! CPU time by process, read from `/proc`: where a bench's machine time
//! went, per program (kube-apiserver, etcd, nodewarden, ...), without a
//! profiler attached.

use std::collections::BTreeMap;
use std::sync::OnceLock;

/// Clock ticks a second (`getconf CLK_TCK`), the unit of `/proc/<pid>/stat`.
fn ticks_per_second() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// The command name and CPU seconds (user + system) in one
/// `/proc/<pid>/stat` text.
fn parse_stat(text: &str) -> Option<(String, f64)> {
    // The command sits in parentheses and may hold spaces or parentheses.
    let (head, rest) = text.rsplit_once(')')?;
    let (_, comm) = head.split_once('(')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
    // utime and stime are fields 14 and 15: 12 and 13 after the command.
    Some((comm.to_string(), (field(11)? + field(12)?) / ticks_per_second()))
}

/// A process's name for a reader: its command, and its first argument when
/// that is a subcommand (one binary runs both `nodewarden run` and the
/// simulated cloud).
fn label(pid: u32, comm: String) -> String {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    match cmdline.split(|b| *b == 0).nth(1).map(String::from_utf8_lossy) {
        Some(sub) if !sub.is_empty() && !sub.starts_with('-') && !sub.contains('/') => {
            format!("{comm} {sub}")
        }
        _ => comm,
    }
}

/// CPU seconds (user + system) one process has used; 0 once it is gone.
pub fn cpu_seconds(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|t| parse_stat(&t))
        .map_or(0.0, |(_, s)| s)
}

/// CPU seconds used so far by every running process, keyed by pid and
/// summed by [`label`] when compared, so a later snapshot can take the difference.
#[derive(Clone, Debug, Default)]
pub struct CpuSnapshot {
    by_pid: BTreeMap<u32, (String, f64)>,
}

impl CpuSnapshot {
    pub fn take() -> Self {
        let mut by_pid = BTreeMap::new();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Self::default();
        };
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if let Some((comm, seconds)) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|t| parse_stat(&t))
            {
                by_pid.insert(pid, (label(pid, comm), seconds));
            }
        }
        Self { by_pid }
    }

    /// CPU seconds each program used between `earlier` and this snapshot,
    /// most first, under its name now. A process started in between counts
    /// from zero; one that ended in between is not counted (its last seconds
    /// are unknown).
    pub fn used_since(&self, earlier: &CpuSnapshot) -> Vec<(String, f64)> {
        let mut by_command: BTreeMap<&str, f64> = BTreeMap::new();
        for (pid, (comm, now)) in &self.by_pid {
            // By pid alone: a kernel worker's name changes with its work.
            let before = earlier.by_pid.get(pid).map_or(0.0, |(_, s)| *s);
            *by_command.entry(comm).or_default() += (now - before).max(0.0);
        }
        let mut used: Vec<(String, f64)> = by_command
            .into_iter()
            .filter(|(_, s)| *s > 0.0)
            .map(|(c, s)| (c.to_string(), s))
            .collect();
        used.sort_by(|a, b| b.1.total_cmp(&a.1));
        used
    }
}

/// The machine's cores, to turn CPU seconds into a share of what it had.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Busy and total jiffies of the whole machine (the `cpu` line of
/// `/proc/stat`): busy is everything but idle and iowait.
fn machine_jiffies() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let values: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: u64 = values.iter().sum();
    let idle = values.get(3).copied().unwrap_or(0) + values.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// The machine's busy fraction in each tenth of a second, sampled on a
/// thread of its own until [`BusySampler::stop`]: whether a phase ran
/// with the cores saturated, and for how long.
pub struct BusySampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<f64>>,
}

impl BusySampler {
    pub const PERIOD: std::time::Duration = std::time::Duration::from_millis(100);

    pub fn start() -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut fractions = Vec::new();
            let mut last = machine_jiffies();
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Self::PERIOD);
                let now = machine_jiffies();
                if let (Some((b0, t0)), Some((b1, t1))) = (last, now)
                    && t1 > t0
                {
                    fractions.push((b1 - b0) as f64 / (t1 - t0) as f64);
                }
                last = now;
            }
            fractions
        });
        Self { stop, thread }
    }

    /// Each period's busy fraction of the whole machine, in order.
    pub fn stop(self) -> Vec<f64> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// Where the machine's time went over `wall`: CPU used against what the
/// cores had, how often they were saturated, and the `shown` programs that
/// used most.
pub fn describe(used: &[(String, f64)], wall: std::time::Duration, busy: &[f64], shown: usize) -> String {
    let capacity = wall.as_secs_f64() * cores() as f64;
    let total: f64 = used.iter().map(|(_, s)| s).sum();
    let programs: Vec<String> = used
        .iter()
        .take(shown)
        .map(|(p, s)| format!("{p} {s:.2} s"))
        .collect();
    format!(
        "CPU {total:.1} s of the machine's {capacity:.1} s ({:.0} %), cores ≥ 90 % busy in {:.0} % of its tenths of a second; by program: {}",
        100.0 * total / capacity.max(1e-9),
        100.0 * saturated_share(busy),
        programs.join(", ")
    )
}

/// The share of [`BusySampler`] periods in which the cores were at least
/// 90 % busy.
pub fn saturated_share(busy: &[f64]) -> f64 {
    busy.iter().filter(|b| **b >= 0.9).count() as f64 / busy.len().max(1) as f64
}

/// The first `shown` programs of a breakdown, as JSON.
pub fn json_by_program(used: &[(String, f64)], shown: usize) -> serde_json::Value {
    used.iter()
        .take(shown)
        .map(|(p, s)| (p.clone(), serde_json::json!(s)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// The kube-apiserver's CPU profile over the next `seconds` (its
/// `/debug/pprof/profile`, which the local control plane serves to
/// cluster-admin), as pprof bytes.
pub async fn apiserver_cpu_profile(client: &kube::Client, seconds: u64) -> Result<Vec<u8>, String> {
    use http_body_util::BodyExt;
    let request = http::Request::get(format!("/debug/pprof/profile?seconds={seconds}"))
        .body(kube::client::Body::empty())
        .map_err(|e| e.to_string())?;
    let response = client.send(request).await.map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!("the API server answered {}", response.status()));
    }
    let body = response.into_body().collect().await.map_err(|e| e.to_string())?;
    Ok(body.to_bytes().to_vec())
}

/// What a kube-apiserver CPU profile spent its time on, by the handler
/// frames that name the work (`go tool pprof -top -cum`); each share is of
/// the profile's samples, and they overlap where one work calls another.
pub fn apiserver_profile_shares(profile: &std::path::Path) -> Result<String, String> {
    const WORK: [(&str, &str); 7] = [
        ("lists", "handlers.ListResource.func1"),
        ("writes", "registry.(*Store).Update"),
        ("creates", "registry.(*Store).Create"),
        ("gets", "handlers.GetResource.func1"),
        (
            "authentication",
            "union.(*unionAuthRequestHandler).AuthenticateRequest",
        ),
        ("watch fan-out", "cacher.(*Cacher).dispatchEvents"),
        ("garbage collection", "runtime.gcBgMarkWorker"),
    ];
    let output = std::process::Command::new("go")
        .args(["tool", "pprof", "-top", "-cum", "-nodecount=2000"])
        .arg(profile)
        .output()
        .map_err(|e| format!("go tool pprof: {e}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let total = text
        .lines()
        .find_map(|l| l.split("Total samples = ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .ok_or_else(|| {
            format!(
                "no samples in the profile: {}",
                String::from_utf8_lossy(&output.stderr)
            )
        })?
        .to_string();
    let shares: Vec<String> = WORK
        .iter()
        .map(|(what, frame)| {
            // Columns: flat flat% sum% cum cum% function.
            let share = text
                .lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .find(|c| c.len() >= 6 && c[5..].join(" ").ends_with(frame))
                .map_or("0%".to_string(), |c| c[4].to_string());
            format!("{what} {share}")
        })
        .collect();
    Ok(format!("{total} sampled: {}", shares.join(", ")))
}
