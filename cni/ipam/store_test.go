package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func open(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir, "net")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Lock(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Unlock() })
	return s
}

func TestUsableExcludesNetworkGatewayAndBroadcast(t *testing.T) {
	for _, tc := range []struct {
		r           string
		first, last string
		wantErr     bool
	}{
		{r: "10.0.0.0/24", first: "10.0.0.2", last: "10.0.0.254"},
		{r: "10.0.0.0/30", first: "10.0.0.2", last: "10.0.0.2"},
		{r: "10.0.0.0/31", wantErr: true},
		{r: "10.0.0.1/24", wantErr: true},
		{r: "fd00::/120", first: "fd00::2", last: "fd00::ff"},
		{r: "fd00::/127", wantErr: true},
	} {
		t.Run(tc.r, func(t *testing.T) {
			first, last, err := Usable(netip.MustParsePrefix(tc.r))
			if tc.wantErr {
				if !errors.Is(err, ErrInvalidRange) {
					t.Fatalf("err = %v, want ErrInvalidRange", err)
				}
				return
			}
			if err != nil || first.String() != tc.first || last.String() != tc.last {
				t.Fatalf("Usable = %s, %s, %v; want %s, %s", first, last, err, tc.first, tc.last)
			}
		})
	}
}

func TestAllocateGivesDistinctAddressesAndRepeatsForTheSameKey(t *testing.T) {
	for _, r := range []string{"10.1.0.0/24", "fd00:1::/64"} {
		t.Run(r, func(t *testing.T) {
			s := open(t, t.TempDir())
			p := netip.MustParsePrefix(r)
			seen := map[netip.Addr]string{}
			for i := 0; i < 20; i++ {
				id := fmt.Sprintf("c%d", i)
				a, err := s.Allocate(id, "eth0", p, 0)
				if err != nil {
					t.Fatal(err)
				}
				if !p.Contains(a) || a == Gateway(p) || a == p.Addr() {
					t.Fatalf("%s: got %s, not a pod address of %s", id, a, p)
				}
				if other, dup := seen[a]; dup {
					t.Fatalf("%s got %s already held by %s", id, a, other)
				}
				seen[a] = id
				again, err := s.Allocate(id, "eth0", p, 0)
				if err != nil || again != a {
					t.Fatalf("repeated Allocate = %s, %v; want %s", again, err, a)
				}
			}
			all, err := s.List()
			if err != nil || len(all) != 20 {
				t.Fatalf("List = %d allocations, %v; want 20", len(all), err)
			}
		})
	}
}

func TestReleaseFreesAndDoesNotReuseAtOnce(t *testing.T) {
	s := open(t, t.TempDir())
	p := netip.MustParsePrefix("10.2.0.0/24")
	a, _ := s.Allocate("a", "eth0", p, 0)
	got, err := s.Release("a", "eth0")
	if err != nil || len(got) != 1 || got[0] != a {
		t.Fatalf("Release = %v, %v; want [%s]", got, err, a)
	}
	if again, _ := s.Release("a", "eth0"); len(again) != 0 {
		t.Fatalf("second Release freed %v", again)
	}
	b, _ := s.Allocate("b", "eth0", p, 0)
	if b == a {
		t.Fatalf("released %s handed out again at once (round-robin expected)", a)
	}
	if held, _ := s.Get("a", "eth0"); len(held) != 0 {
		t.Fatalf("a still holds %v", held)
	}
}

func TestAllocateReportsExhaustionAndWrapsAround(t *testing.T) {
	s := open(t, t.TempDir())
	p := netip.MustParsePrefix("10.3.0.0/29") // .2 to .6: five pod addresses
	var got []netip.Addr
	for i := 0; i < 5; i++ {
		a, err := s.Allocate(fmt.Sprint(i), "eth0", p, 0)
		if err != nil {
			t.Fatalf("allocation %d: %v", i, err)
		}
		got = append(got, a)
	}
	if _, err := s.Allocate("x", "eth0", p, 0); !errors.Is(err, ErrExhausted) {
		t.Fatalf("sixth Allocate err = %v, want ErrExhausted", err)
	}
	if free, _ := s.Free(p); free != 0 {
		t.Fatalf("Free = %d, want 0", free)
	}
	s.Release("0", "eth0")
	a, err := s.Allocate("x", "eth0", p, 0)
	if err != nil || a != got[0] {
		t.Fatalf("after a release Allocate = %s, %v; want the freed %s (wrap-around)", a, err, got[0])
	}
}

