//go:build 386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm

package ebpf

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/waggle-io/waggle/dataplane"
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
		{"np_device", unsafe.Sizeof(nodePortNpDevice{}), 32},
		{"np_device.addr6 offset", unsafe.Offsetof(nodePortNpDevice{}.Addr6), 8},
		{"np_device.mac offset", unsafe.Offsetof(nodePortNpDevice{}.Mac), 24},
		{"np_config", unsafe.Sizeof(nodePortNpConfig{}), 16},
		{"np_svc", unsafe.Sizeof(nodePortNpSvc{}), 8},
		{"np_src_range_key", unsafe.Sizeof(nodePortNpSrcRangeKey{}), 24},
		{"np_maglev_key", unsafe.Sizeof(nodePortNpMaglevKey{}), 8},
		{"np_maglev_chunk", unsafe.Sizeof(nodePortNpMaglevChunk{}), 1024},
		{"np_frag_key", unsafe.Sizeof(nodePortNpFragKey{}), 40},
		{"np_frag", unsafe.Sizeof(nodePortNpFrag{}), 4},
	}
	for _, s := range sizes {
		if s.got != s.want {
			t.Errorf("%s: %d bytes, bpf/README.md documents %d", s.name, s.got, s.want)
		}
	}
	if NPLayoutVersion != 4 || len(npStatNames) != 23 {
		t.Errorf("layout version %d with %d counters: bpf/README.md documents layout 4 with 23 (np_stat)", NPLayoutVersion, len(npStatNames))
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

// A proxy finding layout 2's pinned north-south maps — the devices map's
// 24-byte values (no MAC) and 17 counters — recreates them: XDP then has
// the device's MAC, and the programs serve.
func TestNorthSouthRecreatesLayout2Maps(t *testing.T) {
	tp := newNSTopoNet(t, nsTopoNet{prefix: "nsf", v4: "10.67"})
	tp.start()
	tp.backend.Close()
	for _, spec := range []*ebpf.MapSpec{
		{Name: MapNPDevices, Type: ebpf.Hash, KeySize: 4, ValueSize: 24, MaxEntries: 64, Pinning: ebpf.PinByName},
		{Name: MapNPStats, Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: 17, Pinning: ebpf.PinByName},
	} {
		if err := os.Remove(filepath.Join(tp.pinDir, spec.Name)); err != nil {
			t.Fatal(err)
		}
		m, err := ebpf.NewMapWithOptions(spec, ebpf.MapOptions{PinPath: tp.pinDir})
		if err != nil {
			t.Fatalf("pin layout 2's %s: %v", spec.Name, err)
		}
		m.Close()
	}
	b, err := New(tp.cfg)
	if err != nil {
		t.Fatalf("New over layout 2's maps: %v", err)
	}
	tp.backend = b
	v, err := OpenPinned(tp.pinDir)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	devs, err := v.Devices()
	want := strings.TrimSpace(tp.node1.run(t, "cat", "/sys/class/net/eth0/address"))
	if err != nil || len(devs) != 1 || devs[0].MAC != want {
		t.Fatalf("devices %+v (%v): want eth0 with its MAC %s", devs, err, want)
	}
	if st, err := v.NorthSouthStats(); err != nil || len(st) != len(npStatNames) {
		t.Fatalf("counters %v (%v): want all %d", st, err, len(npStatNames))
	}
	tp.sync(nodePortFrontend("10.67.0.1", 30080, dataplane.TCP, false, "10.67.2.10:8080"))
	conn, pod, seen, err := tp.dial("10.67.0.1:30080")
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if pod != "10.67.2.10" || seen != "10.67.0.1" {
		t.Errorf("answered by %s seeing %s, want 10.67.2.10 seeing 10.67.0.1 (SNAT)", pod, seen)
	}
}
