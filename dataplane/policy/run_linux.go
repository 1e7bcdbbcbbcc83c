package policy

import (
	"context"
	"fmt"
)

// Run enforces NetworkPolicy on this node until ctx ends, with the eBPF
// datapath, or the iptables one (--network-policy=iptables, or auto on a
// kernel that cannot run the tcx programs).
func Run(ctx context.Context, cfg RunConfig) error {
	if cfg.Mode == ModeOff {
		cfg.Log.Info("networkpolicy enforcement off (--network-policy=off)")
		return nil
	}
	var dp Datapath
	var bpfErr error
	if cfg.Mode == ModeAuto || cfg.Mode == ModeEBPF {
		b, err := NewBPF(BPFConfig{PinDir: cfg.PinDir, MonitorAllows: cfg.MonitorAllows, Log: cfg.Log})
		if err != nil && cfg.Mode == ModeEBPF {
			return fmt.Errorf("--network-policy=%s: %w", cfg.Mode, err)
		}
		if err == nil {
			dp = b
			cfg.Log.Info("networkpolicy enforcement", "datapath", ModeEBPF, "requested", cfg.Mode)
		}
		bpfErr = err
	}
	if dp == nil {
		ipt, err := NewIPTables(IPTablesConfig{Log: cfg.Log})
		if err != nil {
			if cfg.Mode == ModeAuto {
				cfg.Log.Error("NetworkPolicy is NOT enforced on this node: neither the eBPF nor the iptables policy datapath can run",
					"ebpf", bpfErr, "iptables", err)
				return nil
			}
			return fmt.Errorf("--network-policy=%s: %w", cfg.Mode, err)
		}
		dp = ipt
		if bpfErr != nil {
			cfg.Log.Warn("networkpolicy enforcement falls back to iptables: the eBPF datapath cannot run", "datapath", ModeIPTables,
				"requested", cfg.Mode, "ebpf", bpfErr)
		} else {
			cfg.Log.Info("networkpolicy enforcement", "datapath", ModeIPTables, "requested", cfg.Mode)
		}
	}
	defer dp.Close()
	a, err := NewAgent(AgentConfig{NodeName: cfg.NodeName, Datapath: dp, Links: NetlinkLinks{}, Client: cfg.Client,
		Log: cfg.Log, Registerer: cfg.Registerer})
	if err != nil {
		return err
	}
	return a.Run(ctx)
}
