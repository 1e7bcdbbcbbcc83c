package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"time"
)

// Family is an IP family: iptables or ip6tables.
type Family int

// The two families.
const (
	IPv4 Family = 4
	IPv6 Family = 6
)

func (f Family) String() string {
	if f == IPv6 {
		return "IPv6"
	}
	return "IPv4"
}

// Runner is the small kernel edge of the backend: the four things it asks of
// iptables. The real one runs the iptables binaries; FakeRunner models the
// tables in memory for unit tests.
type Runner interface {
	// Restore feeds data to iptables-restore --noflush: only the chains it
	// names are flushed and rewritten, atomically per table.
	Restore(ctx context.Context, fam Family, data []byte) error
	// Save returns iptables-save's output for one table.
	Save(ctx context.Context, fam Family, table string) ([]byte, error)
	// EnsureRule inserts rule at the top of chain unless it is already there
	// (anywhere in the chain).
	EnsureRule(ctx context.Context, fam Family, table, chain string, rule ...string) error
	// DeleteRule deletes rule from chain; a missing rule or chain is success.
	DeleteRule(ctx context.Context, fam Family, table, chain string, rule ...string) error
}

// ExecRunner runs iptables, ip6tables, iptables-restore and iptables-save,
// inside the network namespace at NetNSPath when it is set (through
// nsenter), else in the caller's.
type ExecRunner struct {
	NetNSPath string
	// Timeout bounds each command (default 1 minute).
	Timeout time.Duration
}

func (r *ExecRunner) cmd(ctx context.Context, name string, args ...string) (*exec.Cmd, context.CancelFunc) {
	d := r.Timeout
	if d == 0 {
		d = time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	if r.NetNSPath != "" {
		args = append([]string{"--net=" + r.NetNSPath, "--", name}, args...)
		name = "nsenter"
	}
	return exec.CommandContext(ctx, name, args...), cancel
}

func binary(fam Family, tool string) string {
	if fam == IPv6 {
		return "ip6tables" + tool
	}
	return "iptables" + tool
}

func (r *ExecRunner) run(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	c, cancel := r.cmd(ctx, name, args...)
	defer cancel()
	if stdin != nil {
		c.Stdin = bytes.NewReader(stdin)
	}
	var stderr bytes.Buffer
	c.Stderr = &stderr
	out, err := c.Output()
	if err != nil {
		return out, &ExecError{Cmd: name + " " + strings.Join(args, " "), Err: err, Stderr: strings.TrimSpace(stderr.String())}
	}
	return out, nil
}

// ExecError is a failed iptables command with its stderr.
type ExecError struct {
	Cmd    string
	Err    error
	Stderr string
}

func (e *ExecError) Error() string { return fmt.Sprintf("%s: %v: %s", e.Cmd, e.Err, e.Stderr) }
func (e *ExecError) Unwrap() error { return e.Err }

// exitCode returns the command's exit status, or -1.
func (e *ExecError) exitCode() int {
	var ee *exec.ExitError
	if errors.As(e.Err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// Restore implements Runner.
func (r *ExecRunner) Restore(ctx context.Context, fam Family, data []byte) error {
	_, err := r.run(ctx, data, binary(fam, "-restore"), "--noflush", "--wait")
	return err
}

// Save implements Runner.
func (r *ExecRunner) Save(ctx context.Context, fam Family, table string) ([]byte, error) {
	return r.run(ctx, nil, binary(fam, "-save"), "-t", table)
}

// EnsureRule implements Runner.
func (r *ExecRunner) EnsureRule(ctx context.Context, fam Family, table, chain string, rule ...string) error {
	_, err := r.run(ctx, nil, binary(fam, ""), append([]string{"-w", "-t", table, "-C", chain}, rule...)...)
	if err == nil {
		return nil
	}
	var ee *ExecError
	if !errors.As(err, &ee) || ee.exitCode() != 1 {
		return err
	}
	_, err = r.run(ctx, nil, binary(fam, ""), append([]string{"-w", "-t", table, "-I", chain}, rule...)...)
	return err
}

// DeleteRule implements Runner.
func (r *ExecRunner) DeleteRule(ctx context.Context, fam Family, table, chain string, rule ...string) error {
	for {
		_, err := r.run(ctx, nil, binary(fam, ""), append([]string{"-w", "-t", table, "-D", chain}, rule...)...)
		if err == nil {
			continue // delete every copy
		}
		var ee *ExecError
		if errors.As(err, &ee) && ee.exitCode() == 1 {
			return nil // gone (or never there)
		}
		return err
	}
}

// ConntrackCleaner is implemented by runners that can delete conntrack
// entries. The backend uses it to make UDP flows to a removed endpoint pick
// a live one on their next packet, as kube-proxy does (UDP has no end of
// connection that would do it).
type ConntrackCleaner interface {
	// DeleteUDPFlows deletes the UDP entries whose original destination is
	// orig and whose reply source is endpoint. None is success.
	DeleteUDPFlows(ctx context.Context, fam Family, orig netip.AddrPort, endpoint netip.Addr) error
}

// DeleteUDPFlows implements ConntrackCleaner through netlink (conntrack
// filters, as kube-proxy does), in the namespace at NetNSPath when set.
func (r *ExecRunner) DeleteUDPFlows(ctx context.Context, fam Family, orig netip.AddrPort, endpoint netip.Addr) error {
	return deleteUDPFlows(r.NetNSPath, fam, orig, endpoint)
}
