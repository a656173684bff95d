#!/usr/bin/env bash
# `just demo`: a rolling OS-image upgrade of a dozen nodes by three nodewarden
# replicas on the local control plane, with the leader killed midway.
#
#   demo.sh run    start (or reuse) the control plane and Jaeger, create 12 sim-cloud
#                  nodes and a workload, run 3 replicas as the ServiceAccount, roll
#                  every node to a new image while showing the progress live, SIGKILL
#                  the leader halfway, then print a summary with the trace IDs
#   demo.sh down   stop everything the demo left: replicas, sim-cloud, Jaeger, control plane
#
# Everything lives in NODEWARDEN_DEMO_DIR (default <repo>/.run/demo): the control plane
# in cluster/ (its own, not .run/cluster or .run/test), Jaeger in jaeger/, and the last
# run's logs, pids, sim-cloud state and the ServiceAccount kubeconfig in run/.
# At the end the replicas and the sim-cloud are stopped; the control plane (with the
# nodes and the workload) and Jaeger stay up for exploring until `demo.sh down`.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
demo_dir=${NODEWARDEN_DEMO_DIR:-$repo/.run/demo}
export NODEWARDEN_RUN_DIR=$demo_dir/cluster
jaeger_dir=$demo_dir/jaeger
run=$demo_dir/run
bin_dir=${CARGO_TARGET_DIR:-$repo/target}/debug
nodewarden=$bin_dir/nodewarden
simcloud=$bin_dir/nodewarden-simcloud
timeline=$bin_dir/nodewarden-timeline

# The scenario.
LABEL_KEY=nodewarden.dev/demo
LABEL=$LABEL_KEY=true
CP_GROUP=demo-control-plane CP_NODES=3
WORKER_GROUP=demo-workers WORKER_NODES=9
TOTAL=$((CP_NODES + WORKER_NODES))
OLD_IMAGE=os-2026.10 NEW_IMAGE=os-2026.11 SURGE=2
NV=demo-version
WORKLOAD_NS=nodewarden-demo WORKLOAD=web WORKLOAD_REPLICAS=12
SYSTEM_NS=nodewarden-system LEASE=nodewarden
REPLICAS=3
ROLLOUT_TIMEOUT=${NODEWARDEN_DEMO_TIMEOUT:-600}

log_tag=demo
poll_interval=0.5 # retry_until polls twice a second: the demo is watched live
# shellcheck source-path=SCRIPTDIR source=../lib.sh
source "$here/../lib.sh"

# stop_pidfile FILE [EXE_NAME]: stops the process FILE names if it runs EXE_NAME
# (default nodewarden: a replica; nodewarden-simcloud: the sim-cloud).
stop_pidfile() { stop_pid "$(basename "$1" .pid)" "$1" "${2:-nodewarden}" || true; }

# stop_demo_processes: the replicas and the sim-cloud (this run's or a previous one's).
stop_demo_processes() {
  local f
  [ -d "$run" ] || return 0
  for f in "$run"/demo-*.pid; do [ -e "$f" ] && stop_pidfile "$f"; done
  stop_pidfile "$run/sim-cloud.pid" nodewarden-simcloud
}

down() {
  stop_demo_processes
  if [ -d "$jaeger_dir" ]; then "$repo/e2e/jaeger/run.sh" stop "$jaeger_dir"; fi
  if [ -d "$NODEWARDEN_RUN_DIR" ]; then "$repo/e2e/controlplane/cluster.sh" down; fi
  echo "demo: stopped (logs of the last run stay in $run)"
}

k() { "$kubectl" --kubeconfig "$NODEWARDEN_RUN_DIR/kubeconfig" "$@"; }

# remove KIND: deletes every demo-labelled object of KIND, finalizers first (no
# operator runs now that would remove them).
remove() {
  local kind=$1 name
  for name in $(k get "$kind" -l "$LABEL" -o name 2>/dev/null); do
    k patch "$name" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
    k delete "$name" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  done
}

# reset: the previous demo's objects go, so that a rerun starts from scratch.
reset_objects() {
  k delete namespace "$WORKLOAD_NS" --ignore-not-found --timeout=90s >/dev/null
  remove nodemaintenances.nodemaintenance.medik8s.io
  remove pendingnodes.update.edgeless.systems
  remove joiningnodes.update.edgeless.systems
  remove scalinggroups.update.edgeless.systems
  remove nodeversions.update.edgeless.systems
  k delete nodes -l "$LABEL" --ignore-not-found >/dev/null
  k -n "$SYSTEM_NS" delete lease "$LEASE" --ignore-not-found >/dev/null
  local lease
  for lease in $(k -n medik8s-leases get leases -o name 2>/dev/null | grep "/node-demo-" || true); do
    k -n medik8s-leases delete "$lease" --ignore-not-found >/dev/null
  done
}

