package cluster

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/waggle-io/waggle/internal/procfs"
)

func TestUpOrJoinFindsTheDataDir(t *testing.T) {
	for _, tt := range []struct {
		argv    []string
		cmd     string
		dataDir string
		ok      bool
	}{
		{[]string{"/usr/local/bin/waggle", "up"}, "up", "/var/lib/waggle", true},
		{[]string{"bin/waggle", "up", "--data-dir", "/d1", "--node=false"}, "up", "/d1", true},
		{[]string{"waggle", "join", "--server", "https://s:6443", "-data-dir=/d2"}, "join", "/d2", true},
		{[]string{"waggle", "join", "--data-dir=/d3", "--kubelet-arg", "root-dir=/x"}, "join", "/d3", true},
		{[]string{"waggle", "proxy", "--data-dir", "/d1"}, "", "", false},
		{[]string{"waggle", "down", "--data-dir", "/d1"}, "", "", false},
		{[]string{"nsenter", "up", "--data-dir", "/d1"}, "", "", false},
		{[]string{"waggle"}, "", "", false},
	} {
		cmd, dir, ok := upOrJoin(tt.argv)
		if cmd != tt.cmd || dir != tt.dataDir || ok != tt.ok {
			t.Errorf("upOrJoin(%q) = %q, %q, %v; want %q, %q, %v", tt.argv, cmd, dir, ok, tt.cmd, tt.dataDir, tt.ok)
		}
	}
}

// A data dir whose recorded process still runs is refused; once that
// process is gone, the next claim takes the data dir over and keeps the
// node part of the footprint (for waggle down --purge).
func TestClaimDataDirRefusesADataDirInUse(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	sleeper := exec.Command("sleep", "60")
	if err := sleeper.Start(); err != nil {
		t.Skip("no sleep:", err)
	}
	t.Cleanup(func() { sleeper.Process.Kill(); sleeper.Wait() })
	st, err := procfs.ReadStat(sleeper.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	f, err := ClaimDataDir(dir, "up")
	if err != nil {
		t.Fatal(err)
	}
	f.PID, f.StartTime = sleeper.Process.Pid, st.StartTime
	if err := f.RecordNode(dir, NodeFootprint{Name: "n1", BPFPinDir: "/sys/fs/bpf/waggle/n1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ClaimDataDir(dir, "join"); err == nil || !strings.Contains(err.Error(), "already runs") {
		t.Fatalf("claim of a data dir in use: %v, want an error saying it already runs", err)
	}
	// The same PID with another start time is a reused PID, not the owner.
	f.StartTime++
	if err := f.Save(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := ClaimDataDir(dir, "join"); err != nil {
		t.Fatalf("claim with a reused PID recorded: %v", err)
	}
	f.StartTime--
	if err := f.Save(dir); err != nil {
		t.Fatal(err)
	}
	sleeper.Process.Kill()
	sleeper.Wait()
	g, err := ClaimDataDir(dir, "join")
	if err != nil {
		t.Fatalf("claim after the owner exited: %v", err)
	}
	back, err := LoadFootprint(dir)
	if err != nil {
		t.Fatal(err)
	}
	if back.Command != "join" || back.PID != g.PID || back.Node == nil || back.Node.BPFPinDir != "/sys/fs/bpf/waggle/n1" {
		t.Errorf("footprint after the claim: %+v (node %+v)", back, back.Node)
	}
}
