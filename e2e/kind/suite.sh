#!/usr/bin/env bash
# The rollout step of the e2e suite (e2e/nodes/suite.sh, step 4), on the cluster
# e2e/nodes/run.sh or e2e/kind/run.sh prepared (nodewarden x3 by helm,
# sim-cloud, kwok, Jaeger). Standalone on a kept cluster:
#   KUBECONFIG=.run/e2e/kubeconfig E2E_KWOK=process e2e/kind/suite.sh
#
# 1. creates the scaling groups' first instances through the sim-cloud's API
#    and waits until they joined as Ready kwok Nodes;
# 2. runs a workload Deployment with a PodDisruptionBudget on the workers;
# 3. applies a NodeVersion and its ScalingGroups (as Constellation's installer
#    and tests/it/rollout.rs do), waits until nodewarden reports them up to date;
# 4. changes the image and follows the rollout, force-deleting the leader pod
#    once a first node has been replaced;
# 5. checks: the rollout completed (Outdated=False, every node on the new
#    image), a standby took over, no NodeMaintenance, PendingNode or cloud
#    instance left behind, the workload stayed available, and Jaeger holds one
#    "replace node" trace per replaced node;
# 6. prints a summary with timings.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"

if [ -z "${KUBECONFIG:-}" ] && [ -s "$repo/.run/e2e-kind/kubeconfig" ]; then
  export KUBECONFIG="$repo/.run/e2e-kind/kubeconfig"
fi
work=${E2E_WORK:-$repo/.run/e2e-kind}
mkdir -p "$work"
tmp=$(mktemp -d)
# Phase timings for the summary (run.sh passes its file with the setup phases).
export E2E_TIMINGS=${E2E_TIMINGS:-$tmp/timings}

need kubectl "install kubectl (https://kubernetes.io/docs/tasks/tools/)"
need curl "install curl"
need python3 "install python3 (the suite parses JSON with it)"

# The scenario (sizes can be raised; Jaeger is asked for at most 100 traces).
CP_GROUP=e2e-control-plane
WORKER_GROUP=e2e-workers
CP_NODES=${NODEWARDEN_E2E_CP_NODES:-2}
WORKER_NODES=${NODEWARDEN_E2E_WORKER_NODES:-4}
TOTAL=$((CP_NODES + WORKER_NODES))
NV=e2e-version
OLD_IMAGE=img-1
NEW_IMAGE=img-2
WORKLOAD_NS=nodewarden-e2e-workload
WORKLOAD_REPLICAS=$WORKER_NODES
ROLLOUT_TIMEOUT=${NODEWARDEN_E2E_ROLLOUT_TIMEOUT:-600}
E2E_LABEL=nodewarden.dev/e2e=true
NV_RES=nodeversions.update.edgeless.systems
SG_RES=scalinggroups.update.edgeless.systems
PN_RES=pendingnodes.update.edgeless.systems
NM_RES=nodemaintenances.nodemaintenance.medik8s.io
NM_KUBEVIRT_RES=nodemaintenances.nodemaintenance.kubevirt.io
[ "$TOTAL" -lt 100 ] || die "at most 99 nodes: the Jaeger query asks for 100 traces"

suite_ok=0
cleanup() {
  local rc=$?
  stop_port_forwards
  rm -rf "$tmp"
  if [ "$suite_ok" != 1 ]; then
    dump_diagnostics "$work/diagnostics.txt"
  fi
  return "$rc"
}
trap cleanup EXIT


# --- preconditions --------------------------------------------------------
say "checking that nodewarden (3 replicas), sim-cloud and kwok run"
kubectl -n "$E2E_NS" rollout status deploy/nodewarden --timeout=120s >/dev/null ||
  die "nodewarden is not running in $E2E_NS (run e2e/kind/run.sh, or set KUBECONFIG to the e2e cluster)"
kubectl -n "$E2E_NS" rollout status deploy/sim-cloud --timeout=120s >/dev/null || die "sim-cloud is not running"
# kwok runs in the cluster (kind), or beside it as a process (E2E_KWOK=process:
# e2e/nodes, where e2e/controlplane/cluster.sh started it).
if [ "${E2E_KWOK:-pod}" = pod ]; then
  kubectl -n kube-system rollout status deploy/kwok-controller --timeout=120s >/dev/null || die "kwok is not running"
fi