# service_account_kubeconfig: the replicas authenticate as the ServiceAccount of
# manifests/base/rbac.yaml (a 2 h token), exactly as the pods of the Deployment would.
service_account_kubeconfig() {
  local token
  token=$(k -n "$SYSTEM_NS" create token nodewarden --duration=2h)
  cat >"$run/nodewarden.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: demo
  cluster:
    server: https://127.0.0.1:$(cat "$NODEWARDEN_RUN_DIR/apiserver-port")
    certificate-authority-data: $(base64 -w0 "$NODEWARDEN_RUN_DIR/pki/ca.crt")
users:
- name: nodewarden
  user:
    token: $token
contexts:
- name: demo
  context: {cluster: demo, user: nodewarden}
current-context: demo
EOF
  chmod 600 "$run/nodewarden.kubeconfig"
}

start_sim_cloud() {
  local i
  cat >"$run/sim-cloud.yaml" <<EOF
groups:
  - id: $CP_GROUP
    role: ControlPlane
    initialSize: $CP_NODES
    image: $OLD_IMAGE
    bootDelay: 1s
    joinDelay: 1s
    deleteDelay: 1s
    labels: {$LABEL_KEY: "true", topology.kubernetes.io/zone: zone-a}
  - id: $WORKER_GROUP
    role: Worker
    initialSize: $WORKER_NODES
    image: $OLD_IMAGE
    bootDelay: 1s
    joinDelay: 1s
    deleteDelay: 1s
    labels: {$LABEL_KEY: "true", topology.kubernetes.io/zone: zone-b}
EOF
  rm -f "$run/sim-state.json"
  "$simcloud" --log-json --config "$run/sim-cloud.yaml" --state "$run/sim-state.json" \
    --listen 127.0.0.1:0 --kubeconfig "$NODEWARDEN_RUN_DIR/kubeconfig" \
    >"$run/sim-cloud.out" 2>"$run/sim-cloud.log" </dev/null &
  echo $! >"$run/sim-cloud.pid"
  for i in $(seq 1 300); do
    sim_addr=$(sed -n 's/^listening on //p;T;q' "$run/sim-cloud.out")
    [ -n "$sim_addr" ] && return 0
    alive "$(cat "$run/sim-cloud.pid")" || { tail -n 20 "$run/sim-cloud.log" >&2; die "sim-cloud exited"; }
    sleep 0.1
  done
  die "sim-cloud did not say where it listens (see $run/sim-cloud.log)"
}

apply_workload() {
  k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata:
  name: $WORKLOAD_NS
  labels: {$LABEL_KEY: "true"}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: $WORKLOAD
  namespace: $WORKLOAD_NS
spec:
  replicas: $WORKLOAD_REPLICAS
  selector:
    matchLabels: {app: $WORKLOAD}
  template:
    metadata:
      labels: {app: $WORKLOAD}
    spec:
      nodeSelector: {$LABEL_KEY: "true", node-role.kubernetes.io/worker: ""}
      # kwok plays the kubelet: the image is never pulled.
      containers:
        - name: app
          image: registry.k8s.io/pause:3.10
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: $WORKLOAD
  namespace: $WORKLOAD_NS
spec:
  maxUnavailable: 1
  selector:
    matchLabels: {app: $WORKLOAD}
EOF
}

# scaling_group GROUP ROLE: the ScalingGroup (named as its sim-cloud group) on $NV.
scaling_group() {
  cat <<EOF
---
apiVersion: update.edgeless.systems/v1alpha1
kind: ScalingGroup
metadata:
  name: $1
  labels: {$LABEL_KEY: "true"}
spec: {nodeImage: $NV, groupId: $1, role: $2, autoscaling: false}
EOF
}

apply_node_version() {
  {
    cat <<EOF
apiVersion: update.edgeless.systems/v1alpha1
kind: NodeVersion
metadata:
  name: $NV
  labels: {$LABEL_KEY: "true"}
spec:
  image: $OLD_IMAGE
  rollout: {maxSurge: 1, maxUnavailable: 0}
EOF
    scaling_group "$CP_GROUP" ControlPlane
    scaling_group "$WORKER_GROUP" Worker
  } | k apply -f - >/dev/null
}

