//go:build waggle_upstream_peer

// Command kube-apiserver is upstream Kubernetes's own API server, built from
// the k8s.io/kubernetes module at the version go.mod pins (v1.37.2): the
// peer BenchmarkWritePathVsUpstream (controlplane/apiserver) measures Waggle's
// write path against. It is only built when that benchmark runs
// (WRITE_BENCH_KUBE_APISERVER=1), into a cache directory, with the build
// tag waggle_upstream_peer, so neither `make build` nor `make test` nor
// `go vet ./...` compiles kube-apiserver's ~300 packages.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
