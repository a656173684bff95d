//! The observability pieces (`observability/`): the Kubernetes objects among
//! them pass a server-side dry run against the real API server, the scrape
//! configuration matches the Deployment, and every metric that an alert or a
//! dashboard query names is one nodewarden exports.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::support::manifests::{
    Applied, apply, describe, documents, file_name, find, gvk_of, is_namespace, to_object,
};
use kube::ResourceExt;
use kube::api::DynamicObject;
use nodewarden::admission::metrics::WebhookMetrics;
use nodewarden::cloud::CloudOperation;
use nodewarden::cloud::error::CloudErrorKind;
use nodewarden::cloud::metered::{CloudErrorLabels, CloudLabels, CloudMetrics};
use nodewarden::controllers::node_maintenance::{DrainMetrics, DrainResult, ResultLabels};
use nodewarden::controllers::node_version::metrics::{
    NodeState, NodeStateLabels, NodeVersionLabels, RolloutMetrics,
};
use nodewarden::controllers::plan::metrics::{
    JobResult, JobResultLabels, PlanFailure, PlanFailureLabels, PlanMetrics,
};
use nodewarden::controllers::sip_cluster::metrics::{SipMetrics, SipRoleLabels};
use nodewarden::runtime::error::Category;
use nodewarden::runtime::rate_limiter::default_rate_limiter;
use nodewarden::runtime::workqueue::WorkQueue;
use nodewarden::telemetry::metrics::{ControllerLabels, ErrorLabels, Metrics};
use serde_json::{Value, json};

/// API groups whose CRDs the test control plane does not have: objects of
/// these groups are parsed but only dry-run where the API server serves them.
const OPTIONAL_GROUPS: &[&str] = &["monitoring.coreos.com"];

fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

/// Every `observability/*.yaml`, sorted.
fn yaml_files() -> Vec<PathBuf> {
    let dir = repo_path("observability");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("reading observability/")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    files
}

/// The one document of a file that is not a multi-document manifest.
fn single_document(relative: &str) -> Value {
    let mut docs = documents(&repo_path(relative));
    assert_eq!(docs.len(), 1, "{relative} should hold exactly one YAML document");
    docs.remove(0)
}

/// A Kubernetes object names its apiVersion and kind; the Prometheus and
/// Grafana files have neither (Grafana's `apiVersion: 1` has no kind).
fn is_kubernetes_object(doc: &Value) -> bool {
    doc["apiVersion"].is_string() && doc["kind"].is_string()
}

/// `(file name, object)` for every Kubernetes object in `observability/*.yaml`.
fn kubernetes_objects() -> Vec<(String, DynamicObject)> {
    let mut objects = Vec::new();
    let mut kinds_by_file: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in yaml_files() {
        let name = file_name(&file);
        let docs = documents(&file);
        let k8s = docs.iter().filter(|d| is_kubernetes_object(d)).count();
        if k8s == 0 {
            continue;
        }
        assert_eq!(
            k8s,
            docs.len(),
            "{name} mixes Kubernetes objects with other documents: \
             a document without apiVersion and kind would never be applied"
        );
        for (i, doc) in docs.into_iter().enumerate() {
            let obj = to_object(&name, i, doc);
            assert!(
                !obj.name_any().is_empty(),
                "{name} document {i} has no metadata.name"
            );
            let kind = obj.types.as_ref().map(|t| t.kind.clone()).unwrap_or_default();
            kinds_by_file.entry(name.clone()).or_default().insert(kind);
            objects.push((name.clone(), obj));
        }
    }
    for (file, kinds) in [
        (
            "jaeger.yaml",
            &["Namespace", "ConfigMap", "Deployment", "Service"][..],
        ),
        ("servicemonitor.yaml", &["ServiceMonitor"][..]),
    ] {
        let found = kinds_by_file.get(file).cloned().unwrap_or_default();
        for kind in kinds {
            assert!(
                found.contains(*kind),
                "observability/{file} should hold a {kind} (found {found:?})"
            );
        }
    }
    objects
}