# spawn_replica I: one `nodewarden run`, as pod I of the 3-replica Deployment.
spawn_replica() {
  local i=$1
  "$nodewarden" --log-json run \
    --kubeconfig "$run/nodewarden.kubeconfig" \
    --lease-namespace "$SYSTEM_NS" --lease-name "$LEASE" --identity "demo-$i" \
    --lease-duration 3 --renew-deadline 2 --retry-period 0.5 \
    --http-addr "127.0.0.1:${http_ports[$i]}" \
    --node-selector "$LABEL" --object-selector "$LABEL" \
    --sim-cloud "$sim_addr" \
    >/dev/null 2>>"$run/demo-$i.log" </dev/null &
  echo $! >"$run/demo-$i.pid"
}

ready_nodes() {
  k get nodes -l "$LABEL" -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' 2>/dev/null |
    grep -c '^True$' || true
}
all_nodes_ready() { [ "$(ready_nodes)" -eq "$TOTAL" ]; }
workload_available() {
  [ "$(k -n "$WORKLOAD_NS" get deploy "$WORKLOAD" -o jsonpath='{.status.availableReplicas}' 2>/dev/null)" = "$WORKLOAD_REPLICAS" ]
}
have_leader() { [ -n "$(lease_holder "$SYSTEM_NS" "$LEASE" k)" ]; }
# The operator has seen every node on the current image (status written, Outdated=False).
node_version_settled() {
  local out
  out=$(k get nodeversion "$NV" -o jsonpath='{.status.upToDateNodes}/{.status.conditions[?(@.type=="Outdated")].status}' 2>/dev/null) || return 1
  [ "$out" = "$TOTAL/False" ]
}

# --- the demo ---------------------------------------------------------------

started_cluster=0 started_jaeger=0 finished=0 view_started=0 interrupted=0

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ "$view_started" = 1 ] && [ -t 1 ]; then tput cnorm 2>/dev/null || true; fi
  if [ "$finished" != 1 ]; then
    echo
    log "stopping the replicas and the sim-cloud (logs in $run)"
  fi
  stop_demo_processes
  if [ "$finished" != 1 ] && [ "$interrupted" = 0 ]; then
    log "failed; the control plane and Jaeger stay up for a look (KUBECONFIG=$NODEWARDEN_RUN_DIR/kubeconfig); 'just demo-down' stops them"
  elif [ "$finished" != 1 ]; then
    # Interrupted: stop what this run started; leave what it found running.
    if [ "$started_jaeger" = 1 ]; then "$repo/e2e/jaeger/run.sh" stop "$jaeger_dir" || true; fi
    if [ "$started_cluster" = 1 ]; then "$repo/e2e/controlplane/cluster.sh" down || true; fi
    local what=""
    if [ "$started_cluster" = 0 ] && [ "$started_jaeger" = 0 ]; then what="the control plane and Jaeger were"
    elif [ "$started_cluster" = 0 ]; then what="the control plane was"
    elif [ "$started_jaeger" = 0 ]; then what="Jaeger was"
    fi
    if [ -n "$what" ]; then log "$what running before this demo and still run: 'just demo-down' stops them"; fi
  fi
  exit "$rc"
}

