package cluster

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRunRefusesBadConfigBeforeStartingAnything(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "never-created")
	for name, tc := range map[string]struct {
		mutate func(*Config)
		want   string
	}{
		"no data dir":      {func(c *Config) { c.DataDir = "" }, "--data-dir"},
		"bad cluster CIDR": {func(c *Config) { c.ClusterCIDR = "10.244.0.0" }, "--cluster-cidr"},
		"bad log level":    {func(c *Config) { c.LogLevel = "loud" }, "loud"},
		"bad event TTL":    {func(c *Config) { c.EventTTL = -1 }, "--event-ttl"},
		"bad lease reuse":  {func(c *Config) { c.LeaseReuse = 0 }, "--lease-reuse-duration-seconds"},
	} {
		t.Run(name, func(t *testing.T) {
			c := Defaults()
			c.DataDir, c.Out = dir, io.Discard
			tc.mutate(&c)
			err := Run(context.Background(), c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run: %v, want an error naming %q", err, tc.want)
			}
			if _, err := os.Stat(dir); err == nil {
				t.Fatalf("%s was created for a refused config", dir)
			}
		})
	}
}
