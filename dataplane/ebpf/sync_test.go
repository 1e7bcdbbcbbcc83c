package ebpf

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/waggle-io/waggle/dataplane"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func fe(vip string, proto dataplane.Protocol, backends ...string) dataplane.Frontend {
	a := netip.MustParseAddrPort(vip)
	f := dataplane.Frontend{FrontendKey: dataplane.FrontendKey{Addr: a.Addr(), Port: a.Port(), Protocol: proto},
		Kind: dataplane.ClusterIP, Service: dataplane.ServicePortName{Namespace: "default", Name: "web"}}
	for _, b := range backends {
		x := netip.MustParseAddrPort(b)
		f.Endpoints = append(f.Endpoints, dataplane.Endpoint{Addr: x.Addr(), Port: x.Port()})
	}
	return f
}

func sorted(fs ...dataplane.Frontend) *dataplane.State {
	st := &dataplane.State{NodeName: "node", Frontends: fs}
	sortFrontends(st)
	return st
}

// goldenState covers every kind of entry: affinity, UDP, NodePort, IPv6,
// a frontend without endpoints, backends shared between frontends.
func goldenState() *dataplane.State {
	web := fe("10.96.0.10:80", dataplane.TCP, "10.244.1.5:8080", "10.244.2.7:8080", "10.244.1.6:8080")
	web.AffinityTimeout = 3 * time.Hour
	web.Service.Port = "http"
	dns := fe("10.96.0.10:53", dataplane.UDP, "10.244.1.9:53", "10.244.2.9:53")
	dns.Service = dataplane.ServicePortName{Namespace: "kube-system", Name: "kube-dns", Port: "dns"}
	np := fe("192.168.1.10:30080", dataplane.TCP, "10.244.1.5:8080")
	np.Kind, np.LocalOnly = dataplane.NodePort, true
	v6 := fe("[fd00:96::10]:443", dataplane.TCP, "[fd00:244::5]:8443", "[fd00:244::6]:8443")
	v6.Kind = dataplane.LoadBalancer
	empty := fe("10.96.0.11:80", dataplane.TCP)
	return sorted(web, dns, np, v6, empty)
}

func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from the maps (run with -update if intended):\n--- got\n%s--- want\n%s", path, got, want)
	}
}

func newFakeReconciler(t *testing.T, maxServices, maxBackends int) (*reconciler, *fakeMaps) {
	f := newFakeMaps(maxServices, maxBackends)
	r := newReconciler(f.tables(), maxServices, maxBackends)
	f.check = func() {
		if err := consistent(f.tables()); err != nil {
			t.Fatalf("intermediate map state after %d operations breaks make-before-break: %v", f.ops, err)
		}
	}
	return r, f
}

func TestGeneratedStructsMatchTheCLayout(t *testing.T) {
	sizes := []struct {
		name      string
		got, want uintptr
	}{
		{"lb_service_key", unsafe.Sizeof(sockLBLbServiceKey{}), 24},
		{"lb_service", unsafe.Sizeof(sockLBLbService{}), 80},
		{"lb_backend", unsafe.Sizeof(sockLBLbBackend{}), 24},
		{"lb_backend.gen offset", unsafe.Offsetof(sockLBLbBackend{}.Gen), 20},
		{"lb_affinity.backend_gen offset", unsafe.Offsetof(sockLBLbAffinity{}.BackendGen), 12},
		{"lb_rev_nat", unsafe.Sizeof(sockLBLbRevNat{}), 20},
		{"lb_reverse_sk_key", unsafe.Sizeof(sockLBLbReverseSkKey{}), 32},
		{"lb_reverse_sk", unsafe.Sizeof(sockLBLbReverseSk{}), 24},
		{"lb_affinity_key", unsafe.Sizeof(sockLBLbAffinityKey{}), 16},
		{"lb_affinity", unsafe.Sizeof(sockLBLbAffinity{}), 16},
		{"lb_meta", unsafe.Sizeof(sockLBLbMeta{}), 16},
		{"lb_svc_name", unsafe.Sizeof(sockLBLbSvcName{}), 256},
		{"lb_service_key.slot offset", unsafe.Offsetof(sockLBLbServiceKey{}.Slot), 18},
		{"lb_reverse_sk_key.port offset", unsafe.Offsetof(sockLBLbReverseSkKey{}.Port), 24},
	}
	for _, s := range sizes {
		if s.got != s.want {
			t.Errorf("%s: %d bytes, bpf/README.md documents %d", s.name, s.got, s.want)
		}
	}
}

