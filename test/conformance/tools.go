//go:build tools

// Package conformance pins k8s.io/kubernetes/test/e2e (the conformance suite) and the agnhost
// image's program as dependencies of this module; the harness builds them with go test -c and
// go build. It is not imported by anything.
package conformance

import (
	_ "k8s.io/kubernetes/test/e2e"
	_ "k8s.io/kubernetes/test/images/agnhost"
)
