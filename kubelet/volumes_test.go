package kubelet

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestExpandSubPath(t *testing.T) {
	env := []string{"POD_NAME=web-0", "EMPTY=", "DOTS=..", "ABS=/tmp"}
	for _, tc := range []struct {
		expr, want, err string
	}{
		{expr: "$(POD_NAME)", want: "web-0"},
		{expr: "logs/$(POD_NAME)/x", want: "logs/web-0/x"},
		{expr: "$$(POD_NAME)", want: "$(POD_NAME)"},
		{expr: "$(DOTS)", want: ".."},
		{expr: "$(ABS)", want: "/tmp"},
		{expr: "$(MISSING)/$(POD_NAME)", err: "missing value for MISSING"},
		{expr: "$(EMPTY)/$(MISSING)", err: "missing value for EMPTY, MISSING"},
	} {
		got, err := expandSubPath(tc.expr, env)
		if tc.err != "" {
			if err == nil || err.Error() != tc.err {
				t.Errorf("%s: err %v, want %q", tc.expr, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s = %q, %v; want %q", tc.expr, got, err, tc.want)
		}
	}
}

// TestSubPathSourceStaysInTheVolume: a subPath is relative, has no ".."
// component, and a symlink the pod made in its volume cannot lead the bind
// mount (or the directory the kubelet creates) out of the volume.
func TestSubPathSourceStaysInTheVolume(t *testing.T) {
	root := t.TempDir()
	vol := filepath.Join(root, "vol")
	outside := filepath.Join(root, "outside")
	for _, d := range []string{vol, outside} {
		if err := os.Mkdir(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(vol, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(vol, "escape")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../outside", filepath.Join(vol, "relescape")); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"/etc", "../outside", "a/../../outside"} {
		if p, err := subPathSource(vol, bad, true); err == nil {
			t.Errorf("subPath %q accepted as %s", bad, p)
		}
	}
	for _, sub := range []string{"escape/x", "relescape/y"} {
		p, err := subPathSource(vol, sub, true)
		if err != nil {
			t.Errorf("subPath %q: %v", sub, err)
			continue
		}
		if !strings.HasPrefix(p, vol+string(filepath.Separator)) {
			t.Errorf("subPath %q resolved outside the volume: %s", sub, p)
		}
	}
	if ents, _ := os.ReadDir(outside); len(ents) > 0 {
		t.Errorf("directories made outside the volume: %v", ents)
	}
	p, err := subPathSource(vol, "a..b/c", true)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p)
	if err != nil || !st.IsDir() || st.Mode().Perm() != 0o777 {
		t.Errorf("made subPath %s: %v %v, want a directory of the volume's mode 0777", p, st, err)
	}
}
