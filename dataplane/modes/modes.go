// Package modes lists the proxy backends built into Waggle, in auto's order
// of preference (ebpf, then iptables; ipvs only when asked for), as the
// dataplane.Mode values that dataplane.Run selects from. It exists because
// the backends import package dataplane and so cannot be imported by it; it
// holds no logic of its own.
package modes

import (
	"context"

	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/dataplane/ebpf"
	"github.com/waggle-io/waggle/dataplane/iptables"
	"github.com/waggle-io/waggle/dataplane/ipvs"
)

// All returns every built-in mode.
func All() []dataplane.Mode {
	return []dataplane.Mode{EBPF(), IPTables(), IPVS()}
}

func ebpfConfig(mc dataplane.ModeConfig) ebpf.Config {
	c := ebpf.Config{
		NodeName: mc.NodeName, CgroupPath: mc.CgroupRoot, PinDir: mc.PinDir,
		MaxServices: mc.MaxServices, MaxBackends: mc.MaxBackends, MaxAffinity: mc.MaxAffinity, MaxReverseSockets: mc.MaxRevSocks,
		Log: mc.Log, Metrics: mc.Metrics,
	}
	if len(mc.NodePortDevices) > 0 {
		c.NorthSouth = &ebpf.NorthSouth{Devices: mc.NodePortDevices, MaglevTableSize: mc.MaglevTableSize, NetNS: mc.NodePortNetNS,
			Acceleration: mc.LBAcceleration, LBMode: mc.LBMode, DisableTCX: mc.DisableTCX}
	}
	return c
}

// EBPF is the socket-level eBPF mode.
func EBPF() dataplane.Mode {
	return dataplane.Mode{
		Name: dataplane.ModeEBPF, AutoCandidate: true, LoopbackNodePorts: true,
		Supported: ebpf.Supported,
		New:       func(mc dataplane.ModeConfig) (dataplane.Backend, error) { return ebpf.New(ebpfConfig(mc)) },
		Cleanup: func(_ context.Context, mc dataplane.ModeConfig) error {
			dir := mc.PinDir
			if dir == "" {
				node := mc.NodeName
				if node == "" {
					node = "local"
				}
				dir = ebpf.DefaultPinRoot + "/" + node
			}
			if ebpf.Supported() != nil {
				return nil // nothing can have been pinned
			}
			return ebpf.CleanupPinned(dir)
		},
	}
}

// IPTables is the iptables mode.
func IPTables() dataplane.Mode {
	return dataplane.Mode{
		Name: dataplane.ModeIPTables, AutoCandidate: true,
		Supported: iptables.Supported,
		New: func(mc dataplane.ModeConfig) (dataplane.Backend, error) {
			return iptables.New(iptables.Config{Log: mc.Log, Metrics: mc.Metrics})
		},
		Cleanup: func(ctx context.Context, mc dataplane.ModeConfig) error {
			if iptables.Supported() != nil {
				return nil
			}
			b, err := iptables.New(iptables.Config{Log: mc.Log})
			if err != nil {
				return err
			}
			return b.Cleanup(ctx)
		},
	}
}

// IPVS is the IPVS mode (never picked by auto).
func IPVS() dataplane.Mode {
	return dataplane.Mode{
		Name:      dataplane.ModeIPVS,
		Supported: ipvs.Supported,
		New: func(mc dataplane.ModeConfig) (dataplane.Backend, error) {
			return ipvs.New(ipvs.Config{Scheduler: mc.IPVSScheduler, Log: mc.Log})
		},
		Cleanup: func(ctx context.Context, mc dataplane.ModeConfig) error {
			if iptables.Supported() != nil {
				return nil
			}
			return ipvs.Cleanup(ctx, ipvs.Config{Log: mc.Log})
		},
	}
}