func TestConcurrentAllocationsFromSeparateHandlesNeverShare(t *testing.T) {
	dir := t.TempDir()
	p := netip.MustParsePrefix("10.4.0.0/24")
	const n = 50
	addrs := make([]netip.Addr, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			s, err := Open(dir, "net") // own file description: flock applies
			if err != nil {
				errs[i] = err
				return
			}
			defer s.Close()
			if err := s.Lock(); err != nil {
				errs[i] = err
				return
			}
			defer s.Unlock()
			addrs[i], errs[i] = s.Allocate(fmt.Sprintf("c%d", i), "eth0", p, 0)
		}(i)
	}
	wg.Wait()
	seen := map[netip.Addr]int{}
	for i, a := range addrs {
		if errs[i] != nil {
			t.Fatalf("allocation %d: %v", i, errs[i])
		}
		if j, dup := seen[a]; dup {
			t.Fatalf("containers %d and %d share %s", i, j, a)
		}
		seen[a] = i
	}
}

func TestLockRemovesTemporariesOfACrashedWriter(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, "net")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tmp := filepath.Join(s.Dir(), tmpPrefix+"deadbeef")
	if err := os.WriteFile(tmp, []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.Lock(); err != nil {
		t.Fatal(err)
	}
	defer s.Unlock()
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Fatalf("temporary file survived Lock: %v", err)
	}
	if all, _ := s.List(); len(all) != 0 {
		t.Fatalf("List = %v, want nothing", all)
	}
}

func TestListReadsHostLocalLayoutAndSkipsForeignFiles(t *testing.T) {
	s := open(t, t.TempDir())
	os.WriteFile(filepath.Join(s.Dir(), "10.5.0.7"), []byte("abc\r\neth1"), 0o600)
	os.WriteFile(filepath.Join(s.Dir(), "README"), []byte("not an allocation"), 0o600)
	os.WriteFile(filepath.Join(s.Dir(), "last_reserved_ip.0"), []byte("10.5.0.7"), 0o600)
	all, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	want := Allocation{Addr: netip.MustParseAddr("10.5.0.7"), ContainerID: "abc", IfName: "eth1"}
	if len(all) != 1 || all[0] != want {
		t.Fatalf("List = %+v, want [%+v]", all, want)
	}
}

func TestBadKeysAreRejected(t *testing.T) {
	s := open(t, t.TempDir())
	p := netip.MustParsePrefix("10.6.0.0/24")
	for _, k := range [][2]string{{"", "eth0"}, {"id", ""}, {"a\r\nb", "eth0"}} {
		if _, err := s.Allocate(k[0], k[1], p, 0); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("Allocate(%q, %q) err = %v, want ErrInvalidKey", k[0], k[1], err)
		}
	}
	if _, err := Open(t.TempDir(), "../escape"); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("Open with a path separator in the network err = %v, want ErrInvalidKey", err)
	}
}

func TestFreeCountsLargeIPv6RangesWithoutOverflow(t *testing.T) {
	s := open(t, t.TempDir())
	free, err := s.Free(netip.MustParsePrefix("fd00::/48"))
	if err != nil || free != ^uint64(0) {
		t.Fatalf("Free(/48) = %d, %v; want saturated", free, err)
	}
	free, _ = s.Free(netip.MustParsePrefix("10.0.0.0/24"))
	if free != 253 {
		t.Fatalf("Free(/24) = %d, want 253", free)
	}
}

func FuzzUsableAndAllocate(f *testing.F) {
	f.Add("10.0.0.0/24")
	f.Add("10.0.0.0/30")
	f.Add("fd00::/126")
	f.Add("0.0.0.0/0")
	f.Add("::/0")
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, s string) {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return
		}
		first, last, err := Usable(p)
		if err != nil {
			return
		}
		if !p.Contains(first) || !p.Contains(last) || last.Less(first) || first == Gateway(p) {
			t.Fatalf("Usable(%s) = %s, %s", p, first, last)
		}
		st, err := Open(dir, "fuzz")
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		st.Lock()
		defer st.Unlock()
		a, err := st.Allocate("c", "eth0", p, 0)
		if err != nil {
			t.Fatalf("Allocate from an empty %s: %v", p, err)
		}
		if !p.Contains(a) || a.Less(first) || last.Less(a) {
			t.Fatalf("Allocate(%s) = %s outside [%s, %s]", p, a, first, last)
		}
		if _, err := st.Release("c", "eth0"); err != nil {
			t.Fatal(err)
		}
	})
}

// TestLongContainerIDsReadBack: allocations are read with a fixed buffer
// and read on while it comes back full, so a container ID longer than it
// is still found.
func TestLongContainerIDsReadBack(t *testing.T) {
	s, err := Open(t.TempDir(), "long")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Lock(); err != nil {
		t.Fatal(err)
	}
	defer s.Unlock()
	r := netip.MustParsePrefix("10.1.0.0/24")
	for _, n := range []int{1, 510, 512, 1024, 5000} {
		id := strings.Repeat("c", n)
		a, err := s.Allocate(id, "eth0", r, 0)
		if err != nil {
			t.Fatal(err)
		}
		held, err := s.Get(id, "eth0")
		if err != nil || len(held) != 1 || held[0] != a {
			t.Fatalf("container ID of %d bytes: Get = %v, %v; want [%s]", n, held, err, a)
		}
	}
}
