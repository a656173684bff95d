# nodewarden tasks. `just --list` shows them all.

set shell := ["bash", "-euo", "pipefail", "-c"]

# The local control plane's run directory (certificates, kubeconfig, logs).
run_dir := env_var_or_default("NODEWARDEN_RUN_DIR", justfile_directory() / ".run/cluster")

default:
    @just --list

# A rolling OS-image upgrade of 12 kwok nodes by 3 nodewarden replicas (leader killed midway), live.
demo: build
    e2e/demo/demo.sh run

# Stop what `just demo` left running: its control plane, Jaeger, replicas and sim-cloud.
demo-down:
    e2e/demo/demo.sh down

# The test build is linted as it compiles: clippy-driver wraps rustc for the
# workspace's crates as `cargo clippy` runs it, warnings denied (CLIPPY_ARGS in
# cargo-clippy's own encoding). One compilation of the dependencies serves
# clippy and the tests; `cargo clippy` beside `cargo test` compiles them a
# second time, in check mode (about 3 minutes of CPU on a cold build). The
# wrapper is part of the artifacts' hash, so they sit beside a plain `cargo
# test`'s and switching between the two rebuilds nothing.
linted := "RUSTC_WORKSPACE_WRAPPER=clippy-driver CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"

# Everything CI checks: formatting, clippy (warnings denied), unit and integration tests.
test: lint-sources test-build check-crds
    #!/usr/bin/env bash
    set -euo pipefail
    # A control plane of its own, so a running demo cluster is left alone.
    export NODEWARDEN_RUN_DIR="{{justfile_directory()}}/.run/test"
    trap 'e2e/controlplane/cluster.sh down' EXIT
    e2e/controlplane/cluster.sh up >/dev/null
    # Jaeger (built from Go modules, cached) receives the production test's traces.
    e2e/jaeger/build.sh >/dev/null
    # helm (built from its Go module, cached) lints and renders charts/nodewarden (tests/it/chart.rs).
    e2e/helm/build.sh >/dev/null
    # The Compute fake (built from its Go module, cached) plays GCP (tests/it/gcp.rs).
    e2e/gcefake/build.sh >/dev/null
    # The ARM fake (built from its Go module, cached) plays Azure (tests/it/azure.rs).
    e2e/azurefake/build.sh >/dev/null
    # Every test binary runs whatever fails before it; the failures are
    # listed again at the end, by binary, so none hides in the output.
    mkdir -p .run/test
    log=.run/test/cargo-test.log
    status=0
    # The integration tests in two groups: the modules whose tests bound a time
    # (a leader's failover or handover, admission answered through a leader
    # kill, fenced late writes, cloud calls per window, a private control
    # plane's restart) run after the others, two at a time; the others four
    # at a time (278 s; 623 s at two). The twelve-node rollout judges its
    # surge by what was in flight at once, not by comparing two rollouts'
    # times, which a loaded machine can reverse. A new module with a time
    # bound is added here.
    timed=(leader_election:: handover:: controller:: admission_ha:: admission_hardening::
      aws_ha:: cloud_ha:: plans_ha:: sip_ha:: production:: late_writes:: event_filtering:: reflector::)
    # The filters name modules of tests/it only: every other target (unit
    # tests, the chaos runs, the benches' quick mode) runs apart from them,
    # one binary after another (the chaos runs restart kube-apiserver).
    others=(--lib --bins --benches)
    for t in tests/*.rs; do others+=(--test "$(basename "$t" .rs)"); done
    {{linted}} cargo test --workspace "${others[@]}" --no-fail-fast 2>&1 | tee "$log" || status=$?
    {{linted}} cargo test --test it -- --test-threads=4 "${timed[@]/#/--skip=}" 2>&1 | tee -a "$log" || status=$?
    {{linted}} cargo test --test it -- --test-threads=2 "${timed[@]}" 2>&1 | tee -a "$log" || status=$?
    if [ "$status" -ne 0 ]; then
      python3 e2e/tools/test-failures.py "$log" || true
      echo "== failed tests (whole output in $log) =="
      awk '/^ +Running /{binary=$2} / \.\.\. FAILED$/{print "  " binary ": " $2} /^error: [0-9]+ targets? failed/{summary=1} summary' "$log"
    fi
    exit "$status"

# The chaos runs once per seed: a rollout (tests/chaos.rs) and storms of maintenances, Plans and SIPClusters (tests/chaos_storms.rs) by 3 replicas while every fault strikes; logs in .run/chaos/.
chaos seeds="1 2 3 4 5 6 7 8 9 10":
    #!/usr/bin/env bash
    set -euo pipefail
    export NODEWARDEN_RUN_DIR="{{justfile_directory()}}/.run/test"
    trap 'e2e/controlplane/cluster.sh down' EXIT
    e2e/controlplane/cluster.sh up >/dev/null
    e2e/jaeger/build.sh >/dev/null
    {{linted}} cargo test --no-run --test chaos --test chaos_storms 2>/dev/null
    mkdir -p .run/chaos
    failed=0
    for seed in {{seeds}}; do
      for run in chaos chaos_storms; do
        log=".run/chaos/$run-seed-$seed.log"
        if NODEWARDEN_SEED=$seed {{linted}} cargo test --test "$run" -- --nocapture >"$log" 2>&1; then verdict=passed; else verdict=FAILED; failed=1; fi
        echo "$run seed $seed: $verdict — $(grep -m1 '^chaos.*seed [0-9]*:' "$log" || grep -m1 'panicked' -A1 "$log" | tail -n 1)"
      done
    done
    exit $failed

# rustfmt check and clippy with warnings denied, and every check of lint-sources.
lint: lint-sources
    cargo clippy --workspace --all-targets -- -D warnings

# shellcheck (pinned, cached outside the repository) on the e2e and CI scripts and the scripts nodewarden ships (src), and no pipe into a reader that stops early (exit 141 at random under pipefail); no import cycle between the library's modules, and no tool crate used by the library or the operator's binary; no function of 80 lines or more outside the tests and the pure planners; rustfmt check.
lint-sources:
    e2e/tools/shellcheck.sh --external-sources $(find e2e src -name '*.sh' | sort) .ci/run
    python3 e2e/tools/early-exit-pipes.py $(find e2e src -name '*.sh' | sort) .ci/run Justfile
    python3 e2e/tools/module-cycles.py src
    if grep -rnE 'nodewarden_(simcloud|timeline)' src --include='*.rs' --exclude-dir=bin; then echo "the library and the operator's binary must not use the tools' crates"; exit 1; fi
    python3 e2e/tools/function-length.py src crates
    cargo fmt --all -- --check

# Every test binary (unit, integration, chaos, the benches' quick mode), built with clippy's lints and warnings denied.
test-build *cargo_args:
    {{linted}} cargo test --workspace --all-targets --no-run {{cargo_args}}

# Build nodewarden and its tools' binaries, nodewarden-simcloud and nodewarden-timeline (debug).
build:
    cargo build

# Build (or find cached) the Go-built control-plane binaries; prints their directory.
controlplane-build:
    e2e/controlplane/build.sh

# Start etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok on loopback.
cluster-up:
    NODEWARDEN_RUN_DIR="{{run_dir}}" e2e/controlplane/cluster.sh up

# Stop exactly the processes cluster-up started.
cluster-down:
    NODEWARDEN_RUN_DIR="{{run_dir}}" e2e/controlplane/cluster.sh down

# Show each control-plane component and its pid.
cluster-status:
    NODEWARDEN_RUN_DIR="{{run_dir}}" e2e/controlplane/cluster.sh status

# kubectl (the pinned build) against the local control plane.
kubectl *args:
    "$(cat "{{run_dir}}/bin-dir")/kubectl" --kubeconfig "{{run_dir}}/kubeconfig" {{args}}

# The container image without Docker: static (musl) binaries and the pinned CA bundle in an OCI archive, target/image/nodewarden-<version>-linux-<arch>.oci.tar, named ghcr.io/nodewarden/nodewarden:<version> (docker load, kind load image-archive, skopeo copy oci-archive:...). arm64 needs a C cross compiler (e2e/image/build.sh).
image arch="amd64":
    e2e/image/build.sh {{arch}}

# Check the image `just image` wrote: go-containerregistry validates it as an OCI layout and as a docker-save tarball; user 65532, entrypoint, no shell, static binaries, the Dockerfile's layout; the binaries run from the unpacked root.
image-check arch="amd64":
    e2e/image/check.sh {{arch}}

# Regenerate manifests/base/crds.yaml (and the chart's copy) from the Rust types (run with the test profile: the binary `cargo test` builds, not a second build of the library, 50 s on two cores).
crds:
    {{linted}} cargo run --profile test --quiet -- crds > manifests/base/crds.yaml
    cp manifests/base/crds.yaml charts/nodewarden/crds/crds.yaml

# Fail when manifests/base/crds.yaml differs from what the Rust types generate.
check-crds:
    diff -u manifests/base/crds.yaml <({{linted}} cargo run --profile test --quiet -- crds) || { echo "manifests/base/crds.yaml is stale: run 'just crds'"; exit 1; }

# The Helm chart: `helm lint --strict` (helm pinned in e2e/helm, built into the cache) and `helm template` of every cloud × webhook-certificates choice (tests/it/chart.rs checks what they render).
chart:
    #!/usr/bin/env bash
    set -euo pipefail
    helm=$(e2e/helm/build.sh)
    "$helm" lint --strict charts/nodewarden
    for cloud in none aws sim; do
      for certificates in own cert-manager off; do
        "$helm" template nodewarden charts/nodewarden --namespace nodewarden-system \
          --set cloud.provider=$cloud,webhook.certificates=$certificates \
          --set cloud.aws.region=us-east-1,cloud.aws.clusterUID=example-uid >/dev/null
        echo "chart: cloud $cloud, certificates $certificates: renders"
      done
    done

# Benchmarks (criterion) printing their figures.
bench:
    cargo bench --bench workqueue --bench store --bench trace

# Leader failover with production's election flags (benches/failover.rs): SIGTERM and SIGKILL of the leader, timed to the new leader's first reconcile.
bench-failover:
    #!/usr/bin/env bash
    set -euo pipefail
    export NODEWARDEN_RUN_DIR="{{justfile_directory()}}/.run/test"
    trap 'e2e/controlplane/cluster.sh down' EXIT
    e2e/controlplane/cluster.sh up >/dev/null
    cargo bench --bench failover 2>/dev/null | grep '^failover:'

# 1 and 20 NodeMaintenances on PDB-guarded nodes, nodewarden vs the Node Maintenance Operator v0.17.0 built from its Go module (benches/drains.rs).
bench-drains:
    #!/usr/bin/env bash
    set -euo pipefail
    export NODEWARDEN_RUN_DIR="{{justfile_directory()}}/.run/test"
    trap 'e2e/controlplane/cluster.sh down' EXIT
    e2e/controlplane/cluster.sh up >/dev/null
    e2e/nmo/build.sh >/dev/null
    cargo bench --bench drains 2>/dev/null | grep '^drains:'

# The six scale figures in one table, each beside its target: thousands of kwok nodes watched by nodewarden and the Node Maintenance Operator v0.17.0 at once (time to serve, RSS, CPU, queue waits under churn, a kube-apiserver restart), 20 drains vs the peer's, rollouts at maxSurge 1/3/10, leader failover. One control plane of its own; table, JSON and SVG charts in .run/bench-scale/. `just bench-scale scale` runs only the first part.
bench-scale parts="scale drains rollout failover":
    #!/usr/bin/env bash
    set -euo pipefail
    export NODEWARDEN_RUN_DIR="{{justfile_directory()}}/.run/scale"
    trap 'e2e/controlplane/cluster.sh down' EXIT
    e2e/nmo/build.sh >/dev/null
    e2e/jaeger/build.sh >/dev/null
    mkdir -p .run/bench-scale
    # One build for the whole run, before anything is measured.
    cargo bench --no-run $(printf -- '--bench %s ' {{parts}} report) 2>&1 | tail -n 1
    for part in {{parts}}; do
      # A fresh control plane for each part: what the 5,000 nodes leave
      # behind (their pods being collected) slowed the drains after them.
      e2e/controlplane/cluster.sh down >/dev/null
      e2e/controlplane/cluster.sh up >/dev/null
      log=".run/bench-scale/$part.log"
      # Each figure as it is measured (the scale part alone takes about 25 minutes).
      if ! cargo bench --bench "$part" 2>&1 | tee "$log" | grep --line-buffered "^$part:"; then
        tail -n 40 "$log"
        echo "bench-scale: $part failed; its whole output is in $log" >&2
        exit 1
      fi
    done
    cargo bench --bench report 2>/dev/null | grep '^report:'

# End to end as users run it: nodewarden installed by `helm install` from its image (3 replicas, webhook through its Service, traces in Jaeger), then a rollout with a leader kill, a Plan, a drain of the leader's own node, helm upgrade and uninstall. On real nodes of this machine (e2e/nodes: kubelets with containerd, as root), or on kind where Docker and kind answer; NODEWARDEN_E2E_CLUSTER=nodes|kind picks.
e2e:
    #!/usr/bin/env bash
    set -euo pipefail
    cluster=${NODEWARDEN_E2E_CLUSTER:-}
    if [ -z "$cluster" ]; then
      cluster=nodes
      if command -v kind >/dev/null 2>&1 && docker info >/dev/null 2>&1; then cluster=kind; fi
    fi
    case "$cluster" in
      nodes|kind) exec "e2e/$cluster/run.sh" ;;
      *) echo "NODEWARDEN_E2E_CLUSTER must be nodes or kind" >&2; exit 2 ;;
    esac

# The local cluster with real nodes that `just e2e` uses, kept running (e2e/nodes/cluster.sh up; as root).
nodes-up:
    e2e/nodes/cluster.sh up

# Stop the real nodes and their control plane, and undo their network changes.
nodes-down:
    e2e/nodes/cluster.sh down

# 30 sim-cloud nodes rolled at maxSurge 1, 3 and 10, each timed against the ideal the simulated boot and join delays allow (benches/rollout.rs).
bench-rollout:
    #!/usr/bin/env bash
    set -euo pipefail
    export NODEWARDEN_RUN_DIR="{{justfile_directory()}}/.run/test"
    trap 'e2e/controlplane/cluster.sh down' EXIT
    e2e/controlplane/cluster.sh up >/dev/null
    e2e/jaeger/build.sh >/dev/null
    cargo bench --bench rollout 2>/dev/null | grep '^rollout:'
