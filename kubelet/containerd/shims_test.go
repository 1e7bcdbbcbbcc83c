package containerd

import "testing"

func TestIsShimOfMatchesOnlyThatDaemonsShims(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		want bool
	}{
		{[]string{"/usr/bin/containerd-shim-runc-v2", "-namespace", "n", "-id", "x", "-address", "/tmp/a/containerd.sock"}, true},
		{[]string{"/usr/bin/containerd-shim-runc-v2", "-namespace", "n", "-address", "/run/containerd/containerd.sock"}, false},
		{[]string{"/usr/bin/sleep", "-address", "/tmp/a/containerd.sock"}, false},
		{[]string{"/usr/bin/containerd-shim-runc-v2", "-address"}, false},
		{nil, false},
	} {
		if got := isShimOf(tc.argv, "/tmp/a/containerd.sock"); got != tc.want {
			t.Errorf("isShimOf(%q) = %v, want %v", tc.argv, got, tc.want)
		}
	}
}
