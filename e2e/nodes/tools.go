//go:build tools

// Package nodes pins the kubelet and kube-proxy that the real nodes of the
// end-to-end cluster run (e2e/nodes/cluster.sh): the same k8s.io/kubernetes
// release as the control plane (e2e/controlplane). Nothing here is compiled
// into nodewarden; build.sh drives `go build` of the imported main packages.
package nodes

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
