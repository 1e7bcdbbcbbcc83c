//go:build !unix

package ipam

import (
	"errors"
	"os"
)

var errNoFlock = errors.New("ipam: file locks are not supported on this platform")

func flock(*os.File) error   { return errNoFlock }
func funlock(*os.File) error { return errNoFlock }
