#!/usr/bin/env bash
# The end-to-end suite on real nodes: this machine's (e2e/nodes/run.sh) or a
# kind cluster's (e2e/kind/run.sh), either having installed nodewarden with
# helm (e2e/nodes/install.sh). What only real pods show:
#   1. the 3 replicas Ready on real nodes, spread as the chart asks, one leader;
#   2. a bad NodeMaintenance refused by the webhook through its Service;
#   3. the guard: a pod cannot reach an address outside the cluster's own
#      (this machine's nodes only);
#   4. a rollout of kwok nodes by the simulated cloud with the leader killed,
#      one trace per replaced node read back from Jaeger (e2e/kind/suite.sh);
#   5. a Plan whose Jobs run on the real nodes, one node at a time;
#   6. a NodeMaintenance of the leader's own node: the real kubelet evicts the
#      leader, another replica takes over, the maintenance completes, undone;
#   7. helm upgrade to a changed image; 8. helm uninstall leaves nothing behind.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"
work=${E2E_WORK:?run by e2e/nodes/run.sh}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
REAL=nodewarden.dev/e2e-real=true
APP=app.kubernetes.io/name=nodewarden

# replicas_ready: 3 Ready nodewarden pods, each on a real node.
replicas_ready() {
  local ready
  ready=$(kubectl -n "$E2E_NS" get pods -l "$APP" -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{" "}{end}')
  [ "$(echo "$ready" | tr ' ' '\n' | grep -c '^True$')" = 3 ]
}
# leader_pod: the Lease holder, when it is a running nodewarden pod.
leader_pod() {
  local holder
  holder=$(lease_holder "$E2E_NS" nodewarden)
  [ -n "$holder" ] && [ "$(kubectl -n "$E2E_NS" get pod "$holder" -o jsonpath='{.status.phase}' 2>/dev/null)" = Running ] &&
    echo "$holder"
}

# --- 1. the replicas --------------------------------------------------------
t=$(date +%s)
retry_until 120 "3 Ready nodewarden replicas" replicas_ready
retry_until 60 "a leader" leader_pod
kubectl -n "$E2E_NS" get pods -l "$APP" -o wide | tee "$work/replicas.txt"
nodes=$(kubectl -n "$E2E_NS" get pods -l "$APP" -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | sort -u)
real_nodes=$(kubectl get nodes -l "$REAL" -o name | wc -l)
[ "$(echo "$nodes" | wc -l)" -ge "$((real_nodes < 3 ? real_nodes : 3))" ] ||
  die "the replicas are not spread over the real nodes: $(echo "$nodes" | tr '\n' ' ')"
for n in $nodes; do
  [[ "$(kubectl get node "$n" -o jsonpath='{.metadata.labels}')" == *nodewarden.dev/e2e-real* ]] || die "a replica runs on $n, not a real node"
done
timing "3 replicas Ready, leader elected" $(($(date +%s) - t))
result "3 replicas Ready on real nodes ($(echo "$nodes" | tr '\n' ' ')), leader $(leader_pod)"

# --- 2. the webhook through its Service ---------------------------------------
retry_until 30 "the webhook to refuse a NodeMaintenance of a missing node" webhook_refuses "$tmp/refusal"
result "webhook through its Service: $(tail -n 1 "$tmp/refusal")"

# --- 3. the guard (this machine's nodes; a kind cluster has its own network) -------
guard_step() {
  local outside before after
  guard_drops() { iptables -t raw -L NW-GUARD -v -x -n | awk '$3 == "DROP" {print $1}'; }
  outside=$(awk '$1 == "nameserver" {print $2; exit}' /etc/resolv.conf)
  outside=${outside:-192.0.2.1}
  before=$(guard_drops)
  kubectl run e2e-guard --image=nodewarden.dev/e2e/busybox:1 --image-pull-policy=Never --restart=Never \
    --overrides='{"spec":{"nodeSelector":{"nodewarden.dev/e2e-real":"true"}}}' --command -- \
    sh -c "cat /etc/resolv.conf; if nc -w 3 $outside 53 </dev/null; then echo REACHED; fi" >/dev/null
  pod_done() { [[ "$(kubectl get pod e2e-guard -o jsonpath='{.status.phase}')" =~ ^(Succeeded|Failed)$ ]]; }
  retry_until 60 "the guard pod to finish" pod_done
  kubectl logs e2e-guard >"$tmp/guard.log"
  kubectl delete pod e2e-guard --wait=false >/dev/null
  ! grep -q REACHED "$tmp/guard.log" || die "a pod reached $outside: the guard let it out"
  if [ "$(grep -c '^nameserver' "$tmp/guard.log")" != 1 ] || ! grep -q '^nameserver 10.99.0.1$' "$tmp/guard.log"; then
    die "the pod's resolver names another server: $(cat "$tmp/guard.log")"
  fi
  after=$(guard_drops)
  [ "$after" -gt "$before" ] || die "the guard dropped nothing (counter $before → $after): the packet left some other way or never went"
  result "guard: a pod's packet to $outside dropped (NW-GUARD $before → $after), its resolver names only 10.99.0.1"
}
if [ "${E2E_ON:-nodes}" = nodes ]; then guard_step; fi

# --- 4. the rollout of kwok nodes, the leader killed, traces in Jaeger ------------
# kwok: a process beside the control plane (nodes) or a pod (kind).
E2E_KWOK=$([ "${E2E_ON:-nodes}" = nodes ] && echo process || echo pod) "$repo/e2e/kind/suite.sh"
result "rollout by the simulated cloud with the leader killed; one trace per replaced node in Jaeger (above)"

# --- 5. a Plan on the real nodes ------------------------------------------------------
t=$(date +%s)
kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata:
  name: e2e-plans
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: upgrader
  namespace: e2e-plans
---
apiVersion: upgrade.cattle.io/v1
kind: Plan
metadata:
  name: e2e-upgrade
  namespace: e2e-plans
spec:
  concurrency: 1
  cordon: true
  serviceAccountName: upgrader
  nodeSelector:
    matchLabels:
      nodewarden.dev/e2e-real: "true"
  version: v1
  upgrade:
    image: nodewarden.dev/e2e/upgrade
    args: ["e2e"]
EOF
plan_applied() {
  local hash labelled
  hash=$(kubectl -n e2e-plans get plan e2e-upgrade -o jsonpath='{.status.latestHash}')
  [ -n "$hash" ] || return 1
  labelled=$(kubectl get nodes -l "$REAL,plan.upgrade.cattle.io/e2e-upgrade=$hash" -o name | wc -l)
  [ "$labelled" = "$real_nodes" ] && [ -z "$(kubectl get nodes -l "$REAL" -o jsonpath='{.items[*].spec.unschedulable}')" ]
}
retry_until 240 "the Plan to upgrade every real node" plan_applied
kubectl -n e2e-plans get jobs -o wide | tee "$tmp/jobs.txt"
jobs_ok=$(kubectl -n e2e-plans get jobs -o jsonpath='{range .items[*]}{.status.succeeded}{"\n"}{end}' | grep -c '^1$' || true)
[ "$jobs_ok" -ge "$real_nodes" ] || die "only $jobs_ok upgrade Jobs succeeded"
job_pod=$(kubectl -n e2e-plans get pods -o jsonpath='{.items[0].metadata.name}')
grep -q '^upgraded$' <<<"$(kubectl -n e2e-plans logs "$job_pod" -c upgrade)" || die "the upgrade Job's log lacks its last line"
kubectl delete namespace e2e-plans --wait=false >/dev/null
timing "Plan applied to the real nodes" $(($(date +%s) - t))
result "Plan e2e-upgrade: $jobs_ok Jobs ran on the real nodes one at a time, each node labelled and uncordoned"

# --- 6. a NodeMaintenance of the leader's own node ----------------------------------
"$here/drain-leader.sh"
result "the leader's own node drained: see the times above"

# --- 7. helm upgrade to a changed image ----------------------------------------------
"$here/upgrade-uninstall.sh"
result "helm upgrade to a changed image, then helm uninstall leaving nothing behind"

print_summary "nodewarden e2e on real nodes"