func TestSyncWritesTheGoldenMaps(t *testing.T) {
	r, f := newFakeReconciler(t, 1024, 1024)
	if _, err := r.sync(goldenState()); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "maps.golden", dumpTables(f.tables()))
}

func TestRepeatedSyncChangesNothing(t *testing.T) {
	r, f := newFakeReconciler(t, 1024, 1024)
	if _, err := r.sync(goldenState()); err != nil {
		t.Fatal(err)
	}
	before := f.ops
	res, err := r.sync(goldenState())
	if err != nil || f.ops != before || res.writes+res.deletes != 0 {
		t.Fatalf("second sync: %d map operations (%d writes, %d deletes), %v; want none", f.ops-before, res.writes, res.deletes, err)
	}
}

func TestRestartRestoresIDsAndWritesNothing(t *testing.T) {
	r, f := newFakeReconciler(t, 1024, 1024)
	if _, err := r.sync(goldenState()); err != nil {
		t.Fatal(err)
	}
	dump := dumpTables(f.tables())
	r2 := newReconciler(f.tables(), 1024, 1024) // a restarted proxy on the pinned maps
	before := f.ops
	if _, err := r2.sync(goldenState()); err != nil {
		t.Fatal(err)
	}
	if f.ops != before {
		t.Errorf("first sync after restart did %d map operations, want 0", f.ops-before)
	}
	if got := dumpTables(f.tables()); got != dump {
		t.Errorf("maps changed across restart:\n%s\nwant\n%s", got, dump)
	}
	// New IDs continue after the restored ones.
	st := goldenState()
	extra := fe("10.96.9.9:80", dataplane.TCP, "10.244.9.9:80")
	st.Frontends = append(st.Frontends, extra)
	sortFrontends(st)
	if _, err := r2.sync(st); err != nil {
		t.Fatal(err)
	}
	if p := r2.fronts[extra.FrontendKey]; p == nil || p.id != 6 || p.slots[0] != 8 {
		t.Errorf("new frontend after restart got %+v, want ID 6", p)
	}
}

// randomState draws frontends over a small pool so transitions add,
// remove, grow, shrink and reorder backends, and move frontends between
// inline backends (≤ inlineBackends) and slot entries.
func randomState(rng *rand.Rand) *dataplane.State {
	var fs []dataplane.Frontend
	for i := range 8 {
		if rng.IntN(4) == 0 {
			continue
		}
		vip := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 96, 0, byte(i)}), 80)
		proto := dataplane.TCP
		if i%3 == 0 {
			proto = dataplane.UDP
		}
		var bes []string
		n := rng.IntN(6)
		if rng.IntN(3) == 0 {
			n = rng.IntN(inlineBackends + 8)
		}
		for _, j := range rng.Perm(inlineBackends + 8)[:n] {
			bes = append(bes, netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 0, byte(j)}), 8080).String())
		}
		f := fe(vip.String(), proto, bes...)
		if rng.IntN(2) == 0 {
			f.AffinityTimeout = time.Duration(1+rng.IntN(100)) * time.Second
		}
		fs = append(fs, f)
	}
	return sorted(fs...)
}

