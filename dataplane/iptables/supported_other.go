//go:build !linux

package iptables

import (
	"fmt"

	"github.com/waggle-io/waggle/dataplane"
)

func supported() error {
	return fmt.Errorf("iptables backend needs Linux: %w", dataplane.ErrNotSupported)
}
