package apiserver

import (
	"fmt"
	"net/http"
	"runtime/debug"
	"sync/atomic"
)

// warmStacks runs deeply recursive request work (managedFields tracking:
// structured-merge-diff walks the whole object recursively, through
// reflection) on long-lived goroutines whose stacks have already grown.
//
// Every HTTP/2 request runs on a new goroutine that starts with a small
// stack; the field manager's recursion then grows it several times, each
// growth copying the whole stack. A CPU profile of the write-path benchmark
// put that copying at about 0.04 ms of CPU per create. A worker keeps its
// stack between requests (the garbage collector may halve an idle one,
// which the next request grows back once), so the copying happens about
// once per worker per GC cycle instead of once per request. gRPC's server
// does the same with its stream workers.
//
// The work runs while the request's goroutine waits for it, so nothing
// runs concurrently that did not before; a panic is raised again on the
// request's goroutine (its recover middleware answers 500 as before), with
// the worker's stack at the panic in its message. When
// every worker is busy and the pool is at its size, the work runs inline.
type warmStacks struct {
	jobs    chan func()
	workers atomic.Int32
	max     int32
}

func newWarmStacks(max int) *warmStacks {
	return &warmStacks{jobs: make(chan func()), max: int32(max)}
}

// fieldManagerStacks is sized for the concurrency of writes a server sees:
// each worker holds its stack (tens of KiB) for good.
var fieldManagerStacks = newWarmStacks(64)

// do runs f on a warm goroutine and waits for it.
func (p *warmStacks) do(f func()) {
	done := make(chan any, 1)
	job := func() {
		finished := false
		defer func() {
			if !finished {
				// f panicked, or called runtime.Goexit (which
				// ends the worker; the request gets a panic).
				v := recover()
				switch {
				case v == nil:
					v = errGoexit
				case v != http.ErrAbortHandler:
					v = &workerPanic{value: v, stack: debug.Stack()}
				}
				done <- v
			}
		}()
		f()
		finished = true
		done <- nil
	}
	select {
	case p.jobs <- job:
	default:
		if p.workers.Add(1) > p.max {
			p.workers.Add(-1)
			f()
			return
		}
		go p.work(job)
	}
	if v := <-done; v != nil {
		panic(v)
	}
}

// work runs jobs for good (a job recovers its own panics; a
// runtime.Goexit in one ends the worker, which a new one replaces on
// demand).
func (p *warmStacks) work(job func()) {
	defer p.workers.Add(-1)
	for {
		job()
		job = <-p.jobs
	}
}

type goexitError struct{}

func (goexitError) Error() string { return "runtime.Goexit called in managedFields tracking" }

var errGoexit error = goexitError{}

// workerPanic is a panic raised again on the request's goroutine: the
// value, and the stack where it happened.
type workerPanic struct {
	value any
	stack []byte
}

func (p *workerPanic) Error() string {
	return fmt.Sprintf("%v\n\npanicked on a warm-stack worker:\n%s", p.value, p.stack)
}

func (p *workerPanic) Unwrap() error {
	err, _ := p.value.(error)
	return err
}