func TestEveryIntermediateMapStateIsConsistent(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	r, f := newFakeReconciler(t, 1024, 1024)
	for i := range 300 {
		st := randomState(rng)
		if _, err := r.sync(st); err != nil {
			t.Fatalf("transition %d: %v", i, err)
		}
		// The maps hold exactly the state: a fresh reconciler on an empty
		// set of maps writes the same dump, IDs aside.
		ref, rf := newFakeReconciler(t, 1024, 1024)
		ref.sync(st)
		if got, want := stripIDs(dumpTables(f.tables())), stripIDs(dumpTables(rf.tables())); got != want {
			t.Fatalf("transition %d: maps\n%s\nwant\n%s", i, got, want)
		}
	}
}

// stripIDs keeps the frontend → backend lines, without IDs, which depend
// on history.
func stripIDs(dump string) string {
	var out []string
	for _, l := range strings.Split(dump, "\n") {
		if strings.HasPrefix(l, "#") {
			out = append(out, l)
			continue
		}
		f := strings.Fields(l)
		if len(f) > 3 && f[2] == "->" {
			out = append(out, f[0]+" "+f[1]+" "+f[4]+" "+f[5]+" "+f[7])
		}
	}
	return strings.Join(out, "\n")
}

func TestLostBackendsAndAffinityEntriesAreCleanedUp(t *testing.T) {
	r, f := newFakeReconciler(t, 1024, 1024)
	web := fe("10.96.0.10:80", dataplane.TCP, "10.244.0.1:80", "10.244.0.2:80")
	web.AffinityTimeout = time.Minute
	dns := fe("10.96.0.10:53", dataplane.UDP, "10.244.0.1:53", "10.244.0.2:53")
	if _, err := r.sync(sorted(web, dns)); err != nil {
		t.Fatal(err)
	}
	webID, be1 := r.fronts[web.FrontendKey].id, r.beIDs[newBackendKey(netip.MustParseAddr("10.244.0.1"), 80, protoTCP, false)]
	f.affinity.m[sockLBLbAffinityKey{NetnsCookie: 7, RevNatId: webID}] = sockLBLbAffinity{BackendId: be1}
	f.affinity.m[sockLBLbAffinityKey{NetnsCookie: 8, RevNatId: webID}] = sockLBLbAffinity{BackendId: be1 + 1}
	web.Endpoints = web.Endpoints[1:]
	dns.Endpoints = dns.Endpoints[1:]
	res, err := r.sync(sorted(web, dns))
	if err != nil {
		t.Fatal(err)
	}
	want := []lostBackend{
		{r.fronts[dns.FrontendKey].id, dns.FrontendKey, netip.MustParseAddrPort("10.244.0.1:53"), false},
		{webID, web.FrontendKey, netip.MustParseAddrPort("10.244.0.1:80"), false},
	}
	if len(res.lost) != 2 || res.lost[0] != want[0] || res.lost[1] != want[1] {
		t.Errorf("lost = %+v, want %+v", res.lost, want)
	}
	if _, ok := f.affinity.m[sockLBLbAffinityKey{NetnsCookie: 7, RevNatId: webID}]; ok {
		t.Error("affinity entry to the removed backend survived")
	}
	if _, ok := f.affinity.m[sockLBLbAffinityKey{NetnsCookie: 8, RevNatId: webID}]; !ok {
		t.Error("affinity entry to a kept backend was deleted")
	}
	if _, ok := f.backends.m[be1]; ok {
		t.Error("unused backend left in the backends map")
	}
}

func TestFullMapsLeaveFrontendsOutAndNameThem(t *testing.T) {
	r, f := newFakeReconciler(t, 2, 1024) // room for two frontends (their backends inline)
	st := sorted(fe("10.96.0.1:80", dataplane.TCP, "10.244.0.1:80", "10.244.0.2:80"),
		fe("10.96.0.2:80", dataplane.TCP, "10.244.0.1:80", "10.244.0.2:80"),
		fe("10.96.0.3:80", dataplane.TCP, "10.244.0.1:80", "10.244.0.2:80"))
	res, err := r.sync(st)
	if !errors.Is(err, dataplane.ErrMapFull) || !strings.Contains(err.Error(), "10.96.0.3:80/TCP") {
		t.Fatalf("sync: %v, want ErrMapFull naming 10.96.0.3:80/TCP", err)
	}
	if len(res.rejected) != 1 || len(f.services.m) != 2 {
		t.Errorf("rejected %v, %d service entries; want 1 rejected and 2 entries", res.rejected, len(f.services.m))
	}
	// Backends map full.
	r2, _ := newFakeReconciler(t, 1024, 2)
	_, err = r2.sync(sorted(fe("10.96.0.1:80", dataplane.TCP, "10.244.0.1:80", "10.244.0.2:80"),
		fe("10.96.0.2:80", dataplane.TCP, "10.244.0.3:80")))
	if !errors.Is(err, dataplane.ErrMapFull) || !strings.Contains(err.Error(), "10.96.0.2:80/TCP") {
		t.Fatalf("sync with a full backends map: %v", err)
	}
}

func TestInvalidStateIsRefusedAndChangesNothing(t *testing.T) {
	r, f := newFakeReconciler(t, 1024, 1024)
	if _, err := r.sync(goldenState()); err != nil {
		t.Fatal(err)
	}
	dump := dumpTables(f.tables())
	bad := []*dataplane.State{
		{Frontends: []dataplane.Frontend{fe("10.96.0.2:80", dataplane.TCP), fe("10.96.0.1:80", dataplane.TCP)}}, // unsorted
		{Frontends: []dataplane.Frontend{fe("10.96.0.1:80", "SCTP")}},
		{Frontends: []dataplane.Frontend{fe("10.96.0.1:80", dataplane.TCP, "[fd00::1]:80")}}, // family mismatch
	}
	for i, st := range bad {
		if _, err := r.sync(st); err == nil {
			t.Errorf("bad state %d accepted", i)
		}
	}
	if got := dumpTables(f.tables()); got != dump {
		t.Errorf("a refused state changed the maps")
	}
}

func TestAFailedWriteIsRepairedByTheNextSync(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 100 {
		r, f := newFakeReconciler(t, 1024, 1024)
		if _, err := r.sync(randomState(rng)); err != nil {
			t.Fatal(err)
		}
		st := randomState(rng)
		f.failAt = 1 + rng.IntN(20)
		_, err := r.sync(st)
		if err != nil && !errors.Is(err, errInjected) {
			t.Fatalf("case %d: %v", i, err)
		}
		f.failAt = 0
		if _, err := r.sync(st); err != nil {
			t.Fatalf("case %d: sync after a fault: %v", i, err)
		}
		ref, rf := newFakeReconciler(t, 1024, 1024)
		ref.sync(st)
		if got, want := stripIDs(dumpTables(f.tables())), stripIDs(dumpTables(rf.tables())); got != want {
			t.Fatalf("case %d: not repaired:\n%s\nwant\n%s", i, got, want)
		}
	}
}

func FuzzDecodeServiceEntry(f *testing.F) {
	f.Add(make([]byte, 40))
	k := serviceKey(goldenState().Frontends[0].FrontendKey, 3)
	f.Add(append(unsafe.Slice((*byte)(unsafe.Pointer(&k)), 24), make([]byte, 16)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < 24+256 {
			b = append(b, make([]byte, 24+256-len(b))...)
		}
		var key sockLBLbServiceKey
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&key)), unsafe.Sizeof(key)), b)
		fk := frontendOf(key)
		_ = fk.String()
		if key.Proto == protoTCP || key.Proto == protoUDP {
			back := serviceKey(fk, key.Slot)
			back.Pad = key.Pad
			if back != key {
				t.Fatalf("round trip %+v -> %s -> %+v", key, fk, back)
			}
		}
		var name sockLBLbSvcName
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&name)), unsafe.Sizeof(name)), b[24:])
		_, _ = nameOf(name)
	})
}

func sortFrontends(st *dataplane.State) {
	slices.SortFunc(st.Frontends, func(a, b dataplane.Frontend) int { return a.FrontendKey.Compare(b.FrontendKey) })
}

