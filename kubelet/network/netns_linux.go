package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// createNetNS creates a network namespace bind-mounted at path, with its
// loopback up. An existing namespace at path is kept.
func createNetNS(path string) error {
	if _, err := ns.GetNS(path); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("netns dir: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil && !os.IsExist(err) {
		return fmt.Errorf("netns file %s: %w", path, err)
	}
	if f != nil {
		f.Close()
	}
	errc := make(chan error, 1)
	go func() {
		// This thread switches namespace and is never returned to the
		// scheduler: the goroutine exits with it locked, so it dies.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare netns: %w", err)
			return
		}
		src := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind-mount netns at %s: %w", path, err)
			return
		}
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if err != nil {
			errc <- fmt.Errorf("loopback up in %s: %w", path, err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		unix.Unmount(path, unix.MNT_DETACH)
		os.Remove(path)
		return err
	}
	return nil
}

// RemoveNetNS unmounts and removes the namespace at path; a missing one is
// not an error. Mounts stacked on the path (a namespace dir that is shared
// and bind-mounted, as `ip netns` makes /run/netns) are detached one by one,
// and the whole is retried a few times; a path that still cannot be removed
// is ErrNetNSBusy: the namespace may still hold the pod's interface and
// address.
func RemoveNetNS(path string) error {
	var last error
	for attempt := 0; attempt < 5; attempt++ {
		if attempt > 0 {
			time.Sleep(time.Duration(attempt) * 20 * time.Millisecond)
		}
		for i := 0; i < 16; i++ {
			err := unix.Unmount(path, unix.MNT_DETACH)
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
				break // nothing (more) mounted there
			}
			if err != nil {
				last = fmt.Errorf("unmount netns %s: %w", path, err)
				break
			}
		}
		err := os.Remove(path)
		if err == nil || os.IsNotExist(err) {
			return nil
		}
		last = fmt.Errorf("remove netns %s: %w", path, err)
	}
	return fmt.Errorf("%w: %w", ErrNetNSBusy, last)
}

// DialInNetNS dials addr (TCP) from inside the network namespace at path,
// as a process of the pod would: 127.0.0.1 is the pod's loopback.
func DialInNetNS(ctx context.Context, path, addr string) (net.Conn, error) {
	var conn net.Conn
	err := ns.WithNetNSPath(path, func(ns.NetNS) error {
		var d net.Dialer
		var err error
		conn, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dial %s in %s: %w", addr, path, err)
	}
	return conn, nil
}
