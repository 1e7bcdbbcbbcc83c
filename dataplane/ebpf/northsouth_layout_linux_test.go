//go:build 386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm

package ebpf

import (
	"testing"
	"unsafe"
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
