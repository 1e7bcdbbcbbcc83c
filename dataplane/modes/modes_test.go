package modes

import (
	"errors"
	"testing"

	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/dataplane/ipvs"
)

func TestAllListsTheModesInAutoOrder(t *testing.T) {
	all := All()
	want := []struct {
		name     string
		auto     bool
		loopback bool
	}{{dataplane.ModeEBPF, true, true}, {dataplane.ModeIPTables, true, false}, {dataplane.ModeIPVS, false, false}}
	if len(all) != len(want) {
		t.Fatalf("%d modes", len(all))
	}
	for i, w := range want {
		m := all[i]
		if m.Name != w.name || m.AutoCandidate != w.auto || m.LoopbackNodePorts != w.loopback || m.New == nil || m.Cleanup == nil || m.Supported == nil {
			t.Errorf("mode %d: %+v, want %+v", i, m, w)
		}
	}
}

// TestIPVSModeRefusesWithoutKernelSupport: on a kernel without IPVS,
// --mode=ipvs is refused with the reason and auto does not pick it.
func TestIPVSModeRefusesWithoutKernelSupport(t *testing.T) {
	if ipvs.Supported() == nil {
		t.Skip("this kernel has IPVS")
	}
	_, _, err := dataplane.SelectMode(dataplane.ModeIPVS, All())
	if !errors.Is(err, dataplane.ErrNotSupported) {
		t.Errorf("--mode=ipvs: %v, want ErrNotSupported", err)
	}
	if m, _, err := dataplane.SelectMode(dataplane.ModeAuto, All()); err == nil && m.Name == dataplane.ModeIPVS {
		t.Error("auto picked ipvs")
	}
}
