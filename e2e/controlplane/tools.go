//go:build tools

// Package controlplane pins the Kubernetes control-plane binaries that
// nodewarden's integration tests and demo run as local processes. Nothing here
// is compiled into nodewarden; `go build` of the imported main packages is
// driven by build.sh.
package controlplane

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
