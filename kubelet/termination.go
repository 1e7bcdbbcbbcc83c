package kubelet

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/waggle-io/waggle/kubelet/containerlog"
	"github.com/waggle-io/waggle/kubelet/runtime"
)

// Upstream's limits on a termination message: the file is read up to 4 KiB;
// the log fallback is the last 2 KiB of the log's last 80 lines
// (MaxContainerTerminationMessageLogLines, ...LogLength).
const (
	maxTerminationMessage     = 4 << 10
	maxTerminationLogLines    = 80
	maxTerminationLogFallback = 2 << 10
)

// terminationLogPath is the host file a container's terminationMessagePath
// is bound to, beside its log.
func terminationLogPath(logPath string) string {
	return strings.TrimSuffix(logPath, ".log") + ".termination-log"
}

// prepareTerminationLog makes the container's (empty, world-writable, as
// upstream) termination-log file and the mount of it at containerPath.
func prepareTerminationLog(logPath, containerPath string) (runtime.Mount, error) {
	host := terminationLogPath(logPath)
	if err := os.MkdirAll(filepath.Dir(host), 0o755); err != nil {
		return runtime.Mount{}, fmt.Errorf("termination log: %w", err)
	}
	if err := os.WriteFile(host, nil, 0o666); err != nil {
		return runtime.Mount{}, fmt.Errorf("termination log: %w", err)
	}
	if err := os.Chmod(host, 0o666); err != nil { //nolint:gosec // any container user writes its message, as upstream
		return runtime.Mount{}, fmt.Errorf("termination log: %w", err)
	}
	return runtime.Mount{HostPath: host, ContainerPath: containerPath}, nil
}

// withTerminationMessage sets a terminated state's message as upstream's
// kubelet does: the termination-log file's contents, or, with
// FallbackToLogsOnError, the tail of the log of a container that failed
// and wrote no message.
func withTerminationMessage(st *v1.ContainerState, c runtime.Container, spec *v1.Container) {
	if st.Terminated == nil || c.LogPath == "" || st.Terminated.Message != "" {
		return
	}
	if b, err := readAtMost(terminationLogPath(c.LogPath), maxTerminationMessage); err == nil && len(b) > 0 {
		st.Terminated.Message = string(b)
		return
	}
	if spec.TerminationMessagePolicy != v1.TerminationMessageFallbackToLogsOnError || c.ExitCode == 0 {
		return
	}
	// Both streams, partial records joined, without the CRI prefixes.
	tail := &tailBuffer{max: maxTerminationLogFallback}
	opts := containerlog.Options{TailLines: maxTerminationLogLines}
	if err := containerlog.Read(context.Background(), c.LogPath, opts, tail, tail, nil); err != nil {
		st.Terminated.Message = fmt.Sprintf("Error on reading termination message from logs: %v", err)
		return
	}
	st.Terminated.Message = string(tail.b)
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	b   []byte
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

// readAtMost reads up to n bytes of the head of a file.
func readAtMost(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, n))
}
