#!/usr/bin/env bash
# What `just e2e` installs, the same on both of its clusters (e2e/nodes/run.sh,
# e2e/kind/run.sh): the sim-cloud and Jaeger as pods (Services on fixed
# ClusterIPs, as values.yaml names them), then nodewarden by
# `helm upgrade --install` of charts/nodewarden with values.yaml and "$@".
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$here/lib.sh"

say "deploying the sim-cloud and Jaeger as pods"
kubectl create namespace "$E2E_NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl kustomize --load-restrictor=LoadRestrictionsNone "$here/sim-cloud" | kubectl apply -f - >/dev/null
kubectl kustomize --load-restrictor=LoadRestrictionsNone "$here/jaeger" | kubectl apply -f - >/dev/null
kubectl -n "$E2E_NS" rollout status deploy/sim-cloud --timeout=180s >/dev/null
kubectl -n observability rollout status deploy/jaeger --timeout=180s >/dev/null
say "helm install nodewarden charts/nodewarden (3 replicas, cloud sim, traces to Jaeger)"
# upgrade --install: the same on a fresh cluster, and a rerun on a kept one.
helm upgrade --install nodewarden "$repo/charts/nodewarden" --namespace "$E2E_NS" --create-namespace \
  -f "$here/values.yaml" "$@" --wait --timeout 300s >/dev/null
