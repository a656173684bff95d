#!/usr/bin/env bash
# Prints N kwok Node manifests (kubectl apply -f -) for the demo cluster.
set -euo pipefail
count=${1:-6}
for i in $(seq 0 $((count - 1))); do
  role=worker
  [ "$i" -lt 1 ] && role=control-plane
  cat <<NODE
---
apiVersion: v1
kind: Node
metadata:
  name: demo-node-$i
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    nodewarden.dev/demo: "true"
    kubernetes.io/hostname: demo-node-$i
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    node-role.kubernetes.io/$role: ""
    type: kwok
spec:
  providerID: kwok://demo-node-$i
status:
  allocatable: {cpu: "32", memory: 256Gi, pods: "110"}
  capacity: {cpu: "32", memory: 256Gi, pods: "110"}
NODE
done
