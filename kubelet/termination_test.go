package kubelet

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/waggle-io/waggle/kubelet/runtime"
)

func TestTerminationMessageFromFileOrLogsAsUpstream(t *testing.T) {
	dir := t.TempDir()
	logPath := filepath.Join(dir, "0.log")
	var log strings.Builder
	for i := 0; i < 100; i++ {
		fmt.Fprintf(&log, "line %d\n", i)
	}
	os.WriteFile(logPath, []byte(log.String()), 0o644)
	m, err := prepareTerminationLog(logPath, "/dev/termination-log")
	if err != nil || m.ContainerPath != "/dev/termination-log" {
		t.Fatalf("mount %+v %v", m, err)
	}
	if fi, _ := os.Stat(m.HostPath); fi.Mode().Perm() != 0o666 {
		t.Errorf("termination log mode %v, want 0666", fi.Mode().Perm())
	}
	state := func(c runtime.Container, policy v1.TerminationMessagePolicy) string {
		st := v1.ContainerState{Terminated: &v1.ContainerStateTerminated{ExitCode: c.ExitCode}}
		withTerminationMessage(&st, c, &v1.Container{TerminationMessagePolicy: policy})
		return st.Terminated.Message
	}
	failed := runtime.Container{LogPath: logPath, ExitCode: 1, State: runtime.StateExited}
	ok := runtime.Container{LogPath: logPath, ExitCode: 0, State: runtime.StateExited}
	if got := state(failed, v1.TerminationMessageReadFile); got != "" {
		t.Errorf("File policy, no file content: %q", got)
	}
	got := state(failed, v1.TerminationMessageFallbackToLogsOnError)
	if !strings.HasPrefix(got, "line 20\n") || !strings.HasSuffix(got, "line 99\n") || strings.Count(got, "\n") != 80 {
		t.Errorf("fallback: want the last 80 lines, got %d lines from %q", strings.Count(got, "\n"), got[:20])
	}
	if got := state(ok, v1.TerminationMessageFallbackToLogsOnError); got != "" {
		t.Errorf("fallback for a success: %q", got)
	}
	os.WriteFile(m.HostPath, []byte(strings.Repeat("x", 5000)), 0o666)
	if got := state(ok, v1.TerminationMessageFallbackToLogsOnError); len(got) != 4096 {
		t.Errorf("file message: %d bytes, want the first 4096", len(got))
	}
}