#[tokio::test]
async fn kubernetes_objects_pass_a_server_side_dry_run() {
    let objects = kubernetes_objects();
    let env = support::TestEnv::new("observability").await;

    // Namespaced objects cannot be dry-run into a namespace that does not
    // exist: really create the namespaces the files declare or use
    // (idempotent, and left in place like the manifests test's).
    let mut namespaces: BTreeMap<String, DynamicObject> = BTreeMap::new();
    for (_, obj) in &objects {
        if is_namespace(obj) {
            namespaces.insert(obj.name_any(), obj.clone());
        }
    }
    for (_, obj) in &objects {
        if let Some(ns) = obj.namespace() {
            namespaces.entry(ns.clone()).or_insert_with(|| {
                serde_json::from_value(json!({
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": ns},
                }))
                .expect("a namespace")
            });
        }
    }
    for ns in namespaces.values() {
        match apply(&env.client, ns, false).await {
            Ok(Applied::Done(_)) => {}
            Ok(Applied::NotServed(e)) | Err(e) => panic!("creating namespace {}: {e}", ns.name_any()),
        }
    }

    let mut failures = Vec::new();
    let mut skipped = Vec::new();
    let mut dry_run = 0;
    for (file, obj) in &objects {
        let what = describe(file, obj);
        match apply(&env.client, obj, true).await {
            Ok(Applied::Done(answer)) => {
                dry_run += 1;
                assert_eq!(
                    answer.name_any(),
                    obj.name_any(),
                    "the dry run of {what} answered another object"
                );
            }
            Ok(Applied::NotServed(e)) if OPTIONAL_GROUPS.contains(&gvk_of(obj).group.as_str()) => {
                skipped.push(format!("{what} ({e})"));
            }
            Ok(Applied::NotServed(e)) | Err(e) => failures.push(format!("{what}: {e}")),
        }
    }
    env.cleanup().await;
    for s in &skipped {
        eprintln!("not dry-run, its CRD is not installed: {s}");
    }
    assert!(
        failures.is_empty(),
        "{} of {} objects fail a server-side dry run:\n{}",
        failures.len(),
        objects.len(),
        failures.join("\n")
    );
    assert!(dry_run >= 4, "only {dry_run} objects were dry-run");
}

fn container_port_names(deployment: &Value) -> BTreeSet<String> {
    deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p["name"].as_str().map(str::to_string))
        .collect()
}

/// Every `selector` label is on the Deployment's pod template.
fn selects(selector: &Value, deployment: &Value) -> bool {
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    selector
        .as_object()
        .is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| &pod_labels[k] == v))
}

#[test]
fn jaeger_is_pinned_and_serves_otlp_and_the_ui() {
    let docs = documents(&repo_path("observability/jaeger.yaml"));
    let deployment = find(&docs, "Deployment", "jaeger");
    assert_eq!(deployment["metadata"]["namespace"], "observability");
    let image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .expect("the Jaeger container's image");
    let tag = image
        .strip_prefix("jaegertracing/jaeger:")
        .unwrap_or_else(|| panic!("Jaeger v2 image expected, found {image}"));
    let parts: Vec<&str> = tag.split('.').collect();
    assert!(
        parts.len() == 3 && parts[0] == "2" && parts.iter().all(|p| p.parse::<u32>().is_ok()),
        "the Jaeger image should be pinned to a 2.x.y release, found {image}"
    );

    let service = find(&docs, "Service", "jaeger-collector");
    assert_eq!(service["metadata"]["namespace"], "observability");
    assert!(
        selects(&service["spec"]["selector"], deployment),
        "Service jaeger-collector does not select the jaeger pods"
    );
    let names = container_port_names(deployment);
    let mut ports = BTreeSet::new();
    for port in service["spec"]["ports"].as_array().expect("Service ports") {
        ports.insert(port["port"].as_u64().expect("a port number"));
        let target = &port["targetPort"];
        if let Some(name) = target.as_str() {
            assert!(
                names.contains(name),
                "targetPort {name} is not a container port ({names:?})"
            );
        }
    }
    for wanted in [4317, 4318, 16686] {
        assert!(
            ports.contains(&wanted),
            "Service jaeger-collector lacks port {wanted}"
        );
    }

    // The Jaeger configuration itself: OTLP in, memory store, every listener
    // reachable through the Service.
    let config_map = find(&docs, "ConfigMap", "jaeger-config");
    let config_text = config_map["data"]["config.yaml"]
        .as_str()
        .expect("jaeger-config holds config.yaml");
    let config: Value = serde_norway::from_str(config_text).expect("Jaeger's config.yaml parses");
    for (path, endpoint) in [
        ("/receivers/otlp/protocols/grpc/endpoint", "0.0.0.0:4317"),
        ("/receivers/otlp/protocols/http/endpoint", "0.0.0.0:4318"),
        ("/extensions/jaeger_query/http/endpoint", "0.0.0.0:16686"),
    ] {
        assert_eq!(
            config.pointer(path),
            Some(&json!(endpoint)),
            "Jaeger config {path}"
        );
    }
    let store = config
        .pointer("/extensions/jaeger_query/storage/traces")
        .and_then(Value::as_str)
        .expect("jaeger_query.storage.traces");
    assert!(
        config
            .pointer(&format!("/extensions/jaeger_storage/backends/{store}/memory"))
            .is_some(),
        "the query storage {store} should be an in-memory backend"
    );
}

