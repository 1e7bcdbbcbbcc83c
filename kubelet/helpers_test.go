package kubelet

import "net/netip"

type netipPrefixT = netip.Prefix

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }
