package inspect

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"time"

	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/dataplane/ebpf"
)

// fakeSource is an in-memory pinned state for unit tests.
type fakeSource struct {
	services []ebpf.Service
	backends []ebpf.BackendEntry
	affinity []ebpf.AffinityEntry
	sockets  []ebpf.ReverseSocketEntry
	counters map[ebpf.Stat]uint64
	maps     []ebpf.MapInfo
	raw      map[string][2][][]byte
	programs []ebpf.ProgramInfo
	meta     ebpf.Meta
}

func (f *fakeSource) Dir() string                                        { return "/sys/fs/bpf/waggle/fake" }
func (f *fakeSource) Meta() (ebpf.Meta, error)                           { return f.meta, nil }
func (f *fakeSource) Services() ([]ebpf.Service, error)                  { return f.services, nil }
func (f *fakeSource) Backends() ([]ebpf.BackendEntry, error)             { return f.backends, nil }
func (f *fakeSource) Affinity() ([]ebpf.AffinityEntry, error)            { return f.affinity, nil }
func (f *fakeSource) Counters() (map[ebpf.Stat]uint64, error)            { return f.counters, nil }
func (f *fakeSource) Maps() ([]ebpf.MapInfo, error)                      { return f.maps, nil }
func (f *fakeSource) Programs() ([]ebpf.ProgramInfo, error)              { return f.programs, nil }
func (f *fakeSource) ReverseSockets() ([]ebpf.ReverseSocketEntry, error) { return f.sockets, nil }
func (f *fakeSource) RawEntries(name string) ([][]byte, [][]byte, error) {
	r, ok := f.raw[name]
	if !ok {
		return nil, nil, fmt.Errorf("no map %q: %w", name, os.ErrNotExist)
	}
	return r[0], r[1], nil
}

// fakeSystem has fixed clocks and a table of netns cookies.
type fakeSystem struct {
	now, mono, boot time.Duration
	cgroups         map[uint64]string
	cookies         map[string]uint64
	stats           bool
	slept           time.Duration
	onSleep         func()
}

