//! The README's "Install on a cluster", run on a fresh clone as far as a
//! control plane without kubelets allows. Every command of the section's
//! `bash` blocks is either run here or named as needing what this machine
//! has not (Docker, kind, a registry, pods that run); a command the
//! walk-through does not know fails the test, so the README cannot drift
//! from what is checked.
//!
//! - `helm install|upgrade` with the README's flags: rendered by the pinned
//!   helm into the test's namespace (release named for the test, so its
//!   cluster-wide objects are its own), every object server-side dry-run;
//!   the first one without a cloud is applied and its Deployment's container
//!   run as one replica with a token of the rendered ServiceAccount
//!   (`chart::run_as_rendered`).
//! - `kubectl apply -k <dir>`: the kustomization rendered, every object
//!   server-side dry-run (namespaces applied for real, idempotent).
//! - `just image` and `just image-check` are run by `.ci/run` itself.

use crate::support;

use std::path::PathBuf;

use serde_json::Value;

use crate::chart::{ReleaseObjects, run_as_rendered};
use crate::support::TestEnv;
use crate::support::chart::helm;
use crate::support::manifests::{Applied, apply, describe, gvk_of, is_namespace, kustomize, to_object};

const SECTION: &str = "## Install on a cluster";

/// API groups a cluster may lack (the chart's optional objects).
const OPTIONAL_GROUPS: [&str; 2] = ["monitoring.coreos.com", "cert-manager.io"];

/// One command of the walk-through, and what the test does with it.
#[derive(Debug, PartialEq)]
enum Step {
    /// `helm install|upgrade`: the flags after the release name and chart.
    Helm { chart: PathBuf, flags: Vec<String> },
    /// `kubectl apply -k DIR`.
    Kustomize(PathBuf),
    /// Not run here, and why.
    Elsewhere(&'static str),
}

/// The commands of the section's `bash` blocks: continuation lines joined,
/// comments and blank lines dropped.
fn commands(readme: &str) -> Vec<String> {
    let start = readme
        .find(&format!("\n{SECTION}\n"))
        .unwrap_or_else(|| panic!("README.md has no section {SECTION:?}"));
    let section = &readme[start + SECTION.len() + 2..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let mut commands = Vec::new();
    let mut in_block = false;
    let mut current = String::new();
    for line in section.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            in_block = !in_block && trimmed == "```bash";
            continue;
        }
        if !in_block || (current.is_empty() && (trimmed.is_empty() || trimmed.starts_with('#'))) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => current.push_str(part),
            None => {
                current.push_str(trimmed);
                commands.push(std::mem::take(&mut current));
            }
        }
    }
    commands
}

/// Shell words, with '…' and "…" quoting; `$VAR` and `${VAR}` become
/// `example-var` (the README's placeholders: a registry, a cluster tag).
fn words(command: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quote = None;
    let mut chars = command.chars().peekable();
    let mut started = false;
    while let Some(c) = chars.next() {
        match (quote, c) {
            (None, ' ' | '\t') => {
                if started {
                    out.push(std::mem::take(&mut word));
                    started = false;
                }
            }
            (None, '\'' | '"') => {
                quote = Some(c);
                started = true;
            }
            (Some(q), c) if c == q => quote = None,
            (q, '$') if q != Some('\'') => {
                let braced = chars.next_if_eq(&'{').is_some();
                let mut name = String::new();
                while let Some(c) = chars.next_if(|c| c.is_ascii_alphanumeric() || *c == '_') {
                    name.push(c);
                }
                if braced {
                    chars.next_if_eq(&'}');
                }
                word.push_str(&format!("example-{}", name.to_lowercase().replace('_', "-")));
                started = true;
            }
            (_, c) => {
                word.push(c);
                started = true;
            }
        }
    }
    if started {
        out.push(word);
    }
    out
}