#[test]
fn scrape_configuration_matches_the_deployment() {
    let manifests = documents(&repo_path("manifests/base/deployment.yaml"));
    let deployment = find(&manifests, "Deployment", "nodewarden");
    let namespace = deployment["metadata"]["namespace"]
        .as_str()
        .expect("the Deployment's namespace");
    let port_names = container_port_names(deployment);
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];

    // prometheus.yaml: pod discovery in the Deployment's namespace, keeping its
    // metrics port and pods, the pod name relabelled into `pod`.
    let prometheus = single_document("observability/prometheus.yaml");
    let rule_files: Vec<&str> = prometheus["rule_files"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for file in &rule_files {
        assert!(
            repo_path("observability").join(file).is_file(),
            "prometheus.yaml loads {file}, which is not in observability/"
        );
    }
    assert!(
        rule_files.contains(&"alerts.yaml"),
        "prometheus.yaml does not load alerts.yaml"
    );
    let jobs = prometheus["scrape_configs"]
        .as_array()
        .expect("prometheus.yaml has scrape_configs");
    let job = jobs
        .iter()
        .find(|j| j["job_name"] == "nodewarden")
        .expect("a scrape job nodewarden");
    let sd = &job["kubernetes_sd_configs"][0];
    assert_eq!(sd["role"], "pod", "the nodewarden job discovers pods");
    assert!(
        sd["namespaces"]["names"]
            .as_array()
            .is_some_and(|n| n.iter().any(|n| n == namespace)),
        "the nodewarden job does not look in namespace {namespace}"
    );
    let relabels = job["relabel_configs"].as_array().expect("relabel_configs");
    let keeps = |source: &str| -> Vec<String> {
        relabels
            .iter()
            .filter(|r| r["action"] == "keep" && r["source_labels"] == json!([source]))
            .filter_map(|r| r["regex"].as_str().map(str::to_string))
            .collect()
    };
    let kept_ports = keeps("__meta_kubernetes_pod_container_port_name");
    assert!(
        !kept_ports.is_empty() && kept_ports.iter().all(|p| port_names.contains(p)),
        "the nodewarden job keeps ports {kept_ports:?}; the Deployment names {port_names:?}"
    );
    let kept_apps = keeps("__meta_kubernetes_pod_label_app_kubernetes_io_name");
    assert!(
        !kept_apps.is_empty()
            && kept_apps
                .iter()
                .all(|a| pod_labels["app.kubernetes.io/name"] == *a),
        "the nodewarden job keeps pods labelled {kept_apps:?}, not nodewarden's"
    );
    for (source, target) in [
        ("__meta_kubernetes_pod_name", "pod"),
        ("__meta_kubernetes_namespace", "namespace"),
    ] {
        assert!(
            relabels
                .iter()
                .any(|r| r["source_labels"] == json!([source]) && r["target_label"] == target),
            "the nodewarden job does not set the label {target} from {source}"
        );
    }

    // servicemonitor.yaml: the metrics Service's port, in its namespace.
    let service = find(&manifests, "Service", "nodewarden-metrics");
    let monitor = single_document("observability/servicemonitor.yaml");
    assert_eq!(monitor["kind"], "ServiceMonitor");
    let service_labels = &service["metadata"]["labels"];
    let selector = monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("the ServiceMonitor selects by matchLabels");
    assert!(
        !selector.is_empty() && selector.iter().all(|(k, v)| &service_labels[k] == v),
        "the ServiceMonitor does not select Service nodewarden-metrics"
    );
    assert!(
        monitor["spec"]["namespaceSelector"]["matchNames"]
            .as_array()
            .is_some_and(|n| n.iter().any(|n| n == namespace))
            || monitor["metadata"]["namespace"] == namespace,
        "the ServiceMonitor does not look in namespace {namespace}"
    );
    let service_ports: Vec<&Value> = service["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| &p["name"])
        .collect();
    for endpoint in monitor["spec"]["endpoints"].as_array().expect("endpoints") {
        assert!(
            service_ports.contains(&&endpoint["port"]),
            "ServiceMonitor endpoint port {} is not a port of Service nodewarden-metrics",
            endpoint["port"]
        );
    }
}

/// nodewarden's metrics with one series in every family: prometheus_client
/// leaves a family without series out of the text entirely (no `# TYPE`
/// line), and most families only get series as the operator works. A family
/// added to `Metrics` must get a series here too, or its names read as not
/// exported.
fn populated_metrics() -> Metrics {
    let metrics = Metrics::new();
    let controller = ControllerLabels {
        controller: "probe".into(),
    };
    metrics.reconciles.get_or_create_owned(&controller);
    metrics.reconcile_errors.get_or_create_owned(&ErrorLabels {
        controller: "probe".into(),
        category: Category::Panic.as_str(),
    });
    metrics.reconcile_duration.get_or_create_owned(&controller);
    // The families each controller registers as it starts.
    let rollout = RolloutMetrics::register(&metrics);
    let nodeversion = NodeVersionLabels {
        nodeversion: "probe".into(),
    };
    rollout.nodes.get_or_create_owned(&NodeStateLabels {
        nodeversion: "probe".into(),
        state: NodeState::Outdated,
    });
    rollout.rollout_progress.get_or_create_owned(&nodeversion);
    rollout.rollout_last_progress.get_or_create_owned(&nodeversion);
    rollout.replacements.get_or_create_owned(&nodeversion);
    DrainMetrics::register(&metrics)
        .drain_duration
        .get_or_create_owned(&ResultLabels {
            result: DrainResult::Succeeded,
        });
    // The families the cloud and the webhook register as they start.
    let cloud = CloudMetrics::register(&metrics);
    cloud.duration(&CloudLabels {
        provider: "probe".into(),
        operation: CloudOperation::CreateNode,
    });
    cloud.errors(&CloudErrorLabels {
        provider: "probe".into(),
        operation: CloudOperation::CreateNode,
        category: CloudErrorKind::Server.as_str(),
    });
    WebhookMetrics::register(&metrics).serving();
    let plans = PlanMetrics::register(&metrics);
    plans.set_plan_nodes("probe", "probe", |_| 0);
    plans.plan_job_duration.get_or_create_owned(&JobResultLabels {
        result: JobResult::Succeeded,
    });
    plans.plan_failures.get_or_create_owned(&PlanFailureLabels {
        plan_namespace: "probe".into(),
        plan: "probe".into(),
        reason: PlanFailure::JobFailed,
    });
    let sip = SipMetrics::register(&metrics);
    sip.set_sip_hosts(
        "probe",
        "probe",
        "Worker",
        [("active", 0), ("standby", 0), ("wanted", 0)],
    );
    sip.sip_host_replacements.get_or_create_owned(&SipRoleLabels {
        cluster_namespace: "probe".into(),
        cluster: "probe".into(),
        role: "Worker".into(),
    });
    // A queue with metrics creates the series of every queue metric.
    let _queue: WorkQueue<String> =
        WorkQueue::new("probe", default_rate_limiter(), Some(metrics.queue.bind("probe")));
    metrics
}

/// Every series name nodewarden exports, from the `# TYPE` lines of its
/// OpenMetrics text: a counter `x` is scraped as `x_total`, a histogram as
/// `x_bucket`, `x_sum` and `x_count`.
fn exported_series() -> BTreeSet<String> {
    let text = populated_metrics().encode();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let (Some(name), Some(kind)) = (words.next(), words.next()) else {
            panic!("malformed TYPE line {line:?}");
        };
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_sum", "_count"],
            "gaugehistogram" => &["_bucket", "_gsum", "_gcount"],
            "summary" => &["", "_sum", "_count"],
            "info" => &["_info"],
            _ => &[""],
        };
        for suffix in suffixes {
            names.insert(format!("{name}{suffix}"));
        }
    }
    assert!(
        names.contains("nodewarden_leader"),
        "no nodewarden_leader among the exported metrics:\n{text}"
    );
    names
}

