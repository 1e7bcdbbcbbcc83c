package routes

import (
	"os/exec"

	"github.com/waggle-io/waggle/internal/testutil"
)

// execIn runs a command in n and returns its output and error (no failing t).
func execIn(n *testutil.NetNS, name string, args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", n.Name, name}, args...)...).CombinedOutput()
	return string(out), err
}