fn classify(command: &str) -> Result<Step, String> {
    let w = words(command);
    let w: Vec<&str> = w.iter().map(String::as_str).collect();
    Ok(match w.as_slice() {
        ["just", "image" | "image-check", ..] => {
            Step::Elsewhere(".ci/run runs just image and just image-check")
        }
        ["docker" | "kind" | "skopeo", ..] => Step::Elsewhere("needs Docker, kind or a registry"),
        ["kustomize", "edit", ..] | ["cd", ..] | ["mkdir", ..] | ["cat", ..] => {
            Step::Elsewhere("edits the user's own overlay")
        }
        ["kubectl", "apply", rest @ ..] => {
            let dir = rest
                .iter()
                .position(|a| *a == "-k")
                .and_then(|i| rest.get(i + 1))
                .ok_or_else(|| format!("kubectl apply without -k DIR: {command}"))?;
            Step::Kustomize(PathBuf::from(dir))
        }
        ["kubectl", ..] => Step::Elsewhere("reads the running Deployment"),
        ["helm", "install" | "upgrade", _release, chart, flags @ ..] => Step::Helm {
            chart: PathBuf::from(chart),
            flags: flags.iter().map(|f| f.to_string()).collect(),
        },
        [
            "helm",
            "status" | "get" | "list" | "history" | "rollback" | "uninstall",
            ..,
        ] => Step::Elsewhere("reads or changes an installed release"),
        _ => return Err(format!("a command the walk-through does not know: {command}")),
    })
}

