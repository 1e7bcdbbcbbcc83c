//go:build !linux

package network

import "errors"

var errNotLinux = errors.New("pod network namespaces need Linux")

func createNetNS(string) error { return errNotLinux }
func removeNetNS(string) error { return nil }
