//go:build tools

// Package conformance pins k8s.io/kubernetes/test/e2e, the conformance suite, as a dependency of
// this module (the programs it needs, agnhost and the ginkgo CLI, are tool lines of go.mod); the
// harness builds them with go test -c and go build. It is not imported by anything.
package conformance

import _ "k8s.io/kubernetes/test/e2e"