/// `helm template` of a README `helm install` into the test's namespace.
/// --namespace is the test's; --create-namespace, --wait and --timeout
/// concern a real install only.
fn render(
    env: &TestEnv,
    release: &str,
    chart: &std::path::Path,
    flags: &[String],
    overrides: &[String],
) -> Vec<Value> {
    let mut args: Vec<String> = vec![
        "template".into(),
        release.into(),
        chart.to_string_lossy().into(),
        "--include-crds".into(),
    ];
    let mut skip_next = false;
    for flag in flags {
        if std::mem::take(&mut skip_next) {
            continue;
        }
        match flag.as_str() {
            "--namespace" | "-n" | "--timeout" => skip_next = true,
            "--create-namespace" | "--wait" | "--atomic" => {}
            f if f.starts_with("--namespace=") || f.starts_with("--timeout=") => {}
            f => args.push(f.to_string()),
        }
    }
    args.extend(["--namespace".into(), env.namespace.clone()]);
    args.extend(overrides.iter().cloned());
    let out = std::process::Command::new(helm())
        .args(&args)
        .current_dir(support::repo())
        .output()
        .expect("running helm");
    assert!(
        out.status.success(),
        "helm {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| <Value as serde::Deserialize>::deserialize(doc).expect("helm printed YAML"))
        .filter(|d| !d.is_null())
        .collect()
}

async fn dry_run(env: &TestEnv, what: &str, docs: &[Value], failures: &mut Vec<String>) {
    for (i, doc) in docs.iter().enumerate() {
        let obj = to_object(what, i, doc.clone());
        match apply(&env.client, &obj, !is_namespace(&obj)).await {
            Ok(Applied::Done(_)) => {}
            Ok(Applied::NotServed(_)) if OPTIONAL_GROUPS.contains(&gvk_of(&obj).group.as_str()) => {}
            Ok(Applied::NotServed(e)) | Err(e) => failures.push(format!("{}: {e}", describe(what, &obj))),
        }
    }
}

#[test]
fn the_walk_through_reads_every_kind_of_command() {
    let cases = [
        (
            "just image",
            Step::Elsewhere(".ci/run runs just image and just image-check"),
        ),
        (
            "helm install nodewarden charts/nodewarden --namespace nodewarden-system --set image.repository=$REGISTRY/nodewarden",
            Step::Helm {
                chart: "charts/nodewarden".into(),
                flags: [
                    "--namespace",
                    "nodewarden-system",
                    "--set",
                    "image.repository=example-registry/nodewarden",
                ]
                .map(String::from)
                .to_vec(),
            },
        ),
        (
            "kubectl apply --server-side -k manifests/aws",
            Step::Kustomize("manifests/aws".into()),
        ),
        (
            "kubectl -n nodewarden-system get lease nodewarden",
            Step::Elsewhere("reads the running Deployment"),
        ),
    ];
    for (command, want) in cases {
        assert_eq!(classify(command), Ok(want), "{command}");
    }
    assert!(classify("curl https://example.com | sh").is_err());
    assert_eq!(words("a 'b c' \"d ${X_Y}\""), ["a", "b c", "d example-x-y"]);
    let readme = "# x\n## Install on a cluster\n```bash\n# c\nhelm install a b \\\n  --set x=1\n```\n```yaml\nk: v\n```\n## Next\n```bash\nno\n```\n";
    assert_eq!(commands(readme), ["helm install a b --set x=1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_install_steps_render_dry_run_and_run_a_replica() {
    let readme = std::fs::read_to_string(support::repo().join("README.md")).expect("README.md");
    let steps: Vec<(String, Step)> = commands(&readme)
        .into_iter()
        .map(|c| {
            let step = classify(&c).unwrap_or_else(|e| panic!("{e}"));
            (c, step)
        })
        .collect();
    let env = TestEnv::new("install").await;
    support::install_crds(&env.client).await;
    support::apply_manifest(
        &env.client,
        &support::repo().join("manifests/base/namespace.yaml"),
    )
    .await;

    let (mut failures, mut ran, mut replica) = (Vec::new(), 0, false);
    for (i, (command, step)) in steps.iter().enumerate() {
        match step {
            Step::Elsewhere(why) => println!("not run here ({why}): {command}"),
            Step::Kustomize(dir) => {
                let docs = kustomize(&support::repo().join(dir));
                dry_run(&env, &format!("step {i}"), &docs, &mut failures).await;
                println!("dry-run {} objects: {command}", docs.len());
                ran += 1;
            }
            Step::Helm { chart, flags } => {
                let release = format!("nodewarden-{}", env.id);
                let docs = render(&env, &release, chart, flags, &[]);
                dry_run(&env, &format!("step {i}"), &docs, &mut failures).await;
                println!("rendered and dry-run {} objects: {command}", docs.len());
                ran += 1;
                let cloud = flags
                    .iter()
                    .any(|f| f.contains("cloud.provider=") && !f.contains("cloud.provider=none"));
                if !replica && !cloud {
                    // One replica, managing only the test's objects, the
                    // maintenance Lease namespace left as the base made it.
                    // A values file: the selector needs no --set escaping.
                    let selector = env.run_selector();
                    let values = tempfile::Builder::new()
                        .suffix(".yaml")
                        .tempfile()
                        .expect("a values file");
                    let isolate = serde_json::json!({
                        "replicas": 1,
                        "manage": {"nodes": selector, "objects": selector},
                        "maintenance": {"createLeaseNamespace": false},
                    });
                    std::fs::write(values.path(), isolate.to_string()).expect("writing the values");
                    let overrides = [
                        "--values".to_string(),
                        values.path().to_string_lossy().into_owned(),
                    ];
                    let _made = ReleaseObjects(release.clone());
                    let docs = render(&env, &release, chart, flags, &overrides);
                    run_as_rendered(&env, &release, &docs).await;
                    println!("ran one replica as the rendered Deployment: {command}");
                    replica = true;
                }
            }
        }
    }
    env.cleanup().await;
    assert!(
        failures.is_empty(),
        "the walk-through's objects fail a dry run:\n{}",
        failures.join("\n")
    );
    assert!(
        ran >= 2,
        "the walk-through renders at least a Helm release and a kustomization: {steps:?}"
    );
    assert!(
        replica,
        "a Helm install without a cloud is run as a replica: {steps:?}"
    );
}
