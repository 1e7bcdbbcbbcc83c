// Package testutil holds the gates and fixtures that Waggle's tests share:
// skipping (or, in CI, failing) tests that need root or a kernel feature, and
// fresh network namespaces that clean themselves up.
//
// The rule it enforces: when WAGGLE_PRIVILEGED_TESTS=1 is set (as .ci/run
// does), a gate that cannot be satisfied fails the test instead of skipping
// it, so that a green CI means the privileged tests really ran. Features that
// are optional for Waggle (IPVS) always skip with a reason. In `go test
// -short` (make test-unit) every privileged gate skips: that tier is the
// unprivileged unit tests only.
//
// It is not a test framework: tests stay plain `testing` code.
package testutil

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// PrivilegedEnv is the environment variable that turns unsatisfiable
// privileged gates from skips into failures.
const PrivilegedEnv = "WAGGLE_PRIVILEGED_TESTS"

// PrivilegedRequired reports whether the environment demands that privileged
// tests run (WAGGLE_PRIVILEGED_TESTS=1).
func PrivilegedRequired() bool { return os.Getenv(PrivilegedEnv) == "1" }

// unmet skips t, or fails it when privileged tests are required.
func unmet(t testing.TB, format string, args ...any) {
	t.Helper()
	if PrivilegedRequired() && !testing.Short() {
		t.Fatalf("privileged test cannot run ("+PrivilegedEnv+"=1): "+format, args...)
	}
	t.Skipf(format, args...)
}

// Privileged marks t as an integration test: it is skipped in -short mode
// (the unit tier) and otherwise runs.
func Privileged(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: skipped in -short (unit tier)")
	}
}

// RequiresRoot skips t unless it runs as root (and not in -short mode).
func RequiresRoot(t testing.TB) {
	t.Helper()
	Privileged(t)
	if os.Geteuid() != 0 {
		unmet(t, "needs root (euid is %d)", os.Geteuid())
	}
}

// RequiresBinary skips t unless name is on PATH and returns its path.
func RequiresBinary(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		unmet(t, "needs %s on PATH: %v", name, err)
	}
	return p
}

// UniqueName returns prefix followed by random hex, short enough for an
// interface name (at most 15 bytes for prefixes of up to 5 bytes).
func UniqueName(prefix string) string {
	var b [5]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return prefix + hex.EncodeToString(b[:])
}