// bigState is n TCP frontends of m distinct backends each.
func bigState(n, m int) *dataplane.State {
	st := &dataplane.State{NodeName: "node"}
	for i := range n {
		f := dataplane.Frontend{FrontendKey: dataplane.FrontendKey{Addr: netip.AddrFrom4([4]byte{10, 96 + byte(i>>16), byte(i >> 8), byte(i)}), Port: 80, Protocol: dataplane.TCP},
			Kind: dataplane.ClusterIP, Service: dataplane.ServicePortName{Namespace: "ns", Name: "svc"}}
		for j := range m {
			k := i*m + j
			f.Endpoints = append(f.Endpoints, dataplane.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 200 + byte(k>>16), byte(k >> 8), byte(k)}), Port: 8080})
		}
		st.Frontends = append(st.Frontends, f)
	}
	sortFrontends(st)
	return st
}

// BenchmarkSyncOneEndpointChangeAt10k times the reconciler's share of an
// endpoint change while 10,000 services × 10 backends exist (fake maps:
// the kernel's share is measured by `waggle bench dataplane`).
func BenchmarkSyncOneEndpointChangeAt10k(b *testing.B) {
	st := bigState(10000, 10)
	f := newFakeMaps(1<<20, 1<<20)
	r := newReconciler(f.tables(), 1<<20, 1<<20)
	if _, err := r.sync(st); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := range b.N {
		fr := &st.Frontends[(i*7919)%len(st.Frontends)]
		fr.Endpoints = append(fr.Endpoints[1:], dataplane.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 199, byte(i >> 8), byte(i)}), Port: 8080})
		if _, err := r.sync(st); err != nil {
			b.Fatal(err)
		}
	}
}

func TestBadConfigIsRefusedBeforeTouchingAnything(t *testing.T) {
	for _, c := range []Config{
		{NodeName: "../etc"},
		{NodeName: "a/b"},
		{NodeName: ".."},
		{NodeName: "n", MaxServices: -1},
		{NodeName: "n", MaxBackends: 1 << 30},
	} {
		if err := c.validate(); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
	if err := (Config{NodeName: "node-1.example"}).validate(); err != nil {
		t.Errorf("good config refused: %v", err)
	}
}

// BenchmarkSyncFromScratch10kx10 times the reconciler's share of
// programming 10,000 services × 10 backends into empty (fake) maps.
func BenchmarkSyncFromScratch10kx10(b *testing.B) {
	st := bigState(10000, 10)
	for range b.N {
		f := newFakeMaps(1<<20, 1<<20)
		r := newReconciler(f.tables(), 1<<20, 1<<20)
		if _, err := r.sync(st); err != nil {
			b.Fatal(err)
		}
	}
}

// changeBetween is the Change a tracker would hand out between two states:
// the frontends that differ, and the keys that went.
func changeBetween(prev, next *dataplane.State) *dataplane.Change {
	ch := &dataplane.Change{}
	old := map[dataplane.FrontendKey]int{}
	for i, f := range prev.Frontends {
		old[f.FrontendKey] = i
	}
	for _, f := range next.Frontends {
		if i, ok := old[f.FrontendKey]; ok {
			delete(old, f.FrontendKey)
			if reflect.DeepEqual(prev.Frontends[i], f) {
				continue
			}
		}
		ch.Upsert = append(ch.Upsert, f)
	}
	for k := range old {
		ch.Remove = append(ch.Remove, k)
	}
	slices.SortFunc(ch.Remove, dataplane.FrontendKey.Compare)
	return ch
}

// TestAppliedChangesMatchAFullSync: programming each transition as a Change
// (only what differs) leaves the maps exactly as a full sync of the target
// state into empty maps, and every intermediate map state is consistent.
func TestAppliedChangesMatchAFullSync(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	r, f := newFakeReconciler(t, 1024, 1024)
	prev := &dataplane.State{NodeName: "node"}
	for i := range 300 {
		st := randomState(rng)
		if _, err := r.applyChange(changeBetween(prev, st)); err != nil {
			t.Fatalf("transition %d: %v", i, err)
		}
		prev = st
		ref, rf := newFakeReconciler(t, 1024, 1024)
		ref.sync(st)
		if got, want := stripIDs(dumpTables(f.tables())), stripIDs(dumpTables(rf.tables())); got != want {
			t.Fatalf("transition %d: maps\n%s\nwant\n%s", i, got, want)
		}
		if r.used != r.entries() {
			t.Fatalf("transition %d: used = %d, mirror holds %d entries", i, r.used, r.entries())
		}
	}
}

// BenchmarkApplyOneEndpointChangeAt10k is BenchmarkSyncOneEndpointChangeAt10k
// through Apply: the reconciler looks only at the changed frontend.
func BenchmarkApplyOneEndpointChangeAt10k(b *testing.B) {
	st := bigState(10000, 10)
	f := newFakeMaps(1<<20, 1<<20)
	r := newReconciler(f.tables(), 1<<20, 1<<20)
	if _, err := r.sync(st); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		fr := st.Frontends[(i*7919)%len(st.Frontends)]
		fr.Endpoints = append(slices.Clone(fr.Endpoints[1:]), dataplane.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 199, byte(i >> 8), byte(i)}), Port: 8080})
		st.Frontends[(i*7919)%len(st.Frontends)] = fr
		if _, err := r.applyChange(&dataplane.Change{Upsert: []dataplane.Frontend{fr}}); err != nil {
			b.Fatal(err)
		}
	}
}

