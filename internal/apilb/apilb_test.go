package apilb

import (
	"context"
	"log/slog"
	"net"
	"testing"
)

// A dial goes to the current server while it answers, and to the next
// known server when it does not, which then stays current.
func TestDialFailsOverToTheNextServer(t *testing.T) {
	a, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	bal := &Balancer{seed: a.Addr().String(), servers: []string{a.Addr().String(), b.Addr().String()},
		ready: map[string]bool{a.Addr().String(): true, b.Addr().String(): true}, current: a.Addr().String()}
	bal.log = discard()
	c, err := bal.DialContext(context.Background(), "tcp", "ignored:443")
	if err != nil {
		t.Fatal(err)
	}
	if c.RemoteAddr().String() != a.Addr().String() {
		t.Fatalf("dialled %s, want the current server %s", c.RemoteAddr(), a.Addr())
	}
	c.Close()
	a.Close() // the server goes away: connection refused
	c, err = bal.DialContext(context.Background(), "tcp", "ignored:443")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.RemoteAddr().String() != b.Addr().String() {
		t.Fatalf("dialled %s after %s went away, want %s", c.RemoteAddr(), a.Addr(), b.Addr())
	}
	if _, cur := bal.Servers(); cur != b.Addr().String() {
		t.Fatalf("current server %s, want %s", cur, b.Addr())
	}
	// A server that is up but not ready (a partitioned minority) is
	// skipped while a ready one exists.
	bal.mu.Lock()
	bal.ready[b.Addr().String()] = false
	bal.mu.Unlock()
	if _, err := bal.DialContext(context.Background(), "tcp", "x"); err != nil {
		t.Fatalf("the only reachable server, even not ready, is still dialled: %v", err)
	}
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }
