// Package atomicwriter writes the files of an API-backed volume
// (configMap, secret, downwardAPI, projected) so that a container reading
// them sees either the whole old set or the whole new set, never a mix —
// the kubelet's AtomicWriter contract upstream:
//
//	<dir>/..2026_12_01_18_40_00.123456789   the payload, one directory per version
//	<dir>/..data -> ..2026_12_01_18_40_00.123456789   swapped by rename(2)
//	<dir>/<top-level name> -> ..data/<top-level name> one symlink per entry
//
// A write whose payload equals what ..data holds changes nothing. The
// previous version's directory is removed after the swap; top-level
// symlinks no longer in the payload are removed. It is not a general file
// sync: paths are relative, without "..", and not starting with "..".
package atomicwriter

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// DataDirName is the symlink to the current version.
const DataDirName = "..data"

const newDataDirName = "..data_tmp"

// File is one file of the payload.
type File struct {
	Data []byte
	Mode os.FileMode
}

// Validate checks one payload path as upstream does.
func Validate(p string) error {
	switch {
	case p == "":
		return errors.New("empty path")
	case filepath.IsAbs(p):
		return fmt.Errorf("%q: must be relative", p)
	case len(p) > 4096:
		return fmt.Errorf("%q: longer than 4096 characters", p)
	case strings.HasPrefix(p, ".."):
		return fmt.Errorf("%q: must not start with '..'", p)
	}
	for _, part := range strings.Split(p, string(os.PathSeparator)) {
		if part == ".." {
			return fmt.Errorf("%q: must not contain '..'", p)
		}
	}
	return nil
}

// Write makes dir hold exactly payload (path → file), atomically. It
// reports whether anything changed.
func Write(dir string, payload map[string]File) (bool, error) {
	clean := make(map[string]File, len(payload))
	for p, f := range payload {
		if err := Validate(p); err != nil {
			return false, fmt.Errorf("invalid volume file path: %w", err)
		}
		clean[filepath.Clean(p)] = f
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	oldTS, _ := os.Readlink(filepath.Join(dir, DataDirName))
	if oldTS != "" && same(filepath.Join(dir, oldTS), clean) {
		return false, linkTopLevel(dir, clean)
	}
	ts, err := os.MkdirTemp(dir, time.Now().UTC().Format("..2006_01_02_15_04_05."))
	if err != nil {
		return false, err
	}
	if err := os.Chmod(ts, 0o755); err != nil {
		return false, err
	}
	for p, f := range clean {
		full := filepath.Join(ts, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return false, err
		}
		if err := os.WriteFile(full, f.Data, f.Mode.Perm()); err != nil {
			return false, err
		}
		if err := os.Chmod(full, f.Mode.Perm()); err != nil { // past the umask
			return false, err
		}
	}
	tmpLink := filepath.Join(dir, newDataDirName)
	os.Remove(tmpLink)
	if err := os.Symlink(filepath.Base(ts), tmpLink); err != nil {
		return false, err
	}
	if err := os.Rename(tmpLink, filepath.Join(dir, DataDirName)); err != nil {
		return false, err
	}
	return true, linkTopLevel(dir, clean)
}

// same reports whether the version directory holds exactly payload.
func same(ts string, payload map[string]File) bool {
	n := 0
	ok := true
	err := filepath.WalkDir(ts, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !ok {
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(ts, p)
		f, want := payload[rel]
		info, ierr := d.Info()
		if !want || ierr != nil || info.Mode().Perm() != f.Mode.Perm() {
			ok = false
			return nil
		}
		b, rerr := os.ReadFile(p)
		if rerr != nil || !bytes.Equal(b, f.Data) {
			ok = false
			return nil
		}
		n++
		return nil
	})
	return err == nil && ok && n == len(payload)
}

// linkTopLevel points <dir>/<first component> at ..data/<first component>
// for every payload entry, and removes the symlinks (and files left by an
// older, non-atomic writer) of entries no longer there.
func linkTopLevel(dir string, payload map[string]File) error {
	want := map[string]bool{}
	for p := range payload {
		top, _, _ := strings.Cut(p, string(os.PathSeparator))
		want[top] = true
	}
	for top := range want {
		link := filepath.Join(dir, top)
		target := filepath.Join(DataDirName, top)
		if cur, err := os.Readlink(link); err == nil && cur == target {
			continue
		}
		if err := os.RemoveAll(link); err != nil {
			return err
		}
		if err := os.Symlink(target, link); err != nil {
			return err
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	current, _ := os.Readlink(filepath.Join(dir, DataDirName))
	for _, e := range entries {
		// Keep ..data, the version it names and the payload's entries;
		// versions left by an interrupted write go too.
		if e.Name() == DataDirName || e.Name() == current || want[e.Name()] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}
