package bench

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/waggle-io/waggle/internal/testutil"
)

// TestRunMeasuresEveryPathAndWritesJSON runs a tiny benchmark for real:
// namespaces, echo servers, eBPF and iptables backends. It checks that
// every path carried traffic without errors, not how fast (timing belongs
// to the benchmark itself).
func TestRunMeasuresEveryPathAndWritesJSON(t *testing.T) {
	testutil.RequiresKernelFeature(t, testutil.CgroupSockAddr)
	testutil.RequiresBinary(t, "iptables-restore")
	out := filepath.Join(t.TempDir(), "bench.json")
	rep, err := Run(context.Background(), Config{Duration: 150 * time.Millisecond, Warmup: 50 * time.Millisecond,
		Rounds: 1, Clients: 2, Backends: 2, ServiceCounts: []int{1, 50}, ProgramServices: 100, ProgramBackends: 2,
		ProgramRounds: 1, LatencySamples: 5, Output: out})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rows) != 6 {
		t.Fatalf("%d rows, want 2 counts × 3 tests", len(rep.Rows))
	}
	for _, row := range rep.Rows {
		for _, p := range []string{"direct", "ebpf", "iptables", pathDirectIPT} {
			s := row.Paths[p]
			// A loaded machine may time out a stray UDP request; more
			// than a couple of errors means a broken path.
			if s == nil || s.Median <= 0 || s.Errors > 2 {
				t.Errorf("%d services %s %s: %+v", row.Services, row.Test, p, s)
			}
		}
	}
	if rep.Program == nil || rep.Program.Median <= 0 || rep.ChangeP99 <= 0 {
		t.Errorf("programming figures missing: %+v p99 %v", rep.Program, rep.ChangeP99)
	}
	var back Report
	b, err := os.ReadFile(out)
	if err != nil || json.Unmarshal(b, &back) != nil || len(back.Rows) != 6 {
		t.Errorf("JSON report: %v, %d rows", err, len(back.Rows))
	}
}
