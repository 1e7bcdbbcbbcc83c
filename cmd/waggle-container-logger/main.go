// Command waggle-container-logger writes one container's output as a CRI
// log: `waggle-container-logger container-logger [--stdout FIFO --stderr
// FIFO] PATH`, the command line `waggle container-logger` answers too. The
// containerd shim starts one for every container (binary:// log URI), so it
// is its own small executable: starting the whole waggle binary (every
// Kubernetes and etcd package's init) cost ~60 ms of CPU per container,
// more than runc's own share of a start. The kubelet uses it when it sits
// beside the waggle executable (bin/, `make build`), else waggle itself.
package main

import (
	"fmt"
	"os"

	"github.com/waggle-io/waggle/kubelet/containerlog"
)

func main() {
	code := containerlog.Main(os.Args)
	if code < 0 {
		fmt.Fprintf(os.Stderr, "usage: %s %s [--stdout FIFO --stderr FIFO] PATH\n", os.Args[0], containerlog.LoggerCommand)
		code = 2
	}
	os.Exit(code)
}
