//go:build !linux

package iptables

import (
	"fmt"
	"net/netip"

	"github.com/waggle-io/waggle/dataplane"
)

func deleteUDPFlows(string, Family, netip.AddrPort, netip.Addr) error {
	return fmt.Errorf("conntrack over netlink needs Linux: %w", dataplane.ErrNotSupported)
}