# --- leftovers of an earlier run on a kept cluster --------------------------
if kubectl get "$NV_RES" "$NV" >/dev/null 2>&1 ||
  [ -n "$(kubectl get nodes -l "$E2E_LABEL" -o name)" ] ||
  kubectl get namespace "$WORKLOAD_NS" >/dev/null 2>&1; then
  say "removing what an earlier run left (NodeVersion, groups, nodes, workload) and restarting sim-cloud"
  t=$(date +%s)
  # Best effort, in dependency order; nodewarden (running) releases its finalizers.
  kubectl delete "$NV_RES" "$NV" --ignore-not-found --timeout=60s >/dev/null || say "warning: NodeVersion $NV not deleted"
  kubectl delete "$SG_RES" -l "$E2E_LABEL" --ignore-not-found --timeout=60s >/dev/null || say "warning: ScalingGroups not deleted"
  kubectl delete "$PN_RES" --all --ignore-not-found --timeout=60s >/dev/null || say "warning: PendingNodes not deleted"
  kubectl delete "$NM_RES" --all --ignore-not-found --timeout=60s >/dev/null || say "warning: NodeMaintenances not deleted"
  kubectl delete namespace "$WORKLOAD_NS" --ignore-not-found --timeout=120s >/dev/null || die "namespace $WORKLOAD_NS not deleted"
  kubectl delete nodes -l "$E2E_LABEL" --ignore-not-found --timeout=120s >/dev/null || die "the earlier run's nodes were not deleted"
  # A new pod starts with an empty state file: no instances, serials from 0.
  kubectl -n "$E2E_NS" rollout restart deploy/sim-cloud >/dev/null
  kubectl -n "$E2E_NS" rollout status deploy/sim-cloud --timeout=120s >/dev/null || die "sim-cloud did not restart"
  timing "reset of an earlier run" $(($(date +%s) - t))
fi

# --- 1. the groups' first instances ---------------------------------------
port_forward "$E2E_NS" svc/sim-cloud 8090
sim="http://127.0.0.1:$E2E_PF_PORT"
retry_until 30 "the sim-cloud API" curl -fsS "$sim/healthz"
grep -q "\"$WORKER_GROUP\"" <<<"$(curl -fsS "$sim/groups")" || die "the sim-cloud has no group $WORKER_GROUP (sim-cloud.yaml)"

say "creating $CP_NODES control-plane and $WORKER_NODES worker instances through the sim-cloud"
t=$(date +%s)
create_instances() {
  local group=$1 count=$2 i
  curl -fsS -X PUT -H 'Content-Type: application/json' -d "{\"image\":\"$OLD_IMAGE\"}" \
    "$sim/groups/$group/image" >/dev/null
  for i in $(seq 1 "$count"); do
    curl -fsS -X POST -H 'Content-Type: application/json' -d "{\"requestId\":\"e2e-initial-$group-$i\"}" \
      "$sim/groups/$group/instances" >/dev/null
  done
}
create_instances "$CP_GROUP" "$CP_NODES"
create_instances "$WORKER_GROUP" "$WORKER_NODES"

deadline=$(($(date +%s) + 120))
while :; do
  kubectl get nodes -l "$E2E_LABEL" -o json >"$tmp/nodes.json"
  ready=$(python3 "$here/inspect.py" ready "$tmp/nodes.json")
  [ "$ready" -eq "$TOTAL" ] && break
  [ "$(date +%s)" -lt "$deadline" ] || die "only $ready of $TOTAL nodes Ready after 120 s"
  sleep 2
