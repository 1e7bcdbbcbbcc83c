//go:build !linux

package ipvs

import (
	"fmt"

	"github.com/waggle-io/waggle/dataplane"
)

func supported() error {
	return fmt.Errorf("IPVS needs Linux: %w", dataplane.ErrNotSupported)
}

func newNetlinkHandle(string) (Handle, error) { return nil, supported() }
func newNetlinkLink(string) (Link, error)     { return nil, supported() }
