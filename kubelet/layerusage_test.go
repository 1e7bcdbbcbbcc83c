package kubelet

import (
	"context"
	"testing"
	"time"

	"github.com/waggle-io/waggle/kubelet/runtime"
)

// countingStorage measures a layer as its call count.
type countingStorage struct {
	runtime.Storage
	calls map[string]int
}

func (s *countingStorage) WritableLayerUsage(_ context.Context, id string) (uint64, uint64, error) {
	s.calls[id]++
	return uint64(s.calls[id]), 1, nil
}

// TestLayerUsageIsMeasuredAtMostOncePerTTL: the summary, built every 10 s,
// reuses a container's writable-layer usage for layerUsageTTL, measures it
// again after, and forgets containers not seen for ten TTLs.
func TestLayerUsageIsMeasuredAtMostOncePerTTL(t *testing.T) {
	s := &countingStorage{calls: map[string]int{}}
	var c layerUsageCache
	ctx, t0 := context.Background(), time.Now()
	for i := range 6 {
		if b, _, err := c.get(ctx, s, "a", t0.Add(time.Duration(i)*10*time.Second)); err != nil || b != 1 {
			t.Fatalf("pass %d: %d %v, want the first measurement", i, b, err)
		}
	}
	if b, _, _ := c.get(ctx, s, "a", t0.Add(layerUsageTTL)); b != 2 || s.calls["a"] != 2 {
		t.Fatalf("after the TTL: %d (%d walks), want a second measurement", b, s.calls["a"])
	}
	c.get(ctx, s, "b", t0.Add(11*layerUsageTTL+time.Second))
	if _, kept := c.m["a"]; kept || len(c.m) != 1 {
		t.Fatalf("entries %v: a container unseen for ten TTLs should be dropped", c.m)
	}
}
