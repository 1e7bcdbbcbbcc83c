package inspect

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// golden compares got with testdata/name, or rewrites it under -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden (run with -update to create it): %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file (run with -update if the change is intended)\n--- got:\n%s\n--- want:\n%s", name, got, want)
	}
}

func renderAll(t *testing.T, name string, v any) {
	t.Helper()
	for _, format := range []string{FormatTable, FormatJSON, FormatYAML} {
		var b bytes.Buffer
		if err := render(&b, format, v); err != nil {
			t.Fatalf("render %s: %v", format, err)
		}
		golden(t, name+"."+format, b.Bytes())
	}
}
