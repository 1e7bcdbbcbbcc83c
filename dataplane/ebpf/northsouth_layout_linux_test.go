//go:build 386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm

package ebpf

import (
	"net"
	"testing"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The north-south structs as bpf/README.md ("North-south maps") documents
// them: a change to bpf/lib/nodeport.h shows here and bumps
// WAGGLE_NP_LAYOUT_VERSION.
func TestNorthSouthStructsMatchTheCLayout(t *testing.T) {
	sizes := []struct {
		name      string
		got, want uintptr
	}{
		{"np_ct_key", unsafe.Sizeof(nodePortNpCtKey{}), 40},
		{"np_ct", unsafe.Sizeof(nodePortNpCt{}), 72},
		{"np_affinity_key", unsafe.Sizeof(nodePortNpAffinityKey{}), 24},
		{"np_affinity", unsafe.Sizeof(nodePortNpAffinity{}), 16},
		{"np_device", unsafe.Sizeof(nodePortNpDevice{}), 24},
		{"np_device.addr6 offset", unsafe.Offsetof(nodePortNpDevice{}.Addr6), 8},
		{"np_config", unsafe.Sizeof(nodePortNpConfig{}), 16},
		{"np_svc", unsafe.Sizeof(nodePortNpSvc{}), 8},
		{"np_src_range_key", unsafe.Sizeof(nodePortNpSrcRangeKey{}), 24},
		{"np_maglev_key", unsafe.Sizeof(nodePortNpMaglevKey{}), 8},
		{"np_maglev_chunk", unsafe.Sizeof(nodePortNpMaglevChunk{}), 1024},
	}
	for _, s := range sizes {
		if s.got != s.want {
			t.Errorf("%s: %d bytes, bpf/README.md documents %d", s.name, s.got, s.want)
		}
	}
	if NPLayoutVersion != 2 || len(npStatNames) != 17 {
		t.Errorf("layout version %d with %d counters: bpf/README.md documents layout 2 with 17 (np_stat)", NPLayoutVersion, len(npStatNames))
	}
}

func TestSNATAddressesPreferUsableIPv6(t *testing.T) {
	addr := func(s string, flags int) netlink.Addr {
		return netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(s)}, Flags: flags}
	}
	for _, c := range []struct {
		name   string
		addrs  []netlink.Addr
		v4, v6 string
	}{
		{"both families, link-local skipped", []netlink.Addr{addr("fe80::1", 0), addr("10.66.0.1", 0), addr("fd06::1", 0)}, "10.66.0.1", "fd06::1"},
		{"a usable address before a tentative one", []netlink.Addr{addr("fd06::2", unix.IFA_F_TENTATIVE), addr("fd06::1", 0)}, "invalid IP", "fd06::1"},
		{"tentative rather than none", []netlink.Addr{addr("fd06::2", unix.IFA_F_TENTATIVE)}, "invalid IP", "fd06::2"},
		{"never one whose DAD failed", []netlink.Addr{addr("fd06::2", unix.IFA_F_DADFAILED|unix.IFA_F_TENTATIVE), addr("10.66.0.1", 0)}, "10.66.0.1", "invalid IP"},
	} {
		v4, v6 := snatAddrs(c.addrs)
		if v4.String() != c.v4 || v6.String() != c.v6 {
			t.Errorf("%s: %s %s, want %s %s", c.name, v4, v6, c.v4, c.v6)
		}
	}
}
