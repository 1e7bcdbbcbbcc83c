package ebpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

var errE2BIG error = unix.E2BIG

// mapTable is a table on a real BPF map. Writes go in batches of
// batchSize (BPF_MAP_UPDATE_BATCH keeps their order), falling back to one
// syscall per entry on kernels without batch operations.
type mapTable[K comparable, V any] struct {
	name string
	m    *ebpf.Map
}

const batchSize = 4096

func (t mapTable[K, V]) Put(keys []K, vals []V) error {
	for len(keys) > 0 {
		n := min(len(keys), batchSize)
		done, err := t.m.BatchUpdate(keys[:n], vals[:n], nil)
		if errors.Is(err, ebpf.ErrNotSupported) {
			for i := range n {
				if err := t.m.Update(&keys[i], &vals[i], ebpf.UpdateAny); err != nil {
					return t.wrap(err)
				}
			}
			done, err = n, nil
		}
		if err != nil {
			return t.wrap(fmt.Errorf("after %d entries: %w", done, err))
		}
		keys, vals = keys[n:], vals[n:]
	}
	return nil
}

func (t mapTable[K, V]) Delete(keys []K) error {
	for len(keys) > 0 {
		n := min(len(keys), batchSize)
		done, err := t.m.BatchDelete(keys[:n], nil)
		switch {
		case err == nil:
			keys = keys[n:]
		case errors.Is(err, ebpf.ErrKeyNotExist):
			// keys[done] is missing: fine, go on after it.
			keys = keys[min(done+1, len(keys)):]
		case errors.Is(err, ebpf.ErrNotSupported):
			for i := range n {
				if err := t.m.Delete(&keys[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
					return fmt.Errorf("map %s: delete: %w", t.name, err)
				}
			}
			keys = keys[n:]
		default:
			return fmt.Errorf("map %s: delete: %w", t.name, err)
		}
	}
	return nil
}

func (t mapTable[K, V]) Iterate(fn func(K, V) bool) error {
	var k K
	var v V
	it := t.m.Iterate()
	for it.Next(&k, &v) {
		if !fn(k, v) {
			return nil
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("map %s: iterate: %w", t.name, err)
	}
	return nil
}

func (t mapTable[K, V]) wrap(err error) error {
	if errors.Is(err, errE2BIG) {
		return errMapFull(t.name, err)
	}
	return fmt.Errorf("map %s: update: %w", t.name, err)
}

// arrayTable is the backends array: Iterate reads it in batches (an array
// of a million entries would be two million syscalls one by one), and
// Delete is refused (an array entry is overwritten, not deleted).
type arrayTable[V any] struct {
	mapTable[uint32, V]
}

func (t arrayTable[V]) Delete(keys []uint32) error {
	if len(keys) == 0 {
		return nil
	}
	return fmt.Errorf("map %s: delete: an array entry cannot be deleted", t.name)
}

func (t arrayTable[V]) Iterate(fn func(uint32, V) bool) error {
	keys, vals := make([]uint32, batchSize), make([]V, batchSize)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := t.m.BatchLookup(&cursor, keys, vals, nil)
		if errors.Is(err, ebpf.ErrNotSupported) {
			return t.mapTable.Iterate(fn)
		}
		for i := range n {
			if !fn(keys[i], vals[i]) {
				return nil
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("map %s: iterate: %w", t.name, err)
		}
	}
}
