# Helpers of the real-node suite's steps (sourced, not run), on top of
# e2e/kind/lib.sh (say, die, retry_until, lease_holder, timing, ...).
# shellcheck shell=bash

# shellcheck source-path=SCRIPTDIR source=../kind/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../kind/lib.sh"

# import_images ARCHIVE...: OCI image archives into every node of the cluster
# the suite runs on (E2E_ON: nodes, this machine's; kind, the kind cluster's).
import_images() {
  local archive
  if [ "${E2E_ON:-nodes}" = kind ]; then
    for archive in "$@"; do kind load image-archive "$archive" --name "$E2E_CLUSTER" >/dev/null; done
  else
    "$(dirname "${BASH_SOURCE[0]}")/cluster.sh" import "$@"
  fi
}

# webhook_refuses FILE: a NodeMaintenance of a node that does not exist is
# denied by nodewarden's webhook (through its Service); kubectl's answer in FILE.
webhook_refuses() {
  kubectl apply -f - >"$1" 2>&1 <<EOF || true
apiVersion: nodemaintenance.medik8s.io/v1beta1
kind: NodeMaintenance
metadata:
  name: e2e-no-such-node
spec:
  nodeName: no-such-node
  reason: e2e
EOF
  grep -q 'denied the request' "$1"
}
