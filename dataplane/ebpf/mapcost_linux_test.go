package ebpf

import (
	"testing"
	"unsafe"

	"github.com/cilium/ebpf"

	"github.com/waggle-io/waggle/internal/testutil"
)

// BenchmarkKernelBatchInsert times BPF_MAP_UPDATE_BATCH of n fresh entries
// (4,096 per call) into an empty map, per map type and flags, with the key
// and value sizes of the socket LB's maps (k4v20 backends, k24v16 layout 1's
// services entries, k24v80 layout 2's, k4v256 names; rev_nat is k4v20 too):
// what a first sync pays the kernel per entry. cpu-ns/entry is the
// process's CPU time; ns/entry the wall time, which also holds work the
// kernel does elsewhere (no-prealloc maps refill their element caches from
// irq_work).
func BenchmarkKernelBatchInsert(b *testing.B) {
	testutil.RequiresKernelFeature(b, testutil.CgroupSockAddr)
	b.Run("hash-noprealloc-k4v20", func(b *testing.B) { batchInsert[[4]byte, [20]byte](b, ebpf.Hash, 1) })
	b.Run("hash-prealloc-k4v20", func(b *testing.B) { batchInsert[[4]byte, [20]byte](b, ebpf.Hash, 0) })
	b.Run("array-k4v20", func(b *testing.B) { batchInsert[[4]byte, [20]byte](b, ebpf.Array, 0) })
	b.Run("hash-noprealloc-k24v16", func(b *testing.B) { batchInsert[[24]byte, [16]byte](b, ebpf.Hash, 1) })
	b.Run("hash-prealloc-k24v16", func(b *testing.B) { batchInsert[[24]byte, [16]byte](b, ebpf.Hash, 0) })
	b.Run("hash-noprealloc-k24v56", func(b *testing.B) { batchInsert[[24]byte, [56]byte](b, ebpf.Hash, 1) })
	b.Run("hash-prealloc-k24v56", func(b *testing.B) { batchInsert[[24]byte, [56]byte](b, ebpf.Hash, 0) })
	b.Run("hash-noprealloc-k24v80", func(b *testing.B) { batchInsert[[24]byte, [80]byte](b, ebpf.Hash, 1) })
	b.Run("hash-noprealloc-k4v256", func(b *testing.B) { batchInsert[[4]byte, [256]byte](b, ebpf.Hash, 1) })
	b.Run("hash-prealloc-k4v256", func(b *testing.B) { batchInsert[[4]byte, [256]byte](b, ebpf.Hash, 0) })
	b.Run("array-k4v256", func(b *testing.B) { batchInsert[[4]byte, [256]byte](b, ebpf.Array, 0) })
}

func batchInsert[K, V any](b *testing.B, typ ebpf.MapType, flags uint32) {
	const n = 100000
	keys, vals := make([]K, n), make([]V, n)
	for i := range n {
		k := unsafe.Slice((*byte)(unsafe.Pointer(&keys[i])), unsafe.Sizeof(keys[i]))
		k[0], k[1], k[2] = byte(i+1), byte((i+1)>>8), byte((i+1)>>16)
		if len(k) > 4 {
			k[5] = 0xff
		}
		unsafe.Slice((*byte)(unsafe.Pointer(&vals[i])), 1)[0] = 1
	}
	var cpu int64
	for b.Loop() {
		b.StopTimer()
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: typ, KeySize: uint32(unsafe.Sizeof(keys[0])),
			ValueSize: uint32(unsafe.Sizeof(vals[0])), MaxEntries: 1 << 17, Flags: flags})
		if err != nil {
			b.Fatal(err)
		}
		cpu0 := processCPU()
		b.StartTimer()
		for off := 0; off < n; off += 4096 {
			e := min(n, off+4096)
			if _, err := m.BatchUpdate(keys[off:e], vals[off:e], nil); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		cpu += (processCPU() - cpu0).Nanoseconds()
		m.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(cpu)/float64(b.N)/n, "cpu-ns/entry")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/entry")
}
