//go:build !linux

package network

import (
	"context"
	"errors"
	"net"
)

var errNotLinux = errors.New("pod network namespaces need Linux")

func createNetNS(string) error { return errNotLinux }

// RemoveNetNS has nothing to remove off Linux.
func RemoveNetNS(string) error { return nil }

// DialInNetNS needs Linux.
func DialInNetNS(context.Context, string, string) (net.Conn, error) { return nil, errNotLinux }