// TestEveryRejectedFrontendIsNamed is the reproduction: a services
// map of 21 entries and 30 Services of 2 endpoints (one entry each, the
// backends inline): 21 fit, and each of the other 9 comes back as its own
// FrontendError naming its Service, not only the first five in a message.
func TestEveryRejectedFrontendIsNamed(t *testing.T) {
	r, _ := newFakeReconciler(t, 21, 1024)
	var fs []dataplane.Frontend
	for i := range 30 {
		f := fe(fmt.Sprintf("10.96.0.%d:80", i+1), dataplane.TCP, "10.244.0.1:80", "10.244.0.2:80")
		f.Service.Name = fmt.Sprintf("svc-%02d", i)
		fs = append(fs, f)
	}
	_, err := r.sync(sorted(fs...))
	fes := dataplane.FrontendErrors(err)
	if len(fes) != 9 {
		t.Fatalf("%d frontend errors, want 9: %v", len(fes), err)
	}
	names := map[string]bool{}
	for _, fe := range fes {
		if !errors.Is(fe.Err, dataplane.ErrMapFull) {
			t.Errorf("%s: %v does not wrap ErrMapFull", fe.Frontend, fe.Err)
		}
		names[fe.Service.Name] = true
	}
	if len(names) != 9 {
		t.Errorf("rejected Services %v, want 9 distinct", names)
	}
	// A rejection leaves the mirror valid: no re-read of the maps, and a
	// repeated sync writes nothing new and rejects the same nine.
	if r.dirty {
		t.Error("a rejection marked the mirror dirty (the next sync would re-read every map)")
	}
	res, err := r.sync(sorted(fs...))
	if len(dataplane.FrontendErrors(err)) != 9 || res.writes != 0 {
		t.Errorf("repeated sync: %d writes, %v", res.writes, err)
	}
}

// TestTerminatingBackendsAreMarkedAndNotLost: an endpoint that turns
// serving-but-terminating gets a backend entry flagged terminating (what
// `waggle bpf lb list` marks), and is not reported lost, so its sockets
// live on.
func TestTerminatingBackendsAreMarkedAndNotLost(t *testing.T) {
	r, f := newFakeReconciler(t, 1024, 1024)
	web := fe("10.96.0.10:53", dataplane.UDP, "10.244.0.1:53", "10.244.0.2:53")
	if _, err := r.sync(sorted(web)); err != nil {
		t.Fatal(err)
	}
	for i := range web.Endpoints {
		web.Endpoints[i].Terminating = true
	}
	res, err := r.sync(sorted(web))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.lost) != 0 {
		t.Errorf("lost %v: a backend that only turned terminating is not lost", res.lost)
	}
	n := 0
	for _, b := range f.backends.m {
		if b.Flags&BackendFlagTerminating == 0 {
			t.Errorf("backend %v not flagged terminating", backendKeyOf(b))
		}
		n++
	}
	if n != 2 {
		t.Errorf("%d backends, want 2", n)
	}
}

