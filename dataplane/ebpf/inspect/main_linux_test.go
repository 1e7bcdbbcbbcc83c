package inspect

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/waggle-io/waggle/internal/testutil"
)

// childEnv makes the test binary act as `waggle bpf` (see TestMain), so a
// test can run the real CLI path in another process, e.g. as another user.
const childEnv = "WAGGLE_INSPECT_TEST_CHILD"

// childNoBPFFS makes the child unmount bpffs in its own mount namespace.
const childNoBPFFS = "WAGGLE_INSPECT_TEST_NO_BPFFS"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		if os.Getenv(childNoBPFFS) == "1" {
			// In the private mount namespace the parent gave us: take
			// every bpffs off /sys/fs/bpf, as on a node that never ran
			// the eBPF proxy.
			for i := 0; i < 10 && checkBPFFS(bpffsRoot+"/x") == nil; i++ {
				if err := unix.Unmount(bpffsRoot, unix.MNT_DETACH); err != nil {
					fmt.Fprintf(os.Stderr, "unmount bpffs: %v\n", err)
					os.Exit(99)
				}
			}
		}
		cfg, err := ParseArgs(os.Args[1:], os.Stderr)
		if err == nil {
			err = Run(context.Background(), cfg)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "waggle bpf: %v\n", err)
		}
		os.Exit(exitCodeOf(err))
	}
	os.Exit(m.Run())
}

// TestNotRootGetsAClearError runs the CLI as user nobody against real
// pinned state: it must say that it needs root, with its own exit code.
func TestNotRootGetsAClearError(t *testing.T) {
	f := newFixture(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// A copy nobody may execute (go test's build directory is root's only).
	dir, err := os.MkdirTemp("", "inspect-nonroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "waggle-bpf")
	if err := copyFile(self, bin); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "status", "--pin-dir", f.pinDir)
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != ExitFailure {
		t.Fatalf("as nobody: %v, want exit %d; stderr: %s", err, ExitFailure, stderr.String())
	}
	t.Logf("as nobody: %s", stderr.String())
	if !strings.Contains(stderr.String(), "needs root") {
		t.Errorf("stderr does not say root is needed: %s", stderr.String())
	}
}

// TestNoBPFFSMountedSaysSo runs the CLI in a private mount namespace
// without bpffs on /sys/fs/bpf (the host's mount is untouched).
func TestNoBPFFSMountedSaysSo(t *testing.T) {
	testutil.RequiresRoot(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "status", "--node", "some-node")
	cmd.Env = append(os.Environ(), childEnv+"=1", childNoBPFFS+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	t.Logf("without bpffs: %s", stderr.String())
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != ExitNoState {
		t.Fatalf("without bpffs: %v, want exit %d; stderr: %s", err, ExitNoState, stderr.String())
	}
	if !strings.Contains(stderr.String(), "no BPF filesystem is mounted on /sys/fs/bpf") {
		t.Errorf("stderr does not name the missing bpffs: %s", stderr.String())
	}
	if checkBPFFS(bpffsRoot+"/x") != nil {
		t.Fatal("the host lost its bpffs mount")
	}
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
