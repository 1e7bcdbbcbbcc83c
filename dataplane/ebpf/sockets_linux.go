package ebpf

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

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
		if l.frontend.Protocol != dataplane.UDP && !((tcp || l.terminateTCP) && l.frontend.Protocol == dataplane.TCP) {
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

// socketJanitor destroys the sockets of removed backends as its own job, off
// the sync path: a sync only queues what it removed, so an endpoint change
// is in the maps without waiting for every network namespace's socket dump.
// Runs are at least SocketTerminationInterval apart; backends removed in
// between are handled together. A kernel without SOCK_DESTROY
// (CONFIG_INET_DIAG_DESTROY) is reported once and the job stops trying.
type socketJanitor struct {
	b       *Backend
	mu      sync.Mutex
	queue   []lostBackend
	kick    chan struct{}
	done    chan struct{}
	stopped chan struct{}
	// queued counts enqueue calls, handled how many of them a finished
	// run covered; cond signals each run's end (WaitSocketsTerminated).
	queued, handled uint64
	cond            *sync.Cond
}

func newSocketJanitor(b *Backend) *socketJanitor {
	j := &socketJanitor{b: b, kick: make(chan struct{}, 1), done: make(chan struct{}), stopped: make(chan struct{})}
	j.cond = sync.NewCond(&j.mu)
	go j.loop()
	return j
}

func (j *socketJanitor) enqueue(lost []lostBackend) {
	if j == nil {
		return
	}
	j.mu.Lock()
	j.queue = append(j.queue, lost...)
	j.queued++
	j.mu.Unlock()
	select {
	case j.kick <- struct{}{}:
	default:
	}
}

func (j *socketJanitor) stop() {
	if j == nil {
		return
	}
	select {
	case <-j.done:
	default:
		close(j.done)
	}
	<-j.stopped
	j.mu.Lock()
	j.handled = j.queued // nothing will run any more: release waiters
	j.cond.Broadcast()
	j.mu.Unlock()
}

// wait blocks until every job queued before the call has run.
func (j *socketJanitor) wait(ctx context.Context) error {
	j.mu.Lock()
	want := j.queued
	j.mu.Unlock()
	stop := context.AfterFunc(ctx, func() {
		j.mu.Lock()
		j.cond.Broadcast()
		j.mu.Unlock()
	})
	defer stop()
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.handled < want {
		if err := ctx.Err(); err != nil {
			return err
		}
		j.cond.Wait()
	}
	return nil
}

func (j *socketJanitor) loop() {
	defer close(j.stopped)
	unsupported := false
	for {
		select {
		case <-j.done:
			return
		case <-j.kick:
		}
		j.mu.Lock()
		lost, seq := j.queue, j.queued
		j.queue = nil
		j.mu.Unlock()
		if !unsupported && len(lost) > 0 {
			n, err := destroyStaleSockets(j.b.cfg.CgroupPath, j.b.objs.WaggleReverseSk, lost, j.b.cfg.DestroyTCPSockets)
			switch {
			case errors.Is(err, unix.EOPNOTSUPP):
				unsupported = true
				j.b.log.Warn("this kernel cannot destroy sockets (no CONFIG_INET_DIAG_DESTROY): connected UDP sockets keep a removed backend until they reconnect", "err", err)
			case err != nil:
				j.b.log.Warn("destroy sockets of removed backends", "err", err)
			}
			if n > 0 {
				j.b.log.Info("destroyed sockets connected to removed backends", "sockets", n)
			}
			if j.b.m != nil {
				j.b.m.socketsDestroyed.Add(float64(n))
			}
		}
		j.mu.Lock()
		j.handled = seq
		j.cond.Broadcast()
		j.mu.Unlock()
		t := time.NewTimer(j.b.cfg.SocketTerminationInterval)
		select {
		case <-j.done:
			t.Stop()
			return
		case <-t.C:
		}
	}
}
