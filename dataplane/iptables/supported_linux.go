package iptables

import (
	"context"
	"fmt"
	"os/exec"
	"time"

	"github.com/waggle-io/waggle/dataplane"
)

func supported() error {
	for _, bin := range []string{"iptables", "iptables-restore", "iptables-save"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("iptables backend: %s not found on PATH (install the iptables package): %w", bin, dataplane.ErrNotSupported)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "iptables", "-w", "-t", "nat", "-S", "POSTROUTING").CombinedOutput(); err != nil {
		return fmt.Errorf("iptables backend: cannot read the nat table (%v: %s): %w", err, out, dataplane.ErrNotSupported)
	}
	return nil
}
