package apiserver

import (
	"errors"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
)

// Work handed to a warm goroutine runs to completion before do returns,
// a panic in it comes back on the caller's goroutine with its value (the
// worker survives it), a runtime.Goexit comes back as a panic, and past
// the pool's size work runs inline rather than waiting.
func TestWarmStacks(t *testing.T) {
	p := newWarmStacks(2)
	ran := 0
	p.do(func() { ran++ })
	if ran != 1 {
		t.Fatalf("ran %d times, want 1", ran)
	}
	boom := errors.New("boom")
	panicked := func(f func()) (v any) {
		defer func() { v = recover() }()
		p.do(f)
		return nil
	}
	if v, _ := panicked(func() { panic(boom) }).(error); !errors.Is(v, boom) || !strings.Contains(v.Error(), "TestWarmStacks") {
		t.Fatalf("panic value %v, want %v with the stack where it happened", v, boom)
	}
	if v := panicked(func() { panic(http.ErrAbortHandler) }); v != http.ErrAbortHandler {
		t.Fatalf("panic value %v, want http.ErrAbortHandler itself", v)
	}
	if v := panicked(func() { runtime.Goexit() }); v != errGoexit {
		t.Fatalf("Goexit gave %v, want errGoexit", v)
	}
	p.do(func() { ran++ })
	if ran != 2 {
		t.Fatalf("ran %d times after the panics, want 2", ran)
	}

	// Two workers busy: a third call runs inline, on its own goroutine's
	// stack, without waiting for them.
	release := make(chan struct{})
	var started, wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		started.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.do(func() { started.Done(); <-release })
		}()
	}
	started.Wait()
	inline := false
	p.do(func() { inline = true })
	if !inline {
		t.Fatal("work past the pool's size did not run")
	}
	close(release)
	wg.Wait()
	if n := p.workers.Load(); n > 2 {
		t.Fatalf("%d workers, at most 2 allowed", n)
	}
}
