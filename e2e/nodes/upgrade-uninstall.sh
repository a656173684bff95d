#!/usr/bin/env bash
# helm upgrade to a changed image, then helm uninstall (e2e/nodes/suite.sh,
# steps 7 and 8): the image `just image` made, repacked with one more label
# (another digest) as ghcr.io/nodewarden/nodewarden:0.1.0-e2e, rolled out by
# `helm upgrade`; afterwards `helm uninstall` must leave nothing of the release.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"
image=${E2E_IMAGE:?run by e2e/nodes/run.sh}
APP=app.kubernetes.io/name=nodewarden
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# --- the changed image ----------------------------------------------------------
changed=$tmp/nodewarden-e2e.oci.tar
python3 "$repo/e2e/image/oci.py" --out "$changed" --ref ghcr.io/nodewarden/nodewarden:0.1.0-e2e --arch amd64 \
  --from "$image" --label nodewarden.dev/e2e=upgrade >/dev/null
import_images "$changed"

# --- helm upgrade -----------------------------------------------------------------
old_ids=$(kubectl -n "$E2E_NS" get pods -l "$APP" -o jsonpath='{range .items[*]}{.status.containerStatuses[0].imageID}{"\n"}{end}' | sort -u)
t=$(date +%s)
say "helm upgrade nodewarden to the image tag 0.1.0-e2e"
helm upgrade nodewarden "$repo/charts/nodewarden" --namespace "$E2E_NS" --reuse-values \
  --set image.tag=0.1.0-e2e --wait --timeout 300s >/dev/null
kubectl -n "$E2E_NS" rollout status deploy/nodewarden --timeout=120s >/dev/null
new_ids=$(kubectl -n "$E2E_NS" get pods -l "$APP" --field-selector=status.phase=Running \
  -o jsonpath='{range .items[*]}{.status.containerStatuses[0].imageID}{"\n"}{end}' | sort -u)
[ "$(echo "$new_ids" | wc -l)" = 1 ] && [ "$new_ids" != "$old_ids" ] ||
  die "after the upgrade the replicas run $new_ids (before: $old_ids)"
leader_is_new() {
  local holder
  holder=$(lease_holder "$E2E_NS" nodewarden)
  [ -n "$holder" ] && [ "$(kubectl -n "$E2E_NS" get pod "$holder" -o jsonpath='{.status.containerStatuses[0].imageID}')" = "$new_ids" ]
}
retry_until 60 "a leader on the new image" leader_is_new
retry_until 30 "the upgraded webhook to refuse a NodeMaintenance of a missing node" webhook_refuses "$tmp/refusal"
timing "helm upgrade to a changed image" $(($(date +%s) - t))
say "upgraded: 3 replicas on $new_ids, leader $(lease_holder "$E2E_NS" nodewarden), webhook answering"

# --- helm uninstall ---------------------------------------------------------------
t=$(date +%s)
# What the suite deployed beside the release goes first.
kubectl -n "$E2E_NS" delete deploy/sim-cloud svc/sim-cloud configmap/sim-cloud sa/sim-cloud --ignore-not-found >/dev/null
kubectl delete clusterrole/nodewarden-sim-cloud clusterrolebinding/nodewarden-sim-cloud --ignore-not-found >/dev/null
helm uninstall nodewarden --namespace "$E2E_NS" --wait --timeout 120s >/dev/null
gone() { [ -z "$(kubectl -n "$E2E_NS" get pods -o name)" ]; }
retry_until 60 "nodewarden's pods to be gone" gone
left=$(
  kubectl -n "$E2E_NS" get all,configmaps,secrets,leases,serviceaccounts,roles,rolebindings,poddisruptionbudgets \
    -o name 2>/dev/null | grep -vE '^(configmap/kube-root-ca.crt|serviceaccount/default)$' || true
  kubectl get validatingwebhookconfigurations,mutatingwebhookconfigurations,clusterroles,clusterrolebindings -o name |
    grep -i nodewarden || true
)
[ -z "$left" ] || die "helm uninstall left: $(echo "$left" | tr '\n' ' ')"
timing "helm uninstall, nothing left" $(($(date +%s) - t))
say "uninstalled: nothing of the release is left"
