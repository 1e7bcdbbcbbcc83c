//go:build !unix

package ipam

import (
	"os"
	"path/filepath"
)

func readAt(dir *os.File, name string) ([]byte, error) {
	return os.ReadFile(filepath.Join(dir.Name(), name))
}
