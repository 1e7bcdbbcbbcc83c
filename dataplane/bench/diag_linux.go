package bench

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// Every failed operation is sorted by kind, so that a benchmark's errors
// say what failed: a connect that timed out (a SYN and its retransmits went
// unanswered), a reply that did not come, a reset, a refused connect.
var errKinds = struct {
	sync.Mutex
	n map[string]int
}{n: map[string]int{}}

// opError marks the step of an operation that failed.
type opError struct {
	step string // "connect", "write" or "read"
	err  error
}

func (e *opError) Error() string { return e.step + ": " + e.err.Error() }
func (e *opError) Unwrap() error { return e.err }

// errKind names an operation's failure: step and cause.
func errKind(err error) string {
	step := "op"
	var oe *opError
	if errors.As(err, &oe) {
		step = oe.step
	}
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return step + " timeout"
	case errors.Is(err, unix.ECONNRESET):
		return step + " reset"
	case errors.Is(err, unix.ECONNREFUSED):
		return step + " refused"
	}
	return step + " other"
}

// noteErr counts a failed operation by kind.
func noteErr(err error) {
	k := errKind(err)
	errKinds.Lock()
	errKinds.n[k]++
	errKinds.Unlock()
}

// takeErrKinds returns the counts since the last call and resets them.
func takeErrKinds() map[string]int {
	errKinds.Lock()
	defer errKinds.Unlock()
	out := errKinds.n
	errKinds.n = map[string]int{}
	return out
}

// kernelCounters are the TCP counters a lost or refused connection shows
// up in: on the server side a full accept queue (ListenOverflows,
// ListenDrops), SYNs answered by a challenge ACK instead of a SYN-ACK (an
// old connection on the same 4-tuple still open), on the client side SYN
// retransmits and resets.
var kernelCounters = []string{
	"TcpExt:ListenOverflows", "TcpExt:ListenDrops", "TcpExt:TCPReqQFullDrop", "TcpExt:TCPBacklogDrop",
	"TcpExt:TCPSynRetrans", "TcpExt:TCPTimeouts", "TcpExt:TCPChallengeACK", "TcpExt:TCPACKSkippedChallenge",
	"TcpExt:TCPACKSkippedSynRecv", "TcpExt:PAWSEstab", "TcpExt:TCPAbortOnData", "TcpExt:TCPAbortOnClose",
	"Tcp:RetransSegs", "Tcp:OutRsts", "Tcp:InErrs", "Tcp:AttemptFails", "Tcp:EstabResets",
	"TcpExt:TW", "TcpExt:TWRecycled", "TcpExt:TCPTimeWaitOverflow",
}

// netCounters reads the TCP counters of the network namespace at path
// (/proc/net/netstat and /proc/net/snmp, as nstat does).
func netCounters(path string) (map[string]int64, error) {
	out := map[string]int64{}
	err := ns.WithNetNSPath(path, func(ns.NetNS) error {
		for _, f := range []string{"/proc/thread-self/net/netstat", "/proc/thread-self/net/snmp"} {
			raw, err := os.ReadFile(f)
			if err != nil {
				return err
			}
			// Pairs of lines: "Prefix: names..." then "Prefix: values...".
			sc := bufio.NewScanner(bytes.NewReader(raw))
			var names []string
			for sc.Scan() {
				fields := strings.Fields(sc.Text())
				if len(fields) < 2 {
					continue
				}
				prefix := strings.TrimSuffix(fields[0], ":")
				if names == nil || names[0] != prefix {
					names = append([]string{prefix}, fields[1:]...)
					continue
				}
				for i, v := range fields[1:] {
					if i+1 < len(names) {
						n, _ := strconv.ParseInt(v, 10, 64)
						out[prefix+":"+names[i+1]] = n
					}
				}
				names = nil
			}
		}
		return nil
	})
	return out, err
}

// counterDelta adds after − before of the kernelCounters that moved to
// into, each named side + " " + counter.
func counterDelta(into map[string]int64, side string, before, after map[string]int64) {
	for _, k := range kernelCounters {
		if d := after[k] - before[k]; d != 0 {
			into[side+" "+k] += d
		}
	}
}
