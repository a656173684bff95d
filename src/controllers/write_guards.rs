//! What keeps each write safe when it lands late.
//!
//! The controllers' client is fenced (`runtime::fence`): a write is refused
//! when this replica does not lead, and abandoned when leadership lapses
//! before the answer. But bytes already on the wire cannot be recalled: a
//! write sent just before the lapse can reach the API server after another
//! replica took over and acted. So every write whose late arrival could do
//! harm is conditional, and refused when it lands after someone else acted:
//!
//! - a resourceVersion precondition (a replace of the object as read; a merge
//!   patch carrying `metadata.resourceVersion`, which the API server answers
//!   with 409 Conflict when it no longer holds),
//! - a create of a fixed name (409 AlreadyExists),
//! - a delete (or eviction) with UID (and resourceVersion) preconditions,
//! - a cloud create under an idempotency key,
//!
//! or it is harmless when late, for the reason its row gives. A 409 is a
//! Conflict (`Error::category`): the reconcile is retried quietly on fresh
//! state.
//!
//! The test reads the sources: every line with a write call must match
//! exactly one row of [`WRITES`], and every row at least one line. A new
//! write fails it until someone says what guards it.

/// What makes a write safe to land late.
#[derive(Clone, Copy, Debug)]
enum Guard {
    /// Conditioned on the resourceVersion of the object the decision was made on.
    ResourceVersion,
    /// A create of a fixed name: a late one finds the name taken (409).
    CreateOnce,
    /// A delete or eviction with UID (and resourceVersion) preconditions.
    DeletePreconditions,
    /// A cloud create under an idempotency key.
    IdempotencyKey,
    /// Harmless when late, for this reason.
    Harmless(&'static str),
}

use Guard::*;

/// The write calls looked for. `self.<call>(` is left out: a call of the
/// file's own method, whose body is scanned itself.
const CALLS: &[&str] = &[
    ".patch(",
    ".patch_status(",
    ".replace(",
    ".replace_status(",
    ".create(",
    ".delete(",
    ".evict(",
    "create_subresource",
    ".update(&",
    "create_node(",
    "delete_node(",
    "delete_if_present(",
    ".publish(",
    "remove_member(",
];

const EVENT: &str = "an Event: a record for people, never a decision input";

const CLOUD_ANSWER: &str = "records the cloud's answer to a PendingNode's create: whichever leader \
     finishes that create gets the same instance (idempotency key: the PendingNode's UID), so the \
     provider ID and node name are those already there; only the join deadline and created-at can \
     move, by the cloud's latency, and the goal is never touched";

/// Every write, as (file under src/, enclosing fn, text of the call's line, guard).
const WRITES: &[(&str, &str, &str, Guard)] = &[
    (
        "controllers/autoscaling_strategy.rs",
        "apply",
        ".patch_status(",
        ResourceVersion,
    ),
    // The Deployment's scale and command.
    (
        "controllers/autoscaling_strategy.rs",
        "apply",
        ".patch(",
        ResourceVersion,
    ),
    // Every controller's finalizer list (`finalizer::add`, `remove`, `replace`).
    (
        "controllers/finalizer.rs",
        "patch_list",
        "api.patch(",
        ResourceVersion,
    ),
    (
        "controllers/joining_node.rs",
        "delete",
        "delete_if_present(",
        DeletePreconditions,
    ),
    (
        "controllers/joining_node.rs",
        "reconcile",
        ".patch(&jn.spec.name",
        Harmless(
            "the components annotation a node's JoiningNode announced when it joined: a node joins \
             once, so every leader writes the same value",
        ),
    ),
    ("controllers/mod.rs", "spawn_event", ".publish(", Harmless(EVENT)),
    (
        "controllers/mod.rs",
        "delete_if_present",
        "api.delete(",
        Harmless(
            "the shared delete helper: each call of it is a row of its own, guarded by the params it passes",
        ),
    ),
    (
        "controllers/no_cloud.rs",
        "reconcile",
        ".patch_status(",
        Harmless(
            "the NoCloudProvider conditions: the same whichever replica writes them for a generation, \
             and a report no decision reads",
        ),
    ),
    (
        "controllers/node_maintenance/act.rs",
        "leave",
        ".replace(node_name",
        ResourceVersion,
    ),
    (
        "controllers/node_maintenance/act.rs",
        "set_owner_reference",
        ".patch(",
        ResourceVersion,
    ),
    (
        "controllers/node_maintenance/act.rs",
        "quarantine",
        "nodes.replace(",
        ResourceVersion,
    ),
    (
        "controllers/node_maintenance/act.rs",
        "take_lease",
        "lock.create(",
        CreateOnce,
    ),
    (
        "controllers/node_maintenance/act.rs",
        "take_lease",
        "lock.update(",
        ResourceVersion,
    ),
    (
        "controllers/node_maintenance/act.rs",
        "release_lease",
        "lock.delete(",
        DeletePreconditions,
    ),
    (
        "controllers/node_maintenance/act.rs",
        "ensure_namespace",
        "namespaces.create(",
        CreateOnce,
    ),
    (
        "controllers/node_maintenance/report.rs",
        "report",
        ".patch_status(",
        ResourceVersion,
    ),
    (
        "controllers/node_maintenance/report.rs",
        "event",
        ".publish(",
        Harmless(EVENT),
    ),
    (
        "controllers/node_version/act.rs",
        "settle_joins",
        "delete_if_present(",
        DeletePreconditions,
    ),
    (
        "controllers/node_version/report.rs",
        "report_error",
        ".patch_status(",
        Harmless(
            "Degraded=CloudError or EtcdError: a report no decision reads; the next pass that gets \
             through clears it",
        ),
    ),
    (
        "controllers/node_version/gather.rs",
        "annotate",
        ".patch(",
        Harmless(
            "a node's scaling group and boot image: facts of its instance, fixed for its life, so \
             every leader writes the same values",
        ),
    ),
    // Heir and donor, each on the version read fresh.
    (
        "controllers/node_version/act.rs",
        "pair",
        ".patch(",
        ResourceVersion,
    ),
    (
        "controllers/node_version/act.rs",
        "release_join",
        "delete_if_present(",
        DeletePreconditions,
    ),
    (
        "controllers/node_version/act.rs",
        "drain",
        "maintenances.create(",
        CreateOnce,
    ),
    (
        "controllers/node_version/retire.rs",
        "retire",
        "delete_node(",
        Harmless(
            "the instance of a node drained for its replacement, by provider ID (never reused), \
             after its leave is tracked; a cloud call takes no precondition, and landing late it \
             deletes only an instance whose node is drained and cordoned (the Node itself goes with \
             a UID precondition)",
        ),
    ),
    (
        "controllers/node_version/retire.rs",
        "retire",
        "delete_if_present(",
        DeletePreconditions,
    ),
    (
        "controllers/node_version/retire.rs",
        "remove_etcd_member",
        "remove_member(",
        Harmless(
            "an etcd member removed by its ID, which etcd never reuses: landing late, after another \
             leader removed it, it finds the ID gone and removes nothing (answered as removed \
             already); it is sent only for a drained node whose heir is Ready and has its own \
             member, for the member on that node's IP, after the other voting members were seen \
             healthy, and etcd itself refuses a removal that would leave fewer started members \
             than quorum",
        ),
    ),
    (
        "controllers/node_version/retire.rs",
        "evict_stragglers",
        "api.evict(",
        DeletePreconditions,
    ),
    (
        "controllers/node_version/act.rs",
        "create_instance",
        "pending.create(",
        Harmless(
            "a PendingNode of a new random name, so no AlreadyExists stops a late one: it is one \
             more join in flight, which the planner counts in the surge; its instance replaces the \
             next outdated node or is marked surplus and removed (an instance's cost, never a drain)",
        ),
    ),
    (
        "controllers/node_version/act.rs",
        "create_instance",
        "create_node(",
        IdempotencyKey,
    ),
    (
        "controllers/node_version/act.rs",
        "create_instance",
        ".patch(&name",
        Harmless(CLOUD_ANSWER),
    ),
    (
        "controllers/node_version/act.rs",
        "mark_surplus",
        ".patch(&node",
        ResourceVersion,
    ),
    (
        "controllers/node_version/act.rs",
        "mark_surplus",
        "delete_if_present(",
        DeletePreconditions,
    ),
    (
        "controllers/node_version/report.rs",
        "trace_rollout",
        "api.patch(&nv",
        Harmless(
            "the rollout's trace context: no rollout decision reads it; a late write at worst splits one rollout's trace in two",
        ),
    ),
    (
        "controllers/node_version/retire.rs",
        "track_leave",
        "pending.create(",
        CreateOnce,
    ),
    (
        "controllers/node_version/act.rs",
        "pause_autoscaling",
        "api.patch(",
        ResourceVersion,
    ),
    (
        "controllers/node_version/status_writes.rs",
        "start",
        ".patch_status(",
        Harmless(
            "the rollout's status: every field recomputed from the world each pass, none read back \
             as a decision input (only as the base of the conditions' transition times), so a late \
             one is a stale report until the next write",
        ),
    ),
    (
        "controllers/pending_node.rs",
        "write_status",
        ".patch_status(",
        Harmless(
            "cspState and reachedGoal: recomputed from the cloud and the Node each pass, and read \
             by no decision (only compared, to skip an unchanged write)",
        ),
    ),
    // A failed create's error, for the NodeVersion's Degraded message.
    (
        "controllers/pending_node.rs",
        "reconcile",
        "api.patch(&name",
        ResourceVersion,
    ),
    // The give-up: goal Leave, before the instance is deleted.
    (
        "controllers/pending_node.rs",
        "give_up",
        "api.patch(&name",
        ResourceVersion,
    ),
    (
        "controllers/pending_node.rs",
        "forget",
        "delete_if_present(&nodes",
        DeletePreconditions,
    ),
    (
        "controllers/pending_node.rs",
        "forget",
        "delete_if_present(api,",
        DeletePreconditions,
    ),
    (
        "controllers/pending_node.rs",
        "delete_instance",
        "delete_node(",
        Harmless(
            "a leaving PendingNode's instance, by provider ID (never reused): a goal of Leave is \
             never undone, and a give-up deletes only after its Leave was written on the version \
             judged, so a late delete deletes what every leader deletes",
        ),
    ),
    (
        "controllers/pending_node.rs",
        "finish_create",
        "create_node(",
        IdempotencyKey,
    ),
    (
        "controllers/pending_node.rs",
        "finish_create",
        "api.patch(&name",
        Harmless(CLOUD_ANSWER),
    ),
    (
        "controllers/plan/act.rs",
        "create_maintenance",
        "api.create(",
        CreateOnce,
    ),
    (
        "controllers/plan/act.rs",
        "cordon",
        "api.replace(",
        ResourceVersion,
    ),
    (
        "controllers/plan/act.rs",
        "create_job_once",
        "api.create(",
        CreateOnce,
    ),
    (
        "controllers/plan/act.rs",
        "retry_prepare",
        "delete_if_present(",
        DeletePreconditions,
    ),
    (
        "controllers/plan/act.rs",
        "retry_job",
        "delete_if_present(",
        DeletePreconditions,
    ),
    (
        "controllers/plan/act.rs",
        "label",
        "api.patch(",
        Harmless(
            "the plan's hash label (and postCompleteLabels) once the node's Job for that hash \
             completed: a fact every leader writes alike. Over a newer hash it would need a whole \
             later upgrade of the node (drain, Job, Ready) within the delay, and would then cost a \
             repeat of that upgrade, never a skipped one",
        ),
    ),
    (
        "controllers/plan/act.rs",
        "delete_jobs",
        "delete_if_present(",
        DeletePreconditions,
    ),
    (
        "controllers/plan/act.rs",
        "release",
        "delete_if_present(&maintenances",
        DeletePreconditions,
    ),
    (
        "controllers/plan/act.rs",
        "release",
        "api.replace(",
        ResourceVersion,
    ),
    (
        "controllers/plan/act.rs",
        "release",
        "delete_if_present(&jobs",
        DeletePreconditions,
    ),
    (
        "controllers/plan/report.rs",
        "write_status",
        ".replace_status(",
        ResourceVersion,
    ),
    (
        "controllers/scaling_group.rs",
        "discover_and_create",
        "api.create(",
        CreateOnce,
    ),
    (
        "controllers/scaling_group.rs",
        "report",
        ".patch_status(",
        ResourceVersion,
    ),
    (
        "controllers/sip_cluster/act.rs",
        "patch_host",
        ".patch(",
        ResourceVersion,
    ),
    (
        "controllers/sip_cluster/act.rs",
        "release_claim",
        ".patch(",
        ResourceVersion,
    ),
    (
        "controllers/sip_cluster/act.rs",
        "apply_objects",
        "&Patch::Apply(",
        Harmless(
            "the service objects (Deployment, Service, Secret, ConfigMap), recomputed from the \
             hosts' claim labels (the record) every pass: a late apply of an older host set \
             changes objects the controller watches (owns), so the next pass overwrites it at \
             once, and it claims no host",
        ),
    ),
    (
        "controllers/sip_cluster/act.rs",
        "delete_listed",
        "delete_if_present(",
        DeletePreconditions,
    ),
    (
        "controllers/sip_cluster/report.rs",
        "write_status",
        ".replace_status(",
        ResourceVersion,
    ),
    ("drain/engine.rs", "evict", "api.evict(", DeletePreconditions),
    ("drain/engine.rs", "delete", "api.delete(", DeletePreconditions),
];

/// The sources scanned, by path under src/.
const SOURCES: &[(&str, &str)] = &[
    (
        "controllers/autoscaling_strategy.rs",
        include_str!("autoscaling_strategy.rs"),
    ),
    ("controllers/finalizer.rs", include_str!("finalizer.rs")),
    ("controllers/joining_node.rs", include_str!("joining_node.rs")),
    ("controllers/mod.rs", include_str!("mod.rs")),
    ("controllers/no_cloud.rs", include_str!("no_cloud.rs")),
    (
        "controllers/node_maintenance/act.rs",
        include_str!("node_maintenance/act.rs"),
    ),
    (
        "controllers/node_maintenance/decide.rs",
        include_str!("node_maintenance/decide.rs"),
    ),
    (
        "controllers/node_maintenance/mod.rs",
        include_str!("node_maintenance/mod.rs"),
    ),
    (
        "controllers/node_maintenance/report.rs",
        include_str!("node_maintenance/report.rs"),
    ),
    (
        "controllers/node_version/act.rs",
        include_str!("node_version/act.rs"),
    ),
    (
        "controllers/node_version/decide.rs",
        include_str!("node_version/decide.rs"),
    ),
    (
        "controllers/node_version/gather.rs",
        include_str!("node_version/gather.rs"),
    ),
    (
        "controllers/node_version/metrics.rs",
        include_str!("node_version/metrics.rs"),
    ),
    (
        "controllers/node_version/control_plane.rs",
        include_str!("node_version/control_plane.rs"),
    ),
    (
        "controllers/node_version/etcd_reach.rs",
        include_str!("node_version/etcd_reach.rs"),
    ),
    (
        "controllers/node_version/mod.rs",
        include_str!("node_version/mod.rs"),
    ),
    (
        "controllers/node_version/report.rs",
        include_str!("node_version/report.rs"),
    ),
    (
        "controllers/node_version/retire.rs",
        include_str!("node_version/retire.rs"),
    ),
    (
        "controllers/node_version/status.rs",
        include_str!("node_version/status.rs"),
    ),
    (
        "controllers/node_version/status_writes.rs",
        include_str!("node_version/status_writes.rs"),
    ),
    (
        "controllers/node_version/workloads.rs",
        include_str!("node_version/workloads.rs"),
    ),
    ("controllers/pending_node.rs", include_str!("pending_node.rs")),
    ("controllers/plan/act.rs", include_str!("plan/act.rs")),
    ("controllers/plan/decide.rs", include_str!("plan/decide.rs")),
    ("controllers/plan/gather.rs", include_str!("plan/gather.rs")),
    ("controllers/plan/metrics.rs", include_str!("plan/metrics.rs")),
    ("controllers/plan/mod.rs", include_str!("plan/mod.rs")),
    ("controllers/plan/report.rs", include_str!("plan/report.rs")),
    (
        "controllers/replacement_trace.rs",
        include_str!("replacement_trace.rs"),
    ),
    ("controllers/scaling_group.rs", include_str!("scaling_group.rs")),
    (
        "controllers/sip_cluster/act.rs",
        include_str!("sip_cluster/act.rs"),
    ),
    (
        "controllers/sip_cluster/decide.rs",
        include_str!("sip_cluster/decide.rs"),
    ),
    (
        "controllers/sip_cluster/gather.rs",
        include_str!("sip_cluster/gather.rs"),
    ),
    (
        "controllers/sip_cluster/metrics.rs",
        include_str!("sip_cluster/metrics.rs"),
    ),
    (
        "controllers/sip_cluster/mod.rs",
        include_str!("sip_cluster/mod.rs"),
    ),
    (
        "controllers/sip_cluster/report.rs",
        include_str!("sip_cluster/report.rs"),
    ),
    ("drain/budgets.rs", include_str!("../drain/budgets.rs")),
    ("drain/engine.rs", include_str!("../drain/engine.rs")),
    ("drain/kubectl.rs", include_str!("../drain/kubectl.rs")),
    ("drain/mod.rs", include_str!("../drain/mod.rs")),
    ("drain/node.rs", include_str!("../drain/node.rs")),
    ("drain/pods.rs", include_str!("../drain/pods.rs")),
    ("rollout/facts.rs", include_str!("../rollout/facts.rs")),
    ("rollout/halt.rs", include_str!("../rollout/halt.rs")),
    ("rollout/mod.rs", include_str!("../rollout/mod.rs")),
    ("rollout/plan.rs", include_str!("../rollout/plan.rs")),
    ("rollout/waves.rs", include_str!("../rollout/waves.rs")),
    ("rollout/domains.rs", include_str!("../rollout/domains.rs")),
    ("sip/hosts.rs", include_str!("../sip/hosts.rs")),
    ("sip/mod.rs", include_str!("../sip/mod.rs")),
    ("sip/schedule.rs", include_str!("../sip/schedule.rs")),
    ("sip/services.rs", include_str!("../sip/services.rs")),
    ("sip/template.rs", include_str!("../sip/template.rs")),
    ("upgrade/channel.rs", include_str!("../upgrade/channel.rs")),
    ("upgrade/hash.rs", include_str!("../upgrade/hash.rs")),
    ("upgrade/job.rs", include_str!("../upgrade/job.rs")),
    ("upgrade/mod.rs", include_str!("../upgrade/mod.rs")),
    ("upgrade/schedule.rs", include_str!("../upgrade/schedule.rs")),
    ("upgrade/tally.rs", include_str!("../upgrade/tally.rs")),
    ("upgrade/window.rs", include_str!("../upgrade/window.rs")),
];

/// The directories whose every file must be in [`SOURCES`].
const DIRECTORIES: &[&str] = &[
    "controllers",
    "controllers/node_maintenance",
    "controllers/node_version",
    "controllers/plan",
    "controllers/sip_cluster",
    "drain",
    "rollout",
    "sip",
    "upgrade",
];

/// One write call found: where, in which fn, and the line.
#[derive(Debug)]
struct Write {
    file: &'static str,
    line: usize,
    function: String,
    text: String,
}

/// The name a line declares a fn of, if it does.
fn declared_fn(line: &str) -> Option<String> {
    let mut rest = line.trim_start();
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "const ",
        "async ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    let name: String = rest
        .strip_prefix("fn ")?
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    Some(name)
}

/// Is `line` a write call (see [`CALLS`])?
fn is_write(line: &str) -> bool {
    let code = line.trim_start();
    if code.starts_with("//") {
        return false;
    }
    // `str::replace`, not the API's.
    if code.contains(".replace(\"") || code.contains(".replace('") {
        return false;
    }
    CALLS.iter().any(|call| {
        code.match_indices(call)
            .any(|(at, _)| !code[..at].ends_with("self") || call.starts_with(|c: char| c != '.'))
    })
}

/// Every write call in the sources, outside their test modules.
fn writes() -> Vec<Write> {
    let mut found = Vec::new();
    for (file, source) in SOURCES {
        let code = source
            .find("\n#[cfg(test)]\nmod tests")
            .map_or(*source, |end| &source[..end]);
        let mut function = String::new();
        for (i, line) in code.lines().enumerate() {
            if let Some(name) = declared_fn(line) {
                function = name;
            }
            if is_write(line) {
                found.push(Write {
                    file,
                    line: i + 1,
                    function: function.clone(),
                    text: line.trim().to_string(),
                });
            }
        }
    }
    found
}

fn matches(row: &(&str, &str, &str, Guard), write: &Write) -> bool {
    let (file, function, text, _) = row;
    *file == write.file && *function == write.function && write.text.contains(text)
}

#[test]
fn every_write_has_exactly_one_guard_and_every_guard_a_write() {
    let writes = writes();
    let mut problems = Vec::new();
    for w in &writes {
        let rows: Vec<_> = WRITES.iter().filter(|row| matches(row, w)).collect();
        match rows.len() {
            1 => {}
            0 => problems.push(format!(
                "src/{}:{} in fn {}: `{}` has no row in WRITES: say what guards it when it lands late",
                w.file, w.line, w.function, w.text
            )),
            _ => problems.push(format!(
                "src/{}:{} in fn {}: `{}` matches {} rows: {rows:?}",
                w.file,
                w.line,
                w.function,
                w.text,
                rows.len()
            )),
        }
    }
    for row in WRITES {
        if !writes.iter().any(|w| matches(row, w)) {
            problems.push(format!("the row {row:?} matches no write: gone or moved?"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_source_file_is_scanned() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut missing = Vec::new();
    for dir in DIRECTORIES {
        let entries = std::fs::read_dir(src.join(dir)).expect("a source directory");
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            let file = format!("{dir}/{name}");
            let this = file == "controllers/write_guards.rs";
            if name.ends_with(".rs") && !this && !SOURCES.iter().any(|(f, _)| *f == file) {
                missing.push(file);
            }
        }
    }
    assert!(missing.is_empty(), "add to SOURCES: {missing:?}");
}

#[test]
fn the_scan_finds_calls_and_their_functions() {
    assert_eq!(declared_fn("    pub async fn report("), Some("report".into()));
    assert_eq!(
        declared_fn("fn only(pod: &Pod) -> DeleteParams {"),
        Some("only".into())
    );
    assert_eq!(declared_fn("    let f = |x| x;"), None);
    assert!(is_write(
        "        api.patch(&name, &PatchParams::default(), &Patch::Merge(&p))"
    ));
    assert!(is_write("            .patch_status("));
    assert!(is_write(
        "        let known = match self.cloud.delete_node(&id).await {"
    ));
    assert!(
        !is_write("                self.delete(&jn).await?;"),
        "the file's own method"
    );
    assert!(!is_write(
        "    let v = v.replace(\"$(LATEST_VERSION)\", &version);"
    ));
    assert!(!is_write("    // api.patch( in a comment"));
    let found = writes();
    let pairing: Vec<_> = found
        .iter()
        .filter(|w| w.file == "controllers/node_version/act.rs" && w.function == "pair")
        .collect();
    assert_eq!(pairing.len(), 2, "the heir's and the donor's patch: {pairing:?}");
}

#[test]
fn harmless_rows_say_why() {
    for row in WRITES {
        if let (_, _, _, Harmless(why)) = row {
            assert!(
                why.len() > 40,
                "{row:?}: say precisely why it is harmless when late"
            );
        }
    }
}