func (s *fakeSystem) Now() time.Time              { return time.Unix(0, int64(s.now)).UTC() }
func (s *fakeSystem) Monotonic() time.Duration    { return s.mono }
func (s *fakeSystem) Boottime() time.Duration     { return s.boot }
func (s *fakeSystem) CgroupPath(id uint64) string { return s.cgroups[id] }
func (s *fakeSystem) PinTime(path string) time.Time {
	if path == "" {
		return time.Time{}
	}
	return time.Date(2026, 1, 2, 3, 4, 6, 0, time.UTC)
}
func (s *fakeSystem) StatsEnabled() bool { return s.stats }
func (s *fakeSystem) EnableStats() (io.Closer, error) {
	s.stats = true
	return closerFunc(func() error { s.stats = false; return nil }), nil
}
func (s *fakeSystem) Sleep(d time.Duration) error {
	s.slept += d
	if s.onSleep != nil {
		s.onSleep()
	}
	return nil
}
func (s *fakeSystem) NetnsCookie(src string) (uint64, error) {
	if c, ok := s.cookies[src]; ok {
		return c, nil
	}
	return 0, fmt.Errorf("client netns %q: %w", src, ErrNotFound)
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

func key(s string) dataplane.FrontendKey {
	ap, p, err := parseFrontend(s)
	if err != nil {
		panic(err)
	}
	return dataplane.FrontendKey{Addr: ap.Addr(), Port: ap.Port(), Protocol: p}
}

func revNatRaw(id uint32, fe dataplane.FrontendKey) ([]byte, []byte) {
	k := binary.LittleEndian.AppendUint32(nil, id)
	a := fe.Addr.As16()
	v := append(a[:], 0, 0, 0, 0)
	binary.BigEndian.PutUint16(v[16:], fe.Port)
	v[18] = map[dataplane.Protocol]byte{dataplane.TCP: 6, dataplane.UDP: 17}[fe.Protocol]
	return k, v
}

func nameRaw(id uint32, kind byte, name string) ([]byte, []byte) {
	v := make([]byte, 256)
	v[0] = kind
	copy(v[4:], name)
	return binary.LittleEndian.AppendUint32(nil, id), v
}

// newFake is a small state with every kind of breakage explain and lb
// list must describe.
func newFake() (*fakeSource, *fakeSystem) {
	be := func(id uint32, s string) ebpf.BackendEntry {
		ap := netip.MustParseAddrPort(s)
		return ebpf.BackendEntry{ID: id, Backend: ap, Protocol: dataplane.TCP}
	}
	src := &fakeSource{
		backends: []ebpf.BackendEntry{be(1, "10.1.0.1:80"), be(2, "10.1.0.2:80"), be(3, "[fd00::1]:80")},
		services: []ebpf.Service{
			{ID: 1, Frontend: key("10.96.0.1:80/TCP"), Kind: dataplane.ClusterIP, Name: "default/web:http", Count: 2,
				Flags: ebpf.FlagAffinity, AffinityTimeout: time.Minute,
				Slots: []ebpf.Slot{{Slot: 1, BackendID: 1, Backend: netip.MustParseAddrPort("10.1.0.1:80")}, {Slot: 2, BackendID: 2, Backend: netip.MustParseAddrPort("10.1.0.2:80")}}},
			// slot 2 missing, slot 3 names a backend that is gone, slot 4 beyond count.
			{ID: 2, Frontend: key("10.96.0.2:53/UDP"), Kind: dataplane.ClusterIP, Name: "kube-system/dns", Count: 3,
				Slots: []ebpf.Slot{{Slot: 1, BackendID: 1, Backend: netip.MustParseAddrPort("10.1.0.1:80")}, {Slot: 3, BackendID: 9},
					{Slot: 4, BackendID: 2, Backend: netip.MustParseAddrPort("10.1.0.2:80")}}},
			{ID: 3, Frontend: key("10.96.0.3:80/TCP"), Kind: dataplane.NodePort, Name: "default/none", Count: 0},
			// an IPv4 frontend whose only backend is IPv6
			{ID: 4, Frontend: key("10.96.0.4:80/TCP"), Name: "default/mixed", Count: 1, Flags: ebpf.FlagAffinity, AffinityTimeout: time.Minute,
				Slots: []ebpf.Slot{{Slot: 1, BackendID: 3, Backend: netip.MustParseAddrPort("[fd00::1]:80")}}},
		},
		affinity: []ebpf.AffinityEntry{
			{NetnsCookie: 100, ServiceID: 1, BackendID: 2, LastUsed: 50 * time.Second},   // 10s ago: live
			{NetnsCookie: 200, ServiceID: 1, BackendID: 1, LastUsed: -100 * time.Second}, // 160s ago: expired
			{NetnsCookie: 300, ServiceID: 1, BackendID: 7, LastUsed: 55 * time.Second},   // backend gone
			{NetnsCookie: 100, ServiceID: 4, BackendID: 3, LastUsed: 55 * time.Second},   // IPv6 backend
			{NetnsCookie: 100, ServiceID: 42, BackendID: 1, LastUsed: 55 * time.Second},  // service gone
		},
		sockets: []ebpf.ReverseSocketEntry{
			{Cookie: 7, Backend: netip.MustParseAddrPort("10.1.0.1:80"), Frontend: netip.MustParseAddrPort("10.96.0.1:80"), ServiceID: 1},
			{Cookie: 8, Backend: netip.MustParseAddrPort("10.1.0.1:80"), Frontend: netip.MustParseAddrPort("10.96.0.9:80"), ServiceID: 1},
		},
		counters: map[ebpf.Stat]uint64{ebpf.StatConnectXlate: 5, ebpf.StatBackendMissing: 1},
		maps: []ebpf.MapInfo{
			{Name: ebpf.MapServices, Type: "Hash", KeySize: 24, ValueSize: 16, Entries: 9, MaxEntries: 12, Path: "/sys/fs/bpf/waggle/fake/waggle_services"},
			{Name: ebpf.MapBackends, Type: "Hash", KeySize: 4, ValueSize: 20, Entries: 3, MaxEntries: 3, Path: "/sys/fs/bpf/waggle/fake/waggle_backends"},
		},
		programs: []ebpf.ProgramInfo{
			{Name: "waggle_connect4", ProgramID: 41, LinkID: 5, Type: "CGroupSockAddr", AttachType: "CGroupInet4Connect",
				CgroupID: 77, Loaded: 900 * time.Second, Runs: 10, RunTime: 5 * time.Microsecond, LinkPath: "/sys/fs/bpf/waggle/fake/links/waggle_connect4"},
			{Name: "waggle_bind4", ProgramID: 40, LinkID: 4, Type: "CGroupSockAddr", AttachType: "CGroupInet4Bind", CgroupID: 78},
		},
		meta: ebpf.Meta{Magic: ebpf.Magic, LayoutVersion: ebpf.LayoutVersion, Created: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)},
		raw:  map[string][2][][]byte{},
	}
	var rk, rv, nk, nv [][]byte
	for _, s := range src.services {
		k, v := revNatRaw(s.ID, s.Frontend)
		rk, rv = append(rk, k), append(rv, v)
		k, v = nameRaw(s.ID, 1, s.Name)
		nk, nv = append(nk, k), append(nv, v)
	}
	src.raw[ebpf.MapRevNat] = [2][][]byte{rk, rv}
	src.raw[ebpf.MapServiceNames] = [2][][]byte{nk, nv}
	src.raw[ebpf.MapBackends] = [2][][]byte{{{2, 0, 0, 0}, {1, 0, 0, 0}}, {slices.Repeat([]byte{0xab}, 20), slices.Repeat([]byte{0xcd}, 20)}}
	src.raw[ebpf.MapMeta] = [2][][]byte{{{0, 0, 0, 0}}, {{0x57, 0x47, 0x47, 0x4c, 1, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0}}}
	sys := &fakeSystem{now: 2000 * time.Second, mono: 60 * time.Second, boot: 1000 * time.Second,
		cgroups: map[uint64]string{77: "/sys/fs/cgroup/unified/kubepods"},
		cookies: map[string]uint64{"live": 100, "expired": 200, "gone": 300, "fresh": 400}}
	return src, sys
}

var errBoom = errors.New("boom")
