package controllers

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestControllersFlagSelectsAsKubeControllerManager(t *testing.T) {
	tests := []struct {
		name    string
		list    []string
		ctrl    string
		offByDf bool
		want    bool
	}{
		{"star enables all", []string{"*"}, "deployment", false, true},
		{"star minus one", []string{"*", "-deployment"}, "deployment", false, false},
		{"star minus another", []string{"*", "-deployment"}, "replicaset", false, true},
		{"named only", []string{"replicaset"}, "deployment", false, false},
		{"named", []string{"replicaset"}, "replicaset", false, true},
		{"off by default needs naming", []string{"*"}, "x", true, false},
		{"off by default named", []string{"*", "x"}, "x", true, true},
		{"empty list enables nothing", nil, "deployment", false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Enabled(tc.list, tc.ctrl, tc.offByDf); got != tc.want {
				t.Fatalf("Enabled(%v, %s) = %v, want %v", tc.list, tc.ctrl, got, tc.want)
			}
		})
	}
}

func TestKnownControllersIncludeTheWorkloadControllers(t *testing.T) {
	known := strings.Join(KnownControllers(), ",")
	for _, n := range []string{"replicaset", "deployment", "daemonset", "endpointslice", "endpointslicemirroring", "garbagecollector",
		"namespace", "nodeipam", "nodelifecycle", "serviceaccount", "job", "cronjob", "ttl-after-finished", "statefulset", "podgc",
		"horizontalpodautoscaling"} {
		if !strings.Contains(known, n) {
			t.Errorf("%s missing from %s", n, known)
		}
	}
}

func TestRunRejectsBadConfigBeforeContactingAnything(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"unknown controller", func(c *Config) { c.Controllers = []string{"*", "-bogus"} }, `unknown controller "bogus"`},
		{"bad bind address", func(c *Config) { c.SecureServing.BindAddress = "localhost:1" }, "--bind-address"},
		{"port out of range", func(c *Config) { c.SecureServing.SecurePort = 70000 }, "--secure-port"},
		{"slice size", func(c *Config) { c.MaxEndpointsPerSlice = 0 }, "--max-endpoints-per-slice"},
		{"node CIDRs without a cluster CIDR", func(c *Config) { c.AllocateNodeCIDRs = true }, "--cluster-cidr"},
		{"bad dual-stack CIDR", func(c *Config) {
			c.AllocateNodeCIDRs, c.ClusterCIDR = true, "10.244.0.0/16,nonsense"
		}, "--cluster-cidr"},
		{"node mask out of range", func(c *Config) {
			c.AllocateNodeCIDRs, c.ClusterCIDR, c.NodeCIDRMaskSize = true, "10.244.0.0/16", 200
		}, "--node-cidr-mask-size"},
		{"no HPA workers", func(c *Config) { c.ConcurrentHPASyncs = 0 }, "--concurrent-horizontal-pod-autoscaler-syncs must be greater than 0"},
		{"no HPA sync period", func(c *Config) { c.HPASyncPeriod = 0 }, "--horizontal-pod-autoscaler-sync-period"},
		{"negative HPA tolerance", func(c *Config) { c.HPATolerance = -0.1 }, "--horizontal-pod-autoscaler-tolerance"},
		{"lease shorter than renew deadline", func(c *Config) { c.LeaderElection.LeaseDuration = time.Second }, "lease duration"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Kubeconfig = "/nonexistent/kubeconfig"
			tc.mod(&cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := Run(ctx, cfg)
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want ErrInvalidConfig mentioning %q", err, tc.want)
			}
		})
	}
}

func TestRunReportsAnUnreadableKubeconfig(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Kubeconfig = "/nonexistent/kubeconfig"
	cfg.SecureServing.SecurePort = 0
	// A valid dual-stack configuration gets past validation.
	cfg.AllocateNodeCIDRs, cfg.ClusterCIDR = true, "10.244.0.0/16,fd00:10:244::/56"
	err := Run(context.Background(), cfg)
	if errors.Is(err, ErrInvalidConfig) || err == nil || !strings.Contains(err.Error(), "/nonexistent/kubeconfig") {
		t.Fatalf("got %v, want an error naming the kubeconfig", err)
	}
}

func TestGCWatchesEveryDeletableResourceButEvents(t *testing.T) {
	got := map[string]bool{}
	for _, r := range gcResources() {
		got[r.GVR.Resource] = true
		if r.Kind == "" {
			t.Fatalf("%v has no kind", r.GVR)
		}
	}
	for _, want := range []string{"pods", "replicasets", "deployments", "daemonsets", "endpointslices", "services", "configmaps"} {
		if !got[want] {
			t.Errorf("%s not watched", want)
		}
	}
	if got["events"] {
		t.Error("events are watched")
	}
}
