package ebpf

import (
	"fmt"
	"syscall"
	"testing"
	"time"
)

// discardTable accepts every write and holds nothing: what is left of a
// sync on it is the reconciler's own (Go) work.
type discardTable[K comparable, V any] struct{}

func (discardTable[K, V]) Put(keys []K, vals []V) error     { return nil }
func (discardTable[K, V]) Delete(keys []K) error            { return nil }
func (discardTable[K, V]) Iterate(fn func(K, V) bool) error { return nil }

func discardTables() tables {
	return tables{services: discardTable[sockLBLbServiceKey, sockLBLbService]{},
		backends: discardTable[uint32, sockLBLbBackend]{}, revNat: discardTable[uint32, sockLBLbRevNat]{},
		names: discardTable[uint32, sockLBLbSvcName]{}, affinity: discardTable[sockLBLbAffinityKey, sockLBLbAffinity]{},
		parallel: true}
}

// processCPU is the CPU time of the whole process (every thread, the
// garbage collector's included).
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkFirstSyncGoSide times the reconciler's share of programming
// 10,000 services × 10 backends, and 100,000 × 4, into empty maps (the
// kernel's share, the batched map writes, is measured by dataplane/bench's
// BenchmarkProgramFromScratch). cpu-ms/op is the process's CPU time, less
// sensitive than the wall time to other work on a shared machine.
func BenchmarkFirstSyncGoSide(b *testing.B) {
	for _, size := range []struct{ n, m int }{{10000, 10}, {100000, 4}} {
		b.Run(fmt.Sprintf("%dx%d", size.n, size.m), func(b *testing.B) {
			st := bigState(size.n, size.m)
			b.ReportAllocs()
			cpu0 := processCPU()
			for b.Loop() {
				r := newReconciler(discardTables(), 1<<21, 1<<21)
				if _, err := r.sync(st); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/op")
		})
	}
}
