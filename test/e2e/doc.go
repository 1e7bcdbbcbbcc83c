// Package e2e holds Waggle's end-to-end tests against the multi-node lab:
// the built binaries (waggle, the CNI plugin, the waggle-echo image), real
// containerd and runc, real network namespaces and BPF, driven by the real
// kubectl. They run as root (make test, CI) and are skipped in -short.
//
// It has no non-test code: the lab itself is package lab.
package e2e
