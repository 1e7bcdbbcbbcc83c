package routes

import (
	"errors"
	"fmt"
	"slices"
	"sync"
)

// fakeDP is an in-memory Dataplane that counts writes.
type fakeDP struct {
	mu     sync.Mutex
	routes []Route
	vxlan  *VXLANDevice
	neigh  []Neighbor
	fdb    []FDBEntry
	writes int
	// fail makes a write fail when it returns an error for the call.
	fail func(op string, arg any) error
}

func (f *fakeDP) write(op string, arg any) error {
	if f.fail != nil {
		if err := f.fail(op, arg); err != nil {
			return err
		}
	}
	f.writes++
	return nil
}

func (f *fakeDP) Routes() ([]Route, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.routes), nil
}

func (f *fakeDP) ReplaceRoute(r Route) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.write("ReplaceRoute", r); err != nil {
		return err
	}
	if r.Dev != "" && (f.vxlan == nil || f.vxlan.Name != r.Dev) {
		return fmt.Errorf("device %s: no such device", r.Dev)
	}
	f.routes = slices.DeleteFunc(f.routes, func(x Route) bool { return x.Dst == r.Dst })
	f.routes = append(f.routes, r)
	return nil
}

func (f *fakeDP) DeleteRoute(r Route) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.write("DeleteRoute", r); err != nil {
		return err
	}
	f.routes = slices.DeleteFunc(f.routes, func(x Route) bool { return x == r })
	return nil
}

func (f *fakeDP) EnsureVXLAN(v VXLANDevice) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.vxlan != nil && f.vxlan.Name == v.Name && f.vxlan.VNI == v.VNI && f.vxlan.Local == v.Local &&
		f.vxlan.MAC.String() == v.MAC.String() && slices.Equal(f.vxlan.Addrs, v.Addrs) && f.vxlan.MTU == v.MTU {
		return nil
	}
	if err := f.write("EnsureVXLAN", v); err != nil {
		return err
	}
	f.vxlan = &v
	return nil
}

func (f *fakeDP) DeleteLink(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.vxlan == nil || f.vxlan.Name != name {
		return nil
	}
	if err := f.write("DeleteLink", name); err != nil {
		return err
	}
	f.vxlan, f.neigh, f.fdb = nil, nil, nil
	// Routes through the device go with it, as in the kernel.
	f.routes = slices.DeleteFunc(f.routes, func(r Route) bool { return r.Dev == name })
	return nil
}

func (f *fakeDP) dev(name string) error {
	if f.vxlan == nil || f.vxlan.Name != name {
		return errors.New("no such device")
	}
	return nil
}

func (f *fakeDP) Neighbors(dev string) ([]Neighbor, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.neigh), f.dev(dev)
}

func (f *fakeDP) SetNeighbor(dev string, n Neighbor) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.dev(dev); err != nil {
		return err
	}
	if err := f.write("SetNeighbor", n); err != nil {
		return err
	}
	f.neigh = slices.DeleteFunc(f.neigh, func(x Neighbor) bool { return x.IP == n.IP })
	f.neigh = append(f.neigh, n)
	return nil
}

func (f *fakeDP) DeleteNeighbor(dev string, n Neighbor) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.write("DeleteNeighbor", n); err != nil {
		return err
	}
	f.neigh = slices.DeleteFunc(f.neigh, func(x Neighbor) bool { return x == n })
	return nil
}

func (f *fakeDP) FDB(dev string) ([]FDBEntry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.fdb), f.dev(dev)
}

func (f *fakeDP) SetFDB(dev string, e FDBEntry) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.dev(dev); err != nil {
		return err
	}
	if err := f.write("SetFDB", e); err != nil {
		return err
	}
	f.fdb = slices.DeleteFunc(f.fdb, func(x FDBEntry) bool { return x.MAC == e.MAC })
	f.fdb = append(f.fdb, e)
	return nil
}

func (f *fakeDP) DeleteFDB(dev string, e FDBEntry) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.write("DeleteFDB", e); err != nil {
		return err
	}
	f.fdb = slices.DeleteFunc(f.fdb, func(x FDBEntry) bool { return x == e })
	return nil
}

func (f *fakeDP) snapshot() (routes []Route, writes int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := slices.Clone(f.routes)
	slices.SortFunc(r, func(a, b Route) int {
		if a.Dst.String() < b.Dst.String() {
			return -1
		}
		return 1
	})
	return r, f.writes
}
