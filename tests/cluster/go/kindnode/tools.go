//go:build tools

// Package tools records the Kubernetes commands a kind node needs beyond the harness's own
// (../kubernetes), so `go mod tidy` keeps their dependencies in go.sum.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubeadm"
)
