package ebpf

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	"github.com/waggle-io/waggle/dataplane"
)

func names(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.244.%d.%d:8080/TCP", i/200, i%200+1)
	}
	return out
}

func TestMaglevSpreadsEvenly(t *testing.T) {
	for _, n := range []int{1, 2, 3, 10} {
		tab := Maglev(names(n), DefaultMaglevTableSize)
		counts := make([]int, n)
		for _, b := range tab {
			counts[b]++
		}
		for i, c := range counts {
			// Maglev fills round-robin: every backend gets floor or ceil of M/n.
			if c < DefaultMaglevTableSize/n || c > DefaultMaglevTableSize/n+1 {
				t.Errorf("n=%d: backend %d has %d of %d entries", n, i, c, DefaultMaglevTableSize)
			}
		}
	}
	if Maglev(nil, 7) != nil {
		t.Error("no backends: want no table")
	}
}

// moved counts table entries whose backend (by name) differs.
func moved(a, b []int, an, bn []string) int {
	n := 0
	for i := range a {
		if an[a[i]] != bn[b[i]] {
			n++
		}
	}
	return n
}

// A backend added or removed moves its own share of the entries and a
// bounded amount more: Maglev trades perfect minimal disruption for an even
// spread. Measured here with M >= 100 entries per backend (Maglev's rule of
// thumb): 1.0x the minimal share at 2 backends, 1.2x at 10, 1.5-1.7x at
// 30, 2.4x at 100. Flows in the conntrack never move.
func TestMaglevMovesAboutTheMinimalShare(t *testing.T) {
	primes := []int{251, 509, 1021, 2039, 4093, 8191, 16381}
	for _, n := range []int{2, 4, 10, 30, 100} {
		m := primes[len(primes)-1]
		for _, p := range primes {
			if p >= 100*(n+1) {
				m = p
				break
			}
		}
		before := names(n)
		after := names(n + 1)
		tb, ta := Maglev(before, m), Maglev(after, m)
		got := moved(tb, ta, before, after)
		minimal := m / (n + 1)
		t.Logf("M=%d: add to %d backends: %d of %d entries moved (minimal %d, %.2fx)", m, n, got, m, minimal, float64(got)/float64(minimal))
		if float64(got) > 2.5*float64(minimal)+2 {
			t.Errorf("adding a backend to %d moved %d entries, want about %d", n, got, minimal)
		}
		// Removing the first backend: its entries must move; others should mostly stay.
		rest := before[1:]
		tr := Maglev(rest, m)
		got = moved(tb, tr, before, rest)
		minimal = m / n
		t.Logf("remove 1 of %d: %d entries moved (minimal %d, %.2fx)", n, got, minimal, float64(got)/float64(minimal))
		if float64(got) > 2.5*float64(minimal)+2 {
			t.Errorf("removing a backend of %d moved %d entries, want about %d", n, got, minimal)
		}
	}
}

func TestMaglevIsTheSameOnEveryNode(t *testing.T) {
	a, b := Maglev(names(5), 251), Maglev(names(5), 251)
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("entry %d differs: %d vs %d", i, a[i], b[i])
		}
	}
}

func TestNorthSouthConfigIsValidated(t *testing.T) {
	for name, ns := range map[string]NorthSouth{
		"no device":        {},
		"empty name":       {Devices: []string{""}},
		"twice":            {Devices: []string{"eth0", "eth0"}},
		"not a prime":      {Devices: []string{"eth0"}, MaglevTableSize: 1000},
		"bad port range":   {Devices: []string{"eth0"}, SNATPortMin: 62000, SNATPortMax: 61000},
		"privileged ports": {Devices: []string{"eth0"}, SNATPortMin: 10, SNATPortMax: 61000},
	} {
		ns := ns
		if err := (Config{NorthSouth: &ns}).validate(); err == nil {
			t.Errorf("%s: accepted", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	if err := (Config{NorthSouth: &NorthSouth{Devices: []string{"eth0"}, MaglevTableSize: 16381}}).validate(); err != nil {
		t.Errorf("valid config refused: %v", err)
	}
}

// fakeMaglev records the Maglev tables the reconciler writes.
type fakeMaglev struct {
	t    map[uint32][]uint32
	sets int
}

func (g *fakeMaglev) Ranges(uint32) []netip.Prefix { return nil }

func (g *fakeMaglev) Set(id uint32, ids []uint32, names []string, _ []netip.Prefix) error {
	g.t[id] = slices.Clone(ids)
	g.sets++
	return nil
}

func (g *fakeMaglev) Delete(ids []uint32) error {
	for _, id := range ids {
		delete(g.t, id)
	}
	return nil
}

// Every north-south frontend has a Maglev table of exactly its slots, at
// every step no table names a backend the backends map lacks, and a sync
// that changes nothing rewrites no table.
func TestMaglevTablesFollowTheFrontends(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	f := newFakeMaps(1024, 1024)
	g := &fakeMaglev{t: map[uint32][]uint32{}}
	tb := f.tables()
	tb.maglev = g
	r := newReconciler(tb, 1024, 1024)
	f.check = func() {
		if err := consistent(f.tables()); err != nil {
			t.Fatalf("after %d operations: %v", f.ops, err)
		}
		for id, ids := range g.t {
			for _, b := range ids {
				if _, ok := f.backends.m[b]; !ok {
					t.Fatalf("after %d operations: Maglev table of service %d names missing backend %d", f.ops, id, b)
				}
			}
		}
	}
	for i := range 200 {
		st := randomState(rng)
		for j := range st.Frontends {
			if j%2 == 0 {
				st.Frontends[j].Kind = dataplane.NodePort
			}
		}
		if _, err := r.sync(st); err != nil {
			t.Fatalf("transition %d: %v", i, err)
		}
		f.check()
		want := 0
		for _, fr := range st.Frontends {
			p := r.fronts[fr.FrontendKey]
			got, ok := g.t[p.id]
			if fr.Kind != dataplane.NodePort {
				if ok {
					t.Fatalf("transition %d: ClusterIP %s has a Maglev table", i, fr.FrontendKey)
				}
				continue
			}
			want++
			if !ok || !slices.Equal(got, p.slots) {
				t.Fatalf("transition %d: %s Maglev table %v, slots %v", i, fr.FrontendKey, got, p.slots)
			}
		}
		if len(g.t) != want {
			t.Fatalf("transition %d: %d Maglev tables, want %d", i, len(g.t), want)
		}
		before := g.sets
		if _, err := r.sync(st); err != nil {
			t.Fatal(err)
		}
		if g.sets != before {
			t.Fatalf("transition %d: a repeated sync rewrote %d Maglev tables", i, g.sets-before)
		}
	}
}
