//go:build tools

// Package tools records the kind command this module builds, so `go mod tidy` keeps its
// dependencies in go.sum.
package tools

import _ "sigs.k8s.io/kind"
