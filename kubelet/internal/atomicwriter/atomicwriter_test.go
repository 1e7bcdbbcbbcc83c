package atomicwriter

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func read(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestWriteSwapsDataAtomicallyAndPrunes(t *testing.T) {
	dir := t.TempDir()
	changed, err := Write(dir, map[string]File{"token": {[]byte("t1"), 0o644}, "sub/ca.crt": {[]byte("ca"), 0o600}})
	if err != nil || !changed {
		t.Fatalf("first write: %v %v", changed, err)
	}
	first, err := os.Readlink(filepath.Join(dir, DataDirName))
	if err != nil || !strings.HasPrefix(first, "..") {
		t.Fatalf("..data -> %q, %v", first, err)
	}
	if l, _ := os.Readlink(filepath.Join(dir, "token")); l != "..data/token" {
		t.Errorf("token -> %q, want ..data/token", l)
	}
	if got := read(t, filepath.Join(dir, "sub", "ca.crt")); got != "ca" {
		t.Errorf("sub/ca.crt = %q", got)
	}
	if st, _ := os.Stat(filepath.Join(dir, "sub", "ca.crt")); st.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", st.Mode().Perm())
	}

	// Same payload: nothing changes, not even the version.
	changed, err = Write(dir, map[string]File{"token": {[]byte("t1"), 0o644}, "sub/ca.crt": {[]byte("ca"), 0o600}})
	if err != nil || changed {
		t.Fatalf("same payload rewrote: %v %v", changed, err)
	}
	if l, _ := os.Readlink(filepath.Join(dir, DataDirName)); l != first {
		t.Errorf("..data moved to %q on an unchanged payload", l)
	}

	// New token, sub/ gone: a new version, the old one and sub removed.
	if _, err := Write(dir, map[string]File{"token": {[]byte("t2"), 0o644}}); err != nil {
		t.Fatal(err)
	}
	if got := read(t, filepath.Join(dir, "token")); got != "t2" {
		t.Errorf("token = %q after rotation", got)
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 3 { // ..<ts>, ..data, token
		t.Errorf("dir holds %v, want the new version, ..data and token", names)
	}
	if _, err := os.Stat(filepath.Join(dir, first)); !os.IsNotExist(err) {
		t.Errorf("old version %s still there: %v", first, err)
	}
}

func TestWriteRefusesEscapingPaths(t *testing.T) {
	for _, p := range []string{"../x", "/etc/passwd", "a/../../x", "..data", ""} {
		if _, err := Write(t.TempDir(), map[string]File{p: {[]byte("x"), 0o644}}); err == nil {
			t.Errorf("%q accepted", p)
		}
	}
}