/// The `nodewarden_...` metric names in a PromQL expression: the whole
/// identifiers (runs of `[A-Za-z0-9_:]`) that begin with the prefix.
fn metric_names(expr: &str) -> BTreeSet<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|word| word.starts_with("nodewarden_"))
        .map(str::to_string)
        .collect()
}

/// `where: name` for every name in `exprs` that nodewarden does not export.
fn unknown_metrics<'a>(exprs: impl IntoIterator<Item = (String, &'a str)>) -> Vec<String> {
    let exported = exported_series();
    let mut unknown = Vec::new();
    for (place, expr) in exprs {
        for name in metric_names(expr) {
            if !exported.contains(&name) {
                unknown.push(format!("{place}: {name}"));
            }
        }
    }
    unknown
}

#[test]
fn metric_names_and_durations_are_read_as_prometheus_does() {
    let names = metric_names(
        "sum(rate(nodewarden_reconciles_total[5m])) / nodewarden_leader \
         and my_nodewarden_x and nodewarden_a:b",
    );
    let want: BTreeSet<String> = [
        "nodewarden_reconciles_total",
        "nodewarden_leader",
        "nodewarden_a:b",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(names, want);
    for good in ["5m", "1h30m", "90s", "500ms"] {
        assert!(is_prometheus_duration(good), "{good}");
    }
    for bad in ["", "5", "m", "5 m", "1.5h"] {
        assert!(!is_prometheus_duration(bad), "{bad}");
    }
}

#[test]
fn alert_rules_are_complete_and_use_exported_metrics() {
    let alerts = single_document("observability/alerts.yaml");
    let groups = alerts["groups"].as_array().expect("alerts.yaml has groups");
    assert!(!groups.is_empty(), "alerts.yaml has no groups");
    let mut exprs = Vec::new();
    let mut seen = BTreeSet::new();
    let mut problems = Vec::new();
    for group in groups {
        let group_name = group["name"].as_str().expect("every group has a name");
        let rules = group["rules"]
            .as_array()
            .unwrap_or_else(|| panic!("group {group_name} has no rules"));
        for (i, rule) in rules.iter().enumerate() {
            let Some(alert) = rule["alert"].as_str() else {
                problems.push(format!("{group_name} rule {i} is not an alerting rule"));
                continue;
            };
            assert!(seen.insert(alert.to_string()), "alert {alert} is defined twice");
            let expr = rule["expr"].as_str().unwrap_or_default();
            if expr.trim().is_empty() {
                problems.push(format!("{alert}: no expr"));
            }
            exprs.push((alert.to_string(), expr));
            match rule["for"].as_str() {
                Some(d) if is_prometheus_duration(d) => {}
                other => problems.push(format!("{alert}: `for` should be a duration, found {other:?}")),
            }
            match rule["labels"]["severity"].as_str() {
                Some("critical" | "warning" | "info") => {}
                other => problems.push(format!("{alert}: labels.severity {other:?}")),
            }
            for annotation in ["summary", "description", "runbook"] {
                if rule["annotations"][annotation]
                    .as_str()
                    .is_none_or(|s| s.trim().is_empty())
                {
                    problems.push(format!("{alert}: no annotations.{annotation}"));
                }
            }
        }
    }
    for wanted in [
        "NodewardenRolloutStuck",
        "NodewardenDrainBlocked",
        "NodewardenNoLeader",
        "NodewardenMultipleLeaders",
        "NodewardenReconcileErrors",
        "NodewardenCloudErrors",
        "NodewardenPlanFailed",
        "NodewardenSIPClusterShort",
    ] {
        if !seen.contains(wanted) {
            problems.push(format!("no alert {wanted}"));
        }
    }
    assert!(problems.is_empty(), "alerts.yaml:\n{}", problems.join("\n"));

    let unknown = unknown_metrics(exprs.iter().map(|(a, e)| (a.clone(), *e)));
    assert!(
        unknown.is_empty(),
        "alerts.yaml names metrics nodewarden does not export:\n{}\nexported: {:?}\n\
         (a family of Metrics that populated_metrics() gives no series is not listed)",
        unknown.join("\n"),
        exported_series()
    );
}

/// `5m`, `1h30m`, `90s`: Prometheus' duration syntax.
fn is_prometheus_duration(s: &str) -> bool {
    const UNITS: [&str; 7] = ["ms", "y", "w", "d", "h", "m", "s"];
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        let Some(unit) = UNITS.iter().find(|u| rest.starts_with(**u)) else {
            return false;
        };
        rest = &rest[unit.len()..];
    }
    !s.is_empty()
}

