//go:build !linux

package cni

import (
	"github.com/containernetworking/cni/pkg/skel"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// Attach is not supported off Linux.
func Attach(*skel.CmdArgs) (*current.Result, *Config, error) { return nil, nil, ErrNotSupported }

// Del is not supported off Linux.
func Del(*skel.CmdArgs) error { return ErrNotSupported }

// Check is not supported off Linux.
func Check(*skel.CmdArgs) error { return ErrNotSupported }

// GC is not supported off Linux.
func GC(*skel.CmdArgs) error { return ErrNotSupported }

// Status is not supported off Linux.
func Status(*skel.CmdArgs) error { return ErrNotSupported }
