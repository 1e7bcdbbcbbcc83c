package cliflag

import (
	"strings"
	"testing"
	"time"
)

func TestEnvFillsFlagsNotGivenOnTheCommandLine(t *testing.T) {
	fs := NewFlagSet("x", "test")
	Discard(fs)
	addr := fs.String("bind-address", "0.0.0.0", "")
	dir := fs.String("data-dir", "/var/lib/waggle", "")
	d := fs.Duration("sync-period", time.Second, "")
	env := map[string]string{
		"WAGGLE_BIND_ADDRESS": "127.0.0.1",
		"WAGGLE_DATA_DIR":     "/from/env",
		"WAGGLE_SYNC_PERIOD":  "5s",
	}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	if err := parse(fs, []string{"--data-dir", "/from/flag"}, lookup); err != nil {
		t.Fatal(err)
	}
	if *addr != "127.0.0.1" || *dir != "/from/flag" || *d != 5*time.Second {
		t.Fatalf("got bind=%q dir=%q period=%v", *addr, *dir, *d)
	}
}

func TestBadEnvironmentValueNamesTheVariable(t *testing.T) {
	fs := NewFlagSet("x", "test")
	Discard(fs)
	fs.Int("nodes", 3, "")
	lookup := func(k string) (string, bool) { return "three", k == "WAGGLE_NODES" }
	err := parse(fs, nil, lookup)
	if err == nil || !strings.Contains(err.Error(), "WAGGLE_NODES") {
		t.Fatalf("want an error naming WAGGLE_NODES, got %v", err)
	}
}

func TestStringListSplitsCommas(t *testing.T) {
	var l StringList
	_ = l.Set("a, b")
	_ = l.Set("c")
	if l.String() != "a,b,c" {
		t.Fatalf("got %q", l.String())
	}
}