/// Every string under one of `keys` anywhere in `value`, with its JSON path.
fn strings_under(value: &Value, keys: &[&str], path: String, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let here = format!("{path}/{k}");
                if let (true, Some(s)) = (keys.contains(&k.as_str()), v.as_str()) {
                    out.push((here.clone(), s.to_string()));
                }
                strings_under(v, keys, here, out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                strings_under(v, keys, format!("{path}/{i}"), out);
            }
        }
        _ => {}
    }
}

fn dashboard() -> Value {
    let path = repo_path("observability/grafana-dashboard.json");
    let text = std::fs::read_to_string(&path).expect("reading grafana-dashboard.json");
    serde_json::from_str(&text).expect("grafana-dashboard.json is valid JSON")
}

#[test]
fn dashboard_queries_use_exported_metrics() {
    let dashboard = dashboard();
    let mut queries = Vec::new();
    // Panel targets (`expr`) and template variable queries.
    strings_under(
        &dashboard,
        &["expr", "query", "definition"],
        String::new(),
        &mut queries,
    );
    let exprs = queries.iter().filter(|(p, _)| p.ends_with("/expr")).count();
    assert!(exprs >= 10, "only {exprs} panel queries in the dashboard");

    let unknown = unknown_metrics(queries.iter().map(|(p, q)| (p.clone(), q.as_str())));
    assert!(
        unknown.is_empty(),
        "grafana-dashboard.json names metrics nodewarden does not export:\n{}\nexported: {:?}\n\
         (a family of Metrics that populated_metrics() gives no series is not listed)",
        unknown.join("\n"),
        exported_series()
    );
}

