package cluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/waggle-io/waggle/internal/testutil"
)

// TestPurgeRefusesADirThatIsNoDataDir: a mistyped --data-dir (no footprint,
// no CA, no process of up or join naming it) is refused, and nothing in it
// is touched.
func TestPurgeRefusesADirThatIsNoDataDir(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	keep := filepath.Join(dir, "etc", "important")
	if err := os.MkdirAll(filepath.Dir(keep), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keep, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := Down(context.Background(), DownConfig{DataDir: dir, Purge: true})
	if err == nil || !strings.Contains(err.Error(), "not a data dir of waggle up or join") {
		t.Fatalf("Down --purge of a dir that is no data dir: %v", err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("a refused purge removed %s: %v", keep, err)
	}
}
