// Package version reports which Waggle build is running and which
// Kubernetes version its API claims to be.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set at link time by the Makefile (-X).
var (
	// Version is Waggle's release, "dev" for a local build.
	Version = "dev"
	// GitCommit is the commit the binary was built from, when known.
	GitCommit = ""
)

// Kubernetes API version that Waggle serves (the k8s.io/api it is built on).
const (
	KubeMajor = "1"
	KubeMinor = "37"
	// KubeGitVersion is what /version and Node.status.nodeInfo report.
	KubeGitVersion = "v1.37.2+waggle"
)

// Commit returns the git commit of the build, from -X or the Go build info.
func Commit() string {
	if GitCommit != "" {
		return GitCommit
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}

// String is the one-line version of `waggle version`.
func String() string {
	return fmt.Sprintf("waggle %s (commit %s, kubernetes %s, %s, %s/%s)",
		Version, Commit(), KubeGitVersion, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
