package ebpf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/waggle-io/waggle/dataplane"
)

// destroyStaleSockets destroys the connected UDP sockets that the programs
// sent to a backend their frontend has lost (sock_diag SOCK_DESTROY, as
// `ss -K` does): the client's next send or receive fails with ECONNABORTED
// and it reconnects, through the load balancer, to a live backend. Only
// sockets the reverse-socket map links to that frontend are touched, in
// every network namespace that a process of the cgroup lives in.
//
// With tcp set, TCP sockets are destroyed the same way (their next call
// fails with ECONNABORTED, the peer gets a reset), as Cilium's
// bpf-lb-sock-terminate-pod-connections does; otherwise they live on with
// the backend they were connected to until they close.
func destroyStaleSockets(cgroupPath string, reverse *ebpf.Map, lost []lostBackend, tcp bool) (int, error) {
	stale := map[staleKey]map[uint32]bool{}
	for _, l := range lost {
		if l.frontend.Protocol != dataplane.UDP && !(tcp && l.frontend.Protocol == dataplane.TCP) {
			continue
		}
		k := staleKey{protoNum(l.frontend.Protocol), l.backend}
		if stale[k] == nil {
			stale[k] = map[uint32]bool{}
		}
		stale[k][l.serviceID] = true
	}
	if len(stale) == 0 {
		return 0, nil
	}
	paths, err := cgroupNetNS(cgroupPath)
	if err != nil {
		return 0, err
	}
	total := 0
	var errs []error
	for _, p := range paths {
		err := ns.WithNetNSPath(p, func(ns.NetNS) error {
			n, err := destroyInNetNS(reverse, stale)
			total += n
			return err
		})
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("netns %s: %w", p, err))
		}
	}
	return total, errors.Join(errs...)
}

// staleKey is a lost backend of one protocol.
type staleKey struct {
	proto uint8
	ap    netip.AddrPort
}

func destroyInNetNS(reverse *ebpf.Map, stale map[staleKey]map[uint32]bool) (int, error) {
	protos := map[uint8]bool{}
	for k := range stale {
		protos[k.proto] = true
	}
	n := 0
	for _, c := range []struct {
		proto  uint8
		family uint8
	}{{protoUDP, unix.AF_INET}, {protoUDP, unix.AF_INET6}, {protoTCP, unix.AF_INET}, {protoTCP, unix.AF_INET6}} {
		if !protos[c.proto] {
			continue
		}
		var socks []*netlink.Socket
		var err error
		if c.proto == protoUDP {
			socks, err = netlink.SocketDiagUDP(c.family)
		} else {
			socks, err = netlink.SocketDiagTCP(c.family)
		}
		if err != nil {
			return n, fmt.Errorf("dump %s sockets: %w", protoName(c.proto), err)
		}
		for _, s := range socks {
			dst, ok := netip.AddrFromSlice(s.ID.Destination)
			if !ok {
				continue
			}
			ap := netip.AddrPortFrom(dst.Unmap(), s.ID.DestinationPort)
			ids := stale[staleKey{c.proto, ap}]
			if ids == nil {
				continue
			}
			cookie := uint64(s.ID.Cookie[0]) | uint64(s.ID.Cookie[1])<<32
			var v sockLBLbReverseSk
			k := sockLBLbReverseSkKey{Cookie: cookie, Addr: addr16(ap.Addr()), Port: toNet16(ap.Port())}
			if err := reverse.Lookup(&k, &v); err != nil || !ids[v.RevNatId] {
				continue
			}
			if err := sockDestroy(s, c.proto); err != nil && !errors.Is(err, unix.ENOENT) {
				return n, fmt.Errorf("destroy %s socket %s -> %s: %w", protoName(c.proto), s.ID.Source, ap, err)
			}
			n++
		}
	}
	return n, nil
}

// sockDestroy sends SOCK_DESTROY for one socket, identified by its
// addresses and cookie, in the current network namespace.
func sockDestroy(s *netlink.Socket, proto uint8) error {
	// struct inet_diag_req_v2 with struct inet_diag_sockid.
	b := make([]byte, 56)
	b[0] = s.Family
	b[1] = proto
	binary.NativeEndian.PutUint32(b[4:], 0xffffffff)
	binary.BigEndian.PutUint16(b[8:], s.ID.SourcePort)
	binary.BigEndian.PutUint16(b[10:], s.ID.DestinationPort)
	if s.Family == unix.AF_INET {
		copy(b[12:16], s.ID.Source.To4())
		copy(b[28:32], s.ID.Destination.To4())
	} else {
		copy(b[12:28], s.ID.Source.To16())
		copy(b[28:44], s.ID.Destination.To16())
	}
	binary.NativeEndian.PutUint32(b[44:], s.ID.Interface)
	binary.NativeEndian.PutUint32(b[48:], s.ID.Cookie[0])
	binary.NativeEndian.PutUint32(b[52:], s.ID.Cookie[1])
	req := nl.NewNetlinkRequest(nl.SOCK_DESTROY, unix.NLM_F_ACK)
	req.AddRawData(b)
	_, err := req.Execute(unix.NETLINK_INET_DIAG, 0)
	return err
}

// cgroupNetNS returns one path per distinct network namespace that may hold
// load-balanced sockets: those of the processes in the cgroup tree at root,
// the named ones under /run/netns (where CNI runtimes pin pod namespaces,
// so a namespace whose process has just exited is found too), and this
// process's own. Sockets of other nodes found there are left alone: only
// cookies in this node's reverse-socket map are destroyed.
func cgroupNetNS(root string) ([]string, error) {
	seen := map[uint64]bool{}
	var paths []string
	add := func(nsPath string) {
		var st unix.Stat_t
		if err := unix.Stat(nsPath, &st); err != nil || seen[st.Ino] {
			return
		}
		seen[st.Ino] = true
		paths = append(paths, nsPath)
	}
	add("/proc/self/ns/net")
	for _, dir := range []string{"/run/netns", "/var/run/netns"} {
		named, _ := filepath.Glob(filepath.Join(dir, "*"))
		for _, p := range named {
			add(p)
		}
	}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		f, err := os.Open(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			return nil
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			pid, err := strconv.Atoi(sc.Text())
			if err != nil {
				continue
			}
			add(fmt.Sprintf("/proc/%d/ns/net", pid))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list network namespaces of cgroup %s: %w", root, err)
	}
	return paths, nil
}