#[test]
fn dashboard_takes_its_datasource_from_a_variable() {
    let dashboard = dashboard();
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list");
    assert!(
        variables
            .iter()
            .any(|v| v["name"] == "datasource" && v["type"] == "datasource" && v["query"] == "prometheus"),
        "no Prometheus data-source variable `datasource`"
    );
    let mut uids = Vec::new();
    strings_under(&dashboard, &["uid"], String::new(), &mut uids);
    for (path, uid) in &uids {
        let is_datasource = path.ends_with("/datasource/uid");
        let grafana_builtin = uid == "-- Grafana --";
        if is_datasource && !grafana_builtin {
            assert_eq!(uid, "${datasource}", "{path} names a fixed data source");
        }
    }

    let panels = dashboard["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    for panel in panels {
        let id = panel["id"].as_u64().expect("every panel has an id");
        assert!(ids.insert(id), "panel id {id} is used twice");
    }
    // The reconcile latency panel shows exemplars (they carry trace_id).
    assert!(
        panels
            .iter()
            .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
            .any(|t| {
                t["exemplar"] == true
                    && t["expr"]
                        .as_str()
                        .is_some_and(|e| e.contains("nodewarden_reconcile_duration_seconds_bucket"))
            }),
        "no reconcile-duration query with exemplars enabled"
    );
}
