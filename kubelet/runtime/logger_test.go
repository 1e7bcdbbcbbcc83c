package runtime

import (
	"os"
	"path/filepath"
	"testing"
)

func TestDefaultLoggerPrefersTheSmallBinaryBesideSelf(t *testing.T) {
	dir := t.TempDir()
	self := filepath.Join(dir, "waggle")
	small := filepath.Join(dir, LoggerBinary)
	if got := DefaultLogger(self); got != self {
		t.Fatalf("no %s beside %s: got %s, want the executable itself", LoggerBinary, self, got)
	}
	// Present but not executable: not a logger the shim can start.
	if err := os.WriteFile(small, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := DefaultLogger(self); got != self {
		t.Fatalf("non-executable %s: got %s, want %s", small, got, self)
	}
	if err := os.Chmod(small, 0o755); err != nil {
		t.Fatal(err)
	}
	if got := DefaultLogger(self); got != small {
		t.Fatalf("got %s, want %s", got, small)
	}
}