done
mapfile -t original < <(kubectl get nodes -l "$E2E_LABEL" -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
[ "${#original[@]}" -eq "$TOTAL" ] || die "expected $TOTAL nodes, found ${#original[@]}"
timing "initial nodes joined and Ready" $(($(date +%s) - t))
result "$TOTAL kwok nodes joined through the sim-cloud: ${original[*]}"

# --- 2. the workload ------------------------------------------------------
say "deploying a workload of $WORKLOAD_REPLICAS pods on the workers, with a PodDisruptionBudget"
t=$(date +%s)
kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata:
  name: $WORKLOAD_NS
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: $WORKLOAD_NS
spec:
  replicas: $WORKLOAD_REPLICAS
  selector:
    matchLabels:
      app: web
  template:
    metadata:
      labels:
        app: web
    spec:
      # Only the fake workers: kwok plays these pods (the image is never pulled).
      nodeSelector:
        type: kwok
        node-role.kubernetes.io/worker: ""
      containers:
        - name: web
          image: registry.k8s.io/pause:3.10
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: web
  namespace: $WORKLOAD_NS
spec:
  maxUnavailable: 1
  selector:
    matchLabels:
      app: web
EOF
kubectl -n "$WORKLOAD_NS" rollout status deploy/web --timeout=120s >/dev/null
timing "workload available" $(($(date +%s) - t))
result "workload web: $WORKLOAD_REPLICAS pods available, PDB maxUnavailable 1"

# --- 3. NodeVersion and ScalingGroups --------------------------------------
say "applying NodeVersion $NV ($OLD_IMAGE) and ScalingGroups $CP_GROUP, $WORKER_GROUP"
t=$(date +%s)
kubectl apply -f - >/dev/null <<EOF
apiVersion: update.edgeless.systems/v1alpha1
kind: NodeVersion
metadata:
  name: $NV
  labels:
    nodewarden.dev/e2e: "true"
spec:
  image: $OLD_IMAGE
  rollout:
    maxSurge: 1
    maxUnavailable: 0
---
apiVersion: update.edgeless.systems/v1alpha1
kind: ScalingGroup
metadata:
  name: $CP_GROUP
  labels:
    nodewarden.dev/e2e: "true"
spec:
  nodeImage: $NV
  groupId: $CP_GROUP
  role: ControlPlane
  autoscaling: false
---
apiVersion: update.edgeless.systems/v1alpha1
kind: ScalingGroup
metadata:
  name: $WORKER_GROUP
  labels:
    nodewarden.dev/e2e: "true"
spec:
  nodeImage: $NV
  groupId: $WORKER_GROUP
  role: Worker
  autoscaling: false
EOF
deadline=$(($(date +%s) + 120))
until kubectl get "$NV_RES" "$NV" -o json >"$tmp/nv.json" &&
  python3 "$here/inspect.py" settled "$tmp/nv.json" "$TOTAL"; do
  [ "$(date +%s)" -lt "$deadline" ] ||
    die "nodewarden did not report $NV up to date with $TOTAL nodes within 120 s: $(kubectl get "$NV_RES" "$NV" -o jsonpath='{.status}')"
  sleep 2
done
timing "NodeVersion up to date" $(($(date +%s) - t))
result "NodeVersion $NV: $TOTAL nodes, Outdated=False"

# --- 4. the rollout, with the leader killed on the way ----------------------
say "rolling to $NEW_IMAGE (maxSurge 1); the leader will be killed once a first node is replaced"
kubectl patch "$NV_RES" "$NV" --type merge -p "{\"spec\":{\"image\":\"$NEW_IMAGE\"}}" >/dev/null
generation=$(kubectl get "$NV_RES" "$NV" -o jsonpath='{.metadata.generation}')
rollout_start=$(date +%s)
trace_start_us=$(((rollout_start - 5) * 1000000))
killed="" kill_at="" failover="" last_line="" last_print=0
deadline=$((rollout_start + ROLLOUT_TIMEOUT))
while :; do
  now=$(date +%s)
  [ "$now" -lt "$deadline" ] || die "the rollout did not finish within ${ROLLOUT_TIMEOUT}s"
  if ! kubectl get "$NV_RES" "$NV" -o json >"$tmp/nv.json" 2>/dev/null ||
    ! kubectl get nodes -l "$E2E_LABEL" -o json >"$tmp/nodes.json" 2>/dev/null; then
    sleep 2
    continue
  fi
  done=0 current=0 line=""
  eval "$(python3 "$here/inspect.py" rollout "$tmp/nv.json" "$tmp/nodes.json" "$NEW_IMAGE" "$generation" "${original[@]}")"
  holder=$(lease_holder "$E2E_NS" nodewarden)
  if [ -n "$killed" ] && [ -z "$failover" ] && [ -n "$holder" ] && [ "$holder" != "$killed" ]; then
    failover=$((now - kill_at))
    say "leader is now $holder (${failover}s after the kill)"
  fi
  if [ "$line" != "$last_line" ] || [ $((now - last_print)) -ge 15 ]; then
    say "$line | leader ${holder:-none}"
    last_line=$line last_print=$now
  fi
  [ "$done" = 1 ] && break
  if [ -z "$killed" ] && [ "$current" -ge 1 ]; then
    [ -n "$holder" ] || die "no lease holder mid-rollout"
    kubectl -n "$E2E_NS" get pod "$holder" >/dev/null 2>&1 || die "the lease holder $holder is not a pod in $E2E_NS"
    say "killing the leader: kubectl delete pod $holder --grace-period=0 --force"
    kubectl -n "$E2E_NS" delete pod "$holder" --grace-period=0 --force >/dev/null 2>&1 ||
      die "could not delete the leader pod $holder"
    killed=$holder kill_at=$(date +%s)
  fi
  sleep 2
done
rollout_time=$(($(date +%s) - rollout_start))
timing "rollout of $TOTAL nodes to $NEW_IMAGE (leader killed once)" "$rollout_time"
[ -n "$killed" ] || die "the rollout finished before a first replaced node was seen: the leader was never killed"
result "rollout complete in ${rollout_time}s: Outdated=False, all $TOTAL nodes Ready with $NEW_IMAGE (annotation and osImage), none of the old ones left"

if [ -z "$failover" ]; then
  deadline=$(($(date +%s) + 60))
  while holder=$(lease_holder "$E2E_NS" nodewarden); [ -z "$holder" ] || [ "$holder" = "$killed" ]; do
    [ "$(date +%s)" -lt "$deadline" ] || die "no replica took the lease over from $killed"
    sleep 1
  done
  failover=$(($(date +%s) - kill_at))
fi
timing "leader failover (lease taken by a standby)" "$failover"
result "leader $killed killed mid-rollout; the lease moved to $(lease_holder "$E2E_NS" nodewarden) within ${failover}s"

# --- 5. nothing left behind -------------------------------------------------
say "checking that nothing was left behind"
t=$(date +%s)
# no_objects RESOURCE: the list succeeds and is empty.
no_objects() {
  local out
  out=$(kubectl get "$1" -o name) || return 1
  [ -z "$out" ] || { echo "left: $out"; return 1; }
}
retry_until 60 "every NodeMaintenance to be gone" no_objects "$NM_RES"
retry_until 10 "every kubevirt NodeMaintenance to be gone" no_objects "$NM_KUBEVIRT_RES"
result "no NodeMaintenance left"
retry_until 60 "every PendingNode to be gone" no_objects "$PN_RES"
result "no PendingNode left"

no_leak() {
  curl -fsS "$sim/instances" >"$tmp/instances.json" &&
    kubectl get nodes -l "$E2E_LABEL" -o json >"$tmp/nodes.json" &&
    python3 "$here/inspect.py" leak "$tmp/instances.json" "$tmp/nodes.json"
}
retry_until 60 "sim-cloud instances and Nodes to match" no_leak
result "every live sim-cloud instance is a Node and every Node a live instance"

kubectl -n "$E2E_NS" rollout status deploy/nodewarden --timeout=120s >/dev/null
ready_replicas=$(kubectl -n "$E2E_NS" get deploy nodewarden -o jsonpath='{.status.readyReplicas}')
[ "$ready_replicas" = 3 ] || die "nodewarden has $ready_replicas Ready replicas, not 3"
holder=$(lease_holder "$E2E_NS" nodewarden)
kubectl -n "$E2E_NS" get pod "$holder" >/dev/null 2>&1 || die "the lease holder '$holder' is not a running pod"
result "nodewarden back to 3 Ready replicas, leader $holder"

available=$(kubectl -n "$WORKLOAD_NS" get deploy web -o jsonpath='{.status.availableReplicas}')
[ "$available" = "$WORKLOAD_REPLICAS" ] || die "workload web has ${available:-0} of $WORKLOAD_REPLICAS pods available"
result "workload web: $WORKLOAD_REPLICAS of $WORKLOAD_REPLICAS pods available after the rollout"
timing "cleanup checks" $(($(date +%s) - t))

# --- 6. traces in Jaeger ------------------------------------------------------
say "asking Jaeger for the 'replace node' traces"
t=$(date +%s)
jaeger_svc=""
while read -r name ports; do
  case " $ports " in
    *" 16686 "*)
      # Any Service with the query port; jaeger-collector when it has it.
      if [ -z "$jaeger_svc" ] || [ "$name" = jaeger-collector ]; then jaeger_svc=$name; fi
      ;;
  esac
