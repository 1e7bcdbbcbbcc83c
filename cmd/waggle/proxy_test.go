package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestProxyRejectsBadFlags: bad input to `waggle proxy` is a clear error
// before anything is touched.
func TestProxyRejectsBadFlags(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		msg  string
	}{
		{"bad cluster CIDR", []string{"proxy", "--hostname-override=a", "--cluster-cidr=10.0.0/8"}, `--cluster-cidr "10.0.0/8"`},
		{"unknown mode", []string{"proxy", "--hostname-override=a", "--mode=userspace"}, `--mode="userspace"`},
		{"min sync period above sync period", []string{"proxy", "--hostname-override=a", "--sync-period=1s", "--min-sync-period=1m"}, "--min-sync-period"},
		{"bad log level", []string{"proxy", "--log-level=loud"}, "log level"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			if code := run(tt.args, &stderr); code != 1 {
				t.Errorf("exit code %d, want 1 (%s)", code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.msg) {
				t.Errorf("stderr %q lacks %q", stderr.String(), tt.msg)
			}
		})
	}
}
