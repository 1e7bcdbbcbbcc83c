package kubelet

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/waggle-io/waggle/kubelet/containerlog"
	"github.com/waggle-io/waggle/kubelet/runtime"
)

func TestTerminationMessageFromFileOrLogsAsUpstream(t *testing.T) {
	dir := t.TempDir()
	logPath := filepath.Join(dir, "0.log")
	// A CRI log: 99 lines on stdout, the last line on stderr in two pieces.
	var log []byte
	now := time.Now()
	for i := 0; i < 99; i++ {
		log = containerlog.Record{Time: now, Stream: containerlog.Stdout, Content: fmt.Appendf(nil, "line %d", i)}.Append(log)
	}
	log = containerlog.Record{Time: now, Stream: containerlog.Stderr, Partial: true, Content: []byte("line")}.Append(log)
	log = containerlog.Record{Time: now, Stream: containerlog.Stderr, Content: []byte(" 99")}.Append(log)
	os.WriteFile(logPath, log, 0o644)
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
	// The last 80 records (upstream counts the file's lines): line 21 … 99.
	got := state(failed, v1.TerminationMessageFallbackToLogsOnError)
	if !strings.HasPrefix(got, "line 21\n") || !strings.HasSuffix(got, "line 98\nline 99\n") || strings.Count(got, "\n") != 79 {
		t.Errorf("fallback: want the content of the last 80 records, got %d lines: %q", strings.Count(got, "\n"), got)
	}
	if got := state(ok, v1.TerminationMessageFallbackToLogsOnError); got != "" {
		t.Errorf("fallback for a success: %q", got)
	}
	// Long lines: the last 2 KiB of the last 80 lines.
	log = nil
	for i := 0; i < 80; i++ {
		log = containerlog.Record{Time: now, Stream: containerlog.Stdout, Content: fmt.Appendf(nil, "%03d%s", i, strings.Repeat("y", 96))}.Append(log)
	}
	os.WriteFile(logPath, log, 0o644)
	if got := state(failed, v1.TerminationMessageFallbackToLogsOnError); len(got) != 2048 || !strings.HasSuffix(got, "079"+strings.Repeat("y", 96)+"\n") {
		t.Errorf("fallback of long lines: %d bytes, want the last 2048: %q", len(got), got)
	}
	os.WriteFile(m.HostPath, []byte(strings.Repeat("x", 5000)), 0o666)
	if got := state(ok, v1.TerminationMessageFallbackToLogsOnError); len(got) != 4096 {
		t.Errorf("file message: %d bytes, want the first 4096", len(got))
	}
}