demo() {
  local t0=$SECONDS
  trap cleanup EXIT
  trap 'interrupted=1; exit 130' INT
  trap 'interrupted=1; exit 143' TERM
  for binary in "$nodewarden" "$simcloud" "$timeline"; do
    [ -x "$binary" ] || { say "building nodewarden"; (cd "$repo" && cargo build --quiet); break; }
  done
  mkdir -p "$demo_dir"
  # A previous demo's replicas (if its script was killed) must not act on this one.
  stop_demo_processes
  rm -rf "$run"
  mkdir -p "$run"

  say "starting the local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok)"
  local status
  status=$("$repo/e2e/controlplane/cluster.sh" status 2>/dev/null || true)
  [[ "$status" == *"kube-apiserver running"* ]] || started_cluster=1
  "$repo/e2e/controlplane/cluster.sh" up >/dev/null 2>"$run/cluster-up.log" ||
    { cat "$run/cluster-up.log" >&2; die "the control plane did not start"; }
  kubectl="$(cat "$NODEWARDEN_RUN_DIR/bin-dir")/kubectl"

  say "starting Jaeger (OTLP/HTTP in, query API out)"
  if [ ! -f "$jaeger_dir/jaeger.pid" ] || ! alive "$(cat "$jaeger_dir/jaeger.pid")"; then
    started_jaeger=1
  fi
  "$repo/e2e/jaeger/run.sh" start "$jaeger_dir" 2>"$run/jaeger-start.log" ||
    { cat "$run/jaeger-start.log" >&2; die "Jaeger did not start"; }
  jaeger_query="http://127.0.0.1:$(cat "$jaeger_dir/query-port")"
  OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$(cat "$jaeger_dir/otlp-http-port")"
  export OTEL_EXPORTER_OTLP_ENDPOINT
  export OTEL_EXPORTER_OTLP_PROTOCOL=http/json OTEL_BSP_SCHEDULE_DELAY=200 RUST_LOG=info

  say "installing the CRDs, namespaces and RBAC; removing a previous demo's objects"
  # (kubectl's warnings about the CRDs' schema formats are noise here; errors still show.)
  k apply --server-side --force-conflicts -f "$repo/manifests/base/crds.yaml" >/dev/null 2>"$run/crds.log" ||
    { cat "$run/crds.log" >&2; die "installing the CRDs failed"; }
  k wait --for condition=established --timeout=60s -f "$repo/manifests/base/crds.yaml" >/dev/null
  k apply -f "$repo/manifests/base/namespace.yaml" -f "$repo/manifests/base/rbac.yaml" >/dev/null
  reset_objects
  service_account_kubeconfig

  say "sim-cloud: $CP_NODES control-plane + $WORKER_NODES worker instances on $OLD_IMAGE, joining as kwok nodes"
  start_sim_cloud
  retry_until 120 "$TOTAL Ready nodes" all_nodes_ready
  say "workload: Deployment $WORKLOAD_NS/$WORKLOAD ($WORKLOAD_REPLICAS pods on the workers), PodDisruptionBudget maxUnavailable 1"
  apply_workload
  retry_until 120 "the workload to be available" workload_available

  say "NodeVersion $NV ($OLD_IMAGE) and ScalingGroups $CP_GROUP, $WORKER_GROUP"
  apply_node_version
  read -r -a http_ports <<<"$(free_ports "$REPLICAS")"
  say "starting $REPLICAS nodewarden replicas (demo-0..demo-$((REPLICAS - 1))) as ServiceAccount $SYSTEM_NS/nodewarden"
  local i
  for ((i = 0; i < REPLICAS; i++)); do spawn_replica "$i"; done
  retry_until 60 "a leader" have_leader
  retry_until 60 "nodewarden to see every node on $OLD_IMAGE" node_version_settled
  say "leader: $(lease_holder "$SYSTEM_NS" "$LEASE" k); setup took $((SECONDS - t0)) s"

  # The view's settings (e2e/demo/view.py reads them from the environment).
  local ports="" tty=0
  for ((i = 0; i < REPLICAS; i++)); do ports+="demo-$i=${http_ports[$i]} "; done
  [ -t 1 ] && tty=1
  export DEMO_RUN=$run DEMO_TOTAL=$TOTAL DEMO_OLD=$OLD_IMAGE DEMO_NEW=$NEW_IMAGE DEMO_SURGE=$SURGE \
    DEMO_NV=$NV DEMO_NS=$WORKLOAD_NS DEMO_WORKLOAD=$WORKLOAD DEMO_LABEL=$LABEL DEMO_SYSTEM_NS=$SYSTEM_NS \
    DEMO_LEASE=$LEASE DEMO_PORTS="$ports" DEMO_JAEGER=$jaeger_query DEMO_TTY=$tty

  say "rolling every node to $NEW_IMAGE (maxSurge $SURGE); the leader gets SIGKILL halfway"
  sleep 1
  k patch nodeversion "$NV" --type=merge \
    -p "{\"spec\":{\"image\":\"$NEW_IMAGE\",\"rollout\":{\"maxSurge\":$SURGE}}}" >/dev/null
  python3 "$here/view.py" start
  view_started=1
  [ "$tty" = 1 ] && { tput civis 2>/dev/null || true; printf '\033[H\033[2J'; }

  # The loop: a frame twice a second; the leader is killed once half the nodes
  # are replaced (preferably while a new instance is joining and no drain
  # runs), and restarted under the same name once a standby took over, as a
  # kubelet would. Not mid-eviction: an eviction request cut off by the kill
  # can leave its pod in the PodDisruptionBudget's disruptedPods, which the
  # disruption controller only forgets after 2 minutes, and the budget
  # (rightly) holds every later eviction until then.
  local killed="" kill_pid="" restarted=0 half_since=""
  local replaced leader joining drains complete new_leader elapsed
  local frame_start rest
  while :; do
    frame_start=${EPOCHREALTIME/[.,]/}
    python3 "$here/view.py" frame
    # shellcheck source=/dev/null
    source "$run/frame.env"
    [ "$complete" = 1 ] && break
    if [ -z "$killed" ] && [ $((replaced * 2)) -ge "$TOTAL" ] && [ -n "$leader" ]; then
      [ -n "$half_since" ] || half_since=$SECONDS
      if { [ "$joining" -gt 0 ] && [ "$drains" = 0 ]; } || [ $((SECONDS - half_since)) -ge 5 ]; then
        killed=$leader
        kill_pid=$(cat "$run/$killed.pid")
        printf 'killed=%s\nkilled_at=%s\nreplaced=%s\n' "$killed" "$(date +%s.%N)" "$replaced" >"$run/failover.env"
        kill -KILL "$kill_pid"
        wait "$kill_pid" 2>/dev/null || true
      fi
    elif [ -n "$killed" ] && [ "$restarted" = 0 ] && [ -n "$new_leader" ]; then
      spawn_replica "${killed#demo-}"
      printf 'restarted_at=%s\n' "$(date +%s.%N)" >>"$run/failover.env"
      restarted=1
    fi
    if [ "$elapsed" -gt "$ROLLOUT_TIMEOUT" ]; then
      [ "$tty" = 1 ] && tput cnorm 2>/dev/null
      die "the rollout did not finish within ${ROLLOUT_TIMEOUT}s; replica logs: $run/demo-*.log"
    fi
    # Twice a second, however long the frame took.
    rest=$((500000 - (${EPOCHREALTIME/[.,]/} - frame_start)))
    [ "$rest" -gt 50000 ] || rest=50000
    sleep "0.$(printf '%06d' "$rest")"
  done
  [ "$tty" = 1 ] && { tput cnorm 2>/dev/null || true; }
  view_started=0

  # Before the replicas go: the leader's metrics, and the traces flushed to Jaeger.
  leader=$(lease_holder "$SYSTEM_NS" "$LEASE" k)
  if [ -n "$leader" ]; then
    local port=""
    for ((i = 0; i < REPLICAS; i++)); do [ "demo-$i" = "$leader" ] && port=${http_ports[$i]}; done
    curl -sf --max-time 5 "http://127.0.0.1:$port/metrics" >"$run/metrics-$leader.txt" || true
    echo "$leader $port" >"$run/metrics-leader"
  fi
  python3 "$here/view.py" summary --wait-traces
  # The same traces as a picture: one HTML page, no network needed to view it.
  local timeline_page=$run/rollout-timeline.html timeline_note
  if "$timeline" --jaeger "$jaeger_query" --max-surge "$SURGE" --out "$timeline_page"; then
    timeline_note="The rollout as a timeline (a row per node with its phases, the leader change, the budget in use):
  xdg-open $timeline_page   (or open that file in any browser)"
  else
    timeline_note="(the timeline page could not be made from Jaeger's traces; see above)"
  fi
  finished=1
  stop_demo_processes
  echo "Wall time of this demo: $((SECONDS - t0)) s (setup included)."
  cat <<EOF

The replicas and the sim-cloud are stopped; the control plane (with the $TOTAL nodes and
the workload) and Jaeger keep running for exploring:
  NODEWARDEN_RUN_DIR=$NODEWARDEN_RUN_DIR just kubectl get nodes,nodeversions,scalinggroups
  # or: export KUBECONFIG=$NODEWARDEN_RUN_DIR/kubeconfig; $kubectl get nodes
  curl -s '$jaeger_query/api/traces?service=nodewarden&operation=replace%20node&limit=100'
$timeline_note
Logs of this run: $run/  (demo-0..2.log are the replicas', JSON lines)
Stop it all with: just demo-down
EOF
}

case "${1:-run}" in
  run) demo ;;
  down) down ;;
  *) echo "usage: $0 run|down" >&2; exit 2 ;;
esac