// TestARestoredSlotNamingAMissingBackendKeepsItsIDUnused: after a restart
// over maps where a slot names a backend ID missing from the backends map,
// that ID is not given to a new backend: the old slot's release would
// otherwise take a reference the new backend needs, and the backend would
// be deleted while a frontend names it.
func TestARestoredSlotNamingAMissingBackendKeepsItsIDUnused(t *testing.T) {
	r, f := newFakeReconciler(t, 1024, 1024)
	many := func(prefix string) []string { // slot entries, not inline
		var out []string
		for i := range inlineBackends + 1 {
			out = append(out, fmt.Sprintf("%s.%d:8080", prefix, i+1))
		}
		return out
	}
	web := fe("10.96.0.10:80", dataplane.TCP, many("10.244.1")...)
	if _, err := r.sync(sorted(web)); err != nil {
		t.Fatal(err)
	}
	f.check = nil // the maps are broken on purpose: checked at the end
	k := serviceKey(web.FrontendKey, 1)
	v := f.services.m[k]
	v.BackendId = 40 // missing, above every backend ID
	f.services.m[k] = v
	restarted := newReconciler(f.tables(), 1024, 1024)
	web = fe("10.96.0.10:80", dataplane.TCP, many("10.244.3")...)
	other := fe("10.96.0.11:80", dataplane.TCP, many("10.244.2")...)
	if _, err := restarted.sync(sorted(web, other)); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.backends.m[40]; ok {
		t.Errorf("backend ID 40, named by a restored slot, was given to a new backend")
	}
	if err := consistent(f.tables()); err != nil {
		t.Fatal(err)
	}
}

// TestSlotsWrittenBeforeTheirRevNatAreRepaired: a first sync that fails
// writing rev_nat after some slots of new frontends went to the maps (they
// go in chunks, in any order) leaves slots naming service IDs without a
// rev_nat entry; the next sync re-reads the maps, gives those frontends new
// IDs and writes them whole.
func TestSlotsWrittenBeforeTheirRevNatAreRepaired(t *testing.T) {
	f := newFakeMaps(1<<16, 1<<16) // checked after each sync (at 10,000 entries, not after each entry)
	var left atomic.Int32
	left.Store(1)
	tb := f.tables()
	tb.revNat = failingTable[uint32, sockLBLbRevNat]{tb.revNat, &left}
	r := newReconciler(tb, 1<<16, 1<<16)
	st := bigState(1000, inlineBackends+4) // slot entries
	if _, err := r.sync(st); !errors.Is(err, errInjected) {
		t.Fatalf("sync returned %v, want the injected fault", err)
	}
	if len(f.services.m) == 0 {
		t.Fatal("no slot went to the maps before the rev_nat write failed: nothing to repair")
	}
	if err := consistent(f.tables()); err != nil {
		t.Fatalf("after the failed sync: %v", err)
	}
	if _, err := r.sync(st); err != nil {
		t.Fatalf("sync after the fault: %v", err)
	}
	ref := newFakeMaps(1<<16, 1<<16)
	if _, err := newReconciler(ref.tables(), 1<<16, 1<<16).sync(st); err != nil {
		t.Fatal(err)
	}
	if got, want := stripIDs(dumpTables(f.tables())), stripIDs(dumpTables(ref.tables())); got != want {
		t.Fatal("the maps differ from a fresh sync's after the repair")
	}
	if err := consistent(f.tables()); err != nil {
		t.Fatal(err)
	}
}
