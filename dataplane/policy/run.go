package policy

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
)

// Modes of --network-policy.
const (
	ModeAuto     = "auto"     // eBPF where the kernel allows, else iptables, else a loud warning and no enforcement
	ModeEBPF     = "ebpf"     // eBPF or fail
	ModeIPTables = "iptables" // the iptables+ipset fallback or fail
	ModeOff      = "off"      // no enforcement
)

// RunConfig configures the enforcement the node agent runs (Run).
type RunConfig struct {
	Mode     string
	NodeName string
	// PinDir is the policy pin directory (default:
	// /sys/fs/bpf/waggle/<node>/policy).
	PinDir        string
	MonitorAllows bool
	Client        kubernetes.Interface
	Log           *slog.Logger
	Registerer    prometheus.Registerer
}

// DefaultPinRoot is where every node's BPF state is pinned (as
// dataplane/ebpf.DefaultPinRoot).
const DefaultPinRoot = "/sys/fs/bpf/waggle"

// DefaultPinDir is the policy pin directory of a node whose proxy pins
// under nodePinDir (/sys/fs/bpf/waggle/<node>).
func DefaultPinDir(nodePinDir string) string { return nodePinDir + "/" + DefaultPinSubdir }
