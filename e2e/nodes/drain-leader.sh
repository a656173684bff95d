#!/usr/bin/env bash
# A NodeMaintenance of the node the leader runs on (e2e/nodes/suite.sh, step 6):
# the real kubelet evicts the leader among the node's pods, another replica
# takes the Lease over and finishes the drain, and deleting the maintenance
# undoes it. Prints the times from the maintenance's creation to the new
# leader, to the new leader's first reconcile of it, and to its completion.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"
work=${E2E_WORK:?run by e2e/nodes/run.sh}
NM_RES=nodemaintenances.nodemaintenance.medik8s.io
NM=e2e-leader-node
APP=app.kubernetes.io/name=nodewarden
WORKLOAD_NS=e2e-sleepers

ms() { date +%s%3N; }
secs() { python3 -c 'import sys; print(f"{(int(sys.argv[2]) - int(sys.argv[1])) / 1000:.1f}")' "$1" "$2"; }

leader=$(lease_holder "$E2E_NS" nodewarden)
[ -n "$leader" ] || die "no leader before the drain"
node=$(kubectl -n "$E2E_NS" get pod "$leader" -o jsonpath='{.spec.nodeName}')
say "the leader $leader runs on $node: a workload there, then a NodeMaintenance of $node"

# Real pods to evict beside nodewarden's: busybox sleepers guarded by a PDB.
kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata:
  name: $WORKLOAD_NS
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: sleepers
  namespace: $WORKLOAD_NS
spec:
  replicas: 4
  selector: {matchLabels: {app: sleepers}}
  template:
    metadata: {labels: {app: sleepers}}
    spec:
      nodeSelector: {nodewarden.dev/e2e-real: "true"}
      terminationGracePeriodSeconds: 2
      containers:
        - name: sleep
          image: nodewarden.dev/e2e/busybox:1
          imagePullPolicy: Never
          command: ["sh", "-c", "trap 'exit 0' TERM; while true; do sleep 1; done"]
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: sleepers
  namespace: $WORKLOAD_NS
spec:
  maxUnavailable: 1
  selector: {matchLabels: {app: sleepers}}
EOF
kubectl -n "$WORKLOAD_NS" rollout status deploy/sleepers --timeout=120s >/dev/null

start=$(ms)
kubectl apply -f - >/dev/null <<EOF
apiVersion: nodemaintenance.medik8s.io/v1beta1
kind: NodeMaintenance
metadata:
  name: $NM
spec:
  nodeName: $node
  reason: "e2e: the leader's own node"
EOF
# Every change of holder until the maintenance succeeds: the node may run more
# than one replica, and each is evicted in turn.
holder=$leader took_over="" phase="" handovers=""
deadline=$(($(date +%s) + 300))
while :; do
  [ "$(date +%s)" -lt "$deadline" ] || die "the maintenance of $node did not succeed in 300 s (phase '${phase}', leader '$holder')"
  now=$(lease_holder "$E2E_NS" nodewarden)
  if [ -n "$now" ] && [ "$now" != "$holder" ]; then
    holder=$now
    at=$(ms)
    [ -n "$took_over" ] || took_over=$at
    handovers+=" $holder@$(secs "$start" "$at")s"
    say "the Lease moved to $holder after $(secs "$start" "$at") s"
  fi
  phase=$(kubectl get "$NM_RES" "$NM" -o jsonpath='{.status.phase}')
  [ "$phase" = Succeeded ] && break
  sleep 0.5
done
done_at=$(ms)
[ -n "$took_over" ] || die "the maintenance succeeded but the leader $leader never lost the Lease"
new_leader=$(lease_holder "$E2E_NS" nodewarden)
new_node=$(kubectl -n "$E2E_NS" get pod "$new_leader" -o jsonpath='{.spec.nodeName}')
[ "$new_node" != "$node" ] || die "the leader $new_leader runs on the drained node $node"

# The new leader's first reconcile of the maintenance, from its own log (UTC stamps).
kubectl -n "$E2E_NS" logs "$new_leader" >"$work/new-leader.log"
first=$(awk -v nm="object=$NM" 'index($0, nm) {print $1; exit}' "$work/new-leader.log")
first_ms=$(python3 -c 'import sys, datetime; print(int(datetime.datetime.fromisoformat(sys.argv[1].replace("Z", "+00:00")).timestamp() * 1000))' "${first:-1970-01-01T00:00:00Z}")
[ -n "$first" ] || die "the new leader's log names no reconcile of $NM"
kubectl get "$NM_RES" "$NM" -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}' | tee "$work/drain-conditions.txt"
left=$(kubectl get pods -A --field-selector "spec.nodeName=$node,status.phase=Running" -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name}{"\n"}{end}')
[ -z "$left" ] || die "pods still run on the drained $node: $left"
[ "$(kubectl get node "$node" -o jsonpath='{.spec.unschedulable}')" = true ] || die "$node is not cordoned"
kubectl -n "$E2E_NS" rollout status deploy/nodewarden --timeout=120s >/dev/null
kubectl -n "$WORKLOAD_NS" rollout status deploy/sleepers --timeout=120s >/dev/null
kubectl -n "$E2E_NS" get pods -l "$APP" -o wide | tee "$work/replicas-after-drain.txt"
{
  echo "drain of the leader's node $node (leader $leader):"
  echo "  Lease first moved:                        $(secs "$start" "$took_over") s after the NodeMaintenance was created (holders:$handovers)"
  echo "  leader $new_leader on $new_node, its first reconcile of it: $(secs "$start" "$first_ms") s"
  echo "  maintenance Succeeded:                    $(secs "$start" "$done_at") s"
} | tee "$work/drain-leader.txt"
timing "drain of the leader's own node (Succeeded)" $(((done_at - start) / 1000))

say "deleting the maintenance: $node uncordoned, its taint removed"
kubectl delete "$NM_RES" "$NM" --timeout=60s >/dev/null
undone() {
  [ -z "$(kubectl get node "$node" -o jsonpath='{.spec.unschedulable}')" ] &&
    [[ "$(kubectl get node "$node" -o jsonpath='{.spec.taints[*].key}')" != *medik8s.io/drain* ]]
}
retry_until 60 "$node to be uncordoned and untainted" undone
kubectl delete namespace "$WORKLOAD_NS" --wait=false >/dev/null
