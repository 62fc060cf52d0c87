//go:build tools

// Package cluster pins the upstream control-plane binaries the test bed builds.
// Nothing here is compiled into the operator; build.sh runs `go build` on these
// packages with version ldflags and caches the results outside the checkout.
package cluster

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
