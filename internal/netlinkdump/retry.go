// Package netlinkdump retries netlink dumps that the kernel interrupted.
//
// A dump (a list of links, addresses, routes or neighbours) comes in
// several messages; when the list changes while it is read, the kernel
// marks the dump NLM_F_DUMP_INTR, and github.com/vishvananda/netlink v1.3.0
// reports that as EINTR. On a node starting many pods at once every CNI ADD
// adds a veth and its addresses while other ADDs and the route reconciler
// list them, so an interrupted dump is common and is retried, not failed.
package netlinkdump

import (
	"errors"

	"golang.org/x/sys/unix"
)

// Attempts bounds the retries of one dump.
const Attempts = 10

// Retry runs dump until it is not interrupted, at most Attempts times, and
// returns its last result.
func Retry[T any](dump func() (T, error)) (T, error) {
	var v T
	var err error
	for range Attempts {
		if v, err = dump(); !errors.Is(err, unix.EINTR) {
			return v, err
		}
	}
	return v, err
}
