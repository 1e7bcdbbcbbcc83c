package policy

import (
	"context"
	"fmt"
)

// Run enforces NetworkPolicy on this node until ctx ends.
func Run(ctx context.Context, cfg RunConfig) error {
	if cfg.Mode == ModeOff {
		cfg.Log.Info("networkpolicy enforcement off (--network-policy=off)")
		return nil
	}
	dp, err := NewBPF(BPFConfig{PinDir: cfg.PinDir, MonitorAllows: cfg.MonitorAllows, Log: cfg.Log})
	if err != nil {
		if cfg.Mode == ModeAuto {
			cfg.Log.Error("NetworkPolicy is NOT enforced on this node: the eBPF policy dataplane cannot run", "err", err)
			return nil
		}
		return fmt.Errorf("--network-policy=%s: %w", cfg.Mode, err)
	}
	defer dp.Close()
	a, err := NewAgent(AgentConfig{NodeName: cfg.NodeName, Datapath: dp, Links: NetlinkLinks{}, Client: cfg.Client,
		Log: cfg.Log, Registerer: cfg.Registerer})
	if err != nil {
		return err
	}
	return a.Run(ctx)
}
