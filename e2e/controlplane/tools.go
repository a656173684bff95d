//go:build tools

// Package controlplane pins the Kubernetes binaries that nodewarden's
// integration tests and demo run as local processes, and the kubelet and
// kube-proxy of the real nodes of `just e2e` (e2e/nodes): one module, so the
// packages they share are built once. Nothing here is compiled into
// nodewarden; `go build` of the imported main packages is driven by build.sh.
package controlplane

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