done < <(kubectl -n observability get svc -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.spec.ports[*].port}{"\n"}{end}')
[ -n "$jaeger_svc" ] || die "no Service in namespace observability serves the Jaeger UI/API (port 16686)"
port_forward observability "svc/$jaeger_svc" 16686
jaeger="http://127.0.0.1:$E2E_PF_PORT"
retry_until 30 "the Jaeger API" curl -fsS "$jaeger/api/services"
traces_ok() {
  local end_us
  end_us=$((($(date +%s) + 5) * 1000000))
  curl -fsS "$jaeger/api/traces?service=nodewarden&operation=replace%20node&limit=100&start=$trace_start_us&end=$end_us" \
    >"$tmp/traces.json" &&
    python3 "$here/inspect.py" traces "$tmp/traces.json" "${original[@]}" >"$tmp/traces.txt"
}
deadline=$(($(date +%s) + 90))
until traces_ok; do
  if [ "$(date +%s)" -ge "$deadline" ]; then
    cat "$tmp/traces.txt" 2>/dev/null || true
    echo "services known to Jaeger: $(curl -fsS "$jaeger/api/services" 2>/dev/null)"
    cp "$tmp/traces.json" "$work/traces.json" 2>/dev/null || true
    die "Jaeger does not hold one 'replace node' trace per replaced node after 90 s (answer kept in $work/traces.json)"
  fi
  sleep 3
done
sed 's/^/    /' "$tmp/traces.txt"
timing "traces found in Jaeger" $(($(date +%s) - t))
result "Jaeger ($jaeger_svc): one 'replace node' trace for each of the $TOTAL replaced nodes"

# --- summary ------------------------------------------------------------------
suite_ok=1
print_summary "nodewarden e2e"
