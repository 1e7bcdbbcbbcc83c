package kubelet

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	v1 "k8s.io/api/core/v1"

	"github.com/waggle-io/waggle/kubelet/runtime"
)

// Upstream's limits on a termination message: the file is read up to 4 KiB;
// the log fallback takes the last 80 lines of at most the last 12 KiB.
const (
	maxTerminationMessage     = 4 << 10
	maxTerminationLogLines    = 80
	maxTerminationLogFallback = 12 << 10
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
	if b, err := readAtMost(terminationLogPath(c.LogPath), maxTerminationMessage, false); err == nil && len(b) > 0 {
		st.Terminated.Message = string(b)
		return
	}
	if spec.TerminationMessagePolicy != v1.TerminationMessageFallbackToLogsOnError || c.ExitCode == 0 {
		return
	}
	b, err := readAtMost(c.LogPath, maxTerminationLogFallback, true)
	if err != nil {
		return
	}
	lines := bytes.SplitAfter(b, []byte("\n"))
	if len(lines) > 0 && len(lines[len(lines)-1]) == 0 {
		lines = lines[:len(lines)-1]
	}
	if len(lines) > maxTerminationLogLines {
		lines = lines[len(lines)-maxTerminationLogLines:]
	}
	st.Terminated.Message = string(bytes.Join(lines, nil))
}

// readAtMost reads up to n bytes of a file: its head, or its tail.
func readAtMost(path string, n int64, tail bool) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if tail {
		if fi, err := f.Stat(); err == nil && fi.Size() > n {
			if _, err := f.Seek(fi.Size()-n, io.SeekStart); err != nil {
				return nil, err
			}
		}
	}
	return io.ReadAll(io.LimitReader(f, n))
}
