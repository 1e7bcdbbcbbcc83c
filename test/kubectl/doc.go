// Package kubectl holds Waggle's end-to-end tests with the real kubectl: they
// build bin/waggle, start `waggle apiserver` on a temporary data directory
// and drive /usr/bin/kubectl (and the versioned kubectl 1.27 … 1.33 of the
// Cloud SDK for a smoke set) with the admin kubeconfig the server writes,
// asserting on kubectl's output.
//
// It is a test-only package: nothing here is imported by Waggle itself, and
// the tests skip in `go test -short` (the unit tier).
package kubectl
