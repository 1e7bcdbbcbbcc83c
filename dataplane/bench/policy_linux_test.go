package bench

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/waggle-io/waggle/internal/testutil"
)

// TestRunPolicyMeasuresEveryPath runs a tiny policy benchmark for real and
// checks every path carried traffic without errors (not how fast).
func TestRunPolicyMeasuresEveryPath(t *testing.T) {
	testutil.Privileged(t)
	testutil.RequiresRoot(t)
	rep, err := RunPolicy(context.Background(), PolicyConfig{Duration: 150 * time.Millisecond, Warmup: 50 * time.Millisecond,
		Rounds: 1, Clients: 2, Policies: 10, Pods: 50, LatencySamples: 4, Out: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rows) != 2 {
		t.Fatalf("%d rows, want TCP_CRR and TCP_RR", len(rep.Rows))
	}
	for _, row := range rep.Rows {
		keys := []string{PolicyPathNone}
		for _, kind := range PolicyDatapaths {
			for _, p := range []string{PolicyPathAttached, PolicyPathOne, PolicyPathMany} {
				keys = append(keys, kind+"/"+p)
			}
		}
		for _, p := range keys {
			if s := row.Paths[p]; s == nil || s.Median <= 0 || s.Errors > 2 {
				t.Errorf("%s %s: %+v", row.Test, p, s)
			}
		}
	}
	for _, kind := range PolicyDatapaths {
		if rep.Entries[kind] < 10 || rep.WriteToEnforced[kind].P99 <= 0 {
			t.Errorf("%s: server entries %d, write-to-enforced %+v", kind, rep.Entries[kind], rep.WriteToEnforced[kind])
		}
	}
}
