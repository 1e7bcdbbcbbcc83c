package images

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"syscall"
)

// TreeFiles returns the regular files, directories and symbolic links under
// root as Files placed under prefix ("/" for an image's root), with their
// permission bits (setuid, setgid and sticky included) and owners. A hard
// link becomes a copy; devices, sockets and FIFOs are refused. It is how a
// root file system unpacked from packages (dpkg-deb -x) or a build output
// becomes an image.
func TreeFiles(root, prefix string) ([]File, error) {
	var files []File
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		f := File{Path: path.Join("/", prefix, filepath.ToSlash(rel)), Mode: int64(fi.Mode().Perm())}
		if fi.Mode()&fs.ModeSetuid != 0 {
			f.Mode |= 0o4000
		}
		if fi.Mode()&fs.ModeSetgid != 0 {
			f.Mode |= 0o2000
		}
		if fi.Mode()&fs.ModeSticky != 0 {
			f.Mode |= 0o1000
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			f.UID, f.GID = int(st.Uid), int(st.Gid)
		}
		switch {
		case fi.IsDir():
			f.Dir = true
		case fi.Mode()&fs.ModeSymlink != 0:
			if f.Link, err = os.Readlink(p); err != nil {
				return err
			}
		case fi.Mode().IsRegular():
			if f.Data, err = os.ReadFile(p); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%w: %s is neither a file, a directory nor a symbolic link", ErrInvalidImage, p)
		}
		files = append(files, f)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read tree %s: %w", root, err)
	}
	return files, nil
}
