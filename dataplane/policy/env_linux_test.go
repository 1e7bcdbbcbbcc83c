package policy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/waggle-io/waggle/cni"
	"github.com/waggle-io/waggle/internal/testutil"
)

// env is one node: a network namespace with a bridge (the node's own
// address 10.77.0.1), pods in their own namespaces behind veths, the
// compiler and the real eBPF datapath pinned in a fresh directory.
type env struct {
	t      *testing.T
	node   *testutil.NetNS
	bridge string
	kind   string // "ebpf" or "iptables"
	dp     Datapath
	bpf    *BPF      // kind ebpf
	ipt    *IPTables // kind iptables
	c      *Compiler
	pods   map[string]*tpod
	next   int
	mu     sync.Mutex
}

// Ports every test pod serves: TCP 80, 81, 82 and UDP 80.
var servedTCP = []int{80, 81, 82}

type tpod struct {
	name, ns string
	netns    *testutil.NetNS
	ip       netip.Addr
	ifindex  uint32
	hostVeth string
	obj      *v1.Pod
}

// datapaths are the kinds of Datapath the table runs against.
var datapaths = []string{ModeEBPF, ModeIPTables}

// eachDatapath runs fn once per datapath, as a subtest.
func eachDatapath(t *testing.T, fn func(t *testing.T, e *env)) {
	for _, kind := range datapaths {
		t.Run(kind, func(t *testing.T) { fn(t, newEnvOf(t, kind)) })
	}
}

func newEnv(t *testing.T) *env { return newEnvOf(t, ModeEBPF) }

func newEnvOf(t *testing.T, kind string) *env {
	t.Helper()
	testutil.Privileged(t)
	testutil.RequiresRoot(t)
	node := testutil.NewNetNS(t)
	e := &env{t: t, node: node, bridge: "npbr0", kind: kind, pods: map[string]*tpod{}, next: 10, c: NewCompiler("node-a")}
	node.Run(t, "ip", "link", "add", e.bridge, "type", "bridge")
	node.Run(t, "ip", "addr", "add", "10.77.0.1/24", "dev", e.bridge)
	node.Run(t, "ip", "link", "set", e.bridge, "up")
	if kind == ModeIPTables {
		ipt, err := NewIPTables(IPTablesConfig{NetNS: "/run/netns/" + node.Name})
		if err != nil {
			t.Fatal(err)
		}
		e.ipt, e.dp = ipt, ipt
		t.Cleanup(func() {
			ipt.Close()
			if err := CleanupIPTables("/run/netns/" + node.Name); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		})
		e.init()
		return e
	}
	if err := os.MkdirAll("/sys/fs/bpf/waggle", 0o700); err != nil {
		t.Fatal(err)
	}
	pin, err := os.MkdirTemp("/sys/fs/bpf/waggle", "nptest-")
	if err != nil {
		t.Fatalf("pin dir on bpffs: %v", err)
	}
	pin = filepath.Join(pin, "policy")
	dp, err := NewBPF(BPFConfig{PinDir: pin, NetNS: "/run/netns/" + node.Name})
	if err != nil {
		t.Fatal(err)
	}
	e.dp, e.bpf = dp, dp
	t.Cleanup(func() {
		e.bpf.Close()
		if err := Cleanup(pin); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		os.Remove(filepath.Dir(pin))
	})
	e.init()
	return e
}

// init: the node's address, its echo server, the namespaces.
func (e *env) init() {
	t, node := e.t, e.node
	e.c.SetHostIPs([]netip.Addr{netip.MustParseAddr("10.77.0.1")})
	// The node serves too (a pod reaching its own node).
	e.pods["node"] = &tpod{name: "node", netns: node, ip: netip.MustParseAddr("10.77.0.1")}
	serveTCP(t, node, "10.77.0.1:80")
	for _, n := range []string{"x", "y", "z"} {
		e.c.SetNamespace(&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"kubernetes.io/metadata.name": n, "ns": n}}})
	}
	e.sync()
}

// sync compiles and programs what changed.
func (e *env) sync() Changes {
	e.t.Helper()
	ch := e.c.Compile()
	if err := Program(e.dp, e.c, ch); err != nil {
		e.t.Fatalf("program: %v", err)
	}
	return ch
}

// addPod makes a pod netns with a veth on the bridge and echo servers, and
// tells the compiler.
func (e *env) addPod(ns, name string, lbls map[string]string, ports ...v1.ContainerPort) *tpod {
	t := e.t
	t.Helper()
	e.next++
	p := &tpod{name: name, ns: ns, netns: testutil.NewNetNS(t), ip: netip.AddrFrom4([4]byte{10, 77, 0, byte(e.next)})}
	p.hostVeth = testutil.UniqueName("np")
	e.node.Run(t, "ip", "link", "add", p.hostVeth, "type", "veth", "peer", "name", "eth0", "netns", p.netns.Name)
	e.node.Run(t, "ip", "link", "set", p.hostVeth, "master", e.bridge, "up")
	e.node.Run(t, "ip", "link", "set", p.hostVeth, "alias", cni.HostVethAlias([]netip.Addr{p.ip}))
	p.netns.Run(t, "ip", "addr", "add", p.ip.String()+"/24", "dev", "eth0")
	p.netns.Run(t, "ip", "link", "set", "eth0", "up")
	p.netns.Run(t, "ip", "route", "add", "default", "via", "10.77.0.1")
	out := e.node.Run(t, "cat", "/sys/class/net/"+p.hostVeth+"/ifindex")
	var idx int
	fmt.Sscan(strings.TrimSpace(out), &idx)
	p.ifindex = uint32(idx)
	for _, port := range servedTCP {
		serveTCP(t, p.netns, fmt.Sprintf("%s:%d", p.ip, port))
	}
	serveUDP(t, p.netns, p.ip.String()+":80")
	p.obj = &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbls},
		Spec:       v1.PodSpec{NodeName: "node-a", Containers: []v1.Container{{Name: "c", Ports: ports}}},
		Status:     v1.PodStatus{Phase: v1.PodRunning, PodIP: p.ip.String(), PodIPs: []v1.PodIP{{IP: p.ip.String()}}},
	}
	e.pods[ns+"/"+name] = p
	if e.c != nil {
		e.c.SetPod(p.obj, p.ifindex)
		e.sync()
	}
	return p
}

func (e *env) setPolicy(np *networkingv1.NetworkPolicy) {
	e.t.Helper()
	if err := e.c.SetPolicy(np); err != nil {
		e.t.Fatal(err)
	}
	e.sync()
}

func (e *env) deletePolicy(ns, name string) {
	e.c.DeletePolicy(ns, name)
	e.sync()
}

func serveTCP(t *testing.T, n *testutil.NetNS, addr string) {
	var l net.Listener
	err := n.Do(func(ns.NetNS) error {
		var err error
		l, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
}

func serveUDP(t *testing.T, n *testutil.NetNS, addr string) {
	var pc net.PacketConn
	err := n.Do(func(ns.NetNS) error {
		var err error
		pc, err = net.ListenPacket("udp", addr)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, a, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], a)
		}
	}()
}

// denied sums every endpoint's drop counters.
func (e *env) denied() uint64 {
	if e.ipt != nil {
		cs, err := e.ipt.Counters()
		if err != nil {
			e.t.Errorf("counters: %v", err)
		}
		sum := cs.Revoked
		for _, d := range cs.Denied {
			sum += d[0] + d[1]
		}
		return sum
	}
	var k uint32
	var v polBPFPolEndpoint
	var sum uint64
	it := e.bpf.objs.WagglePolEndpoints.Iterate()
	for it.Next(&k, &v) {
		sum += v.Denied[0] + v.Denied[1]
	}
	return sum
}

// dialFrom opens a connection from netns n (nil: the node) to addr. It
// returns the connection, or nil once the policy program counted a drop
// (the SYN was dropped: the dial is abandoned, not waited out).
func (e *env) dialFrom(n *testutil.NetNS, network, addr string) net.Conn {
	e.t.Helper()
	before := e.denied()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	type res struct {
		c   net.Conn
		err error
	}
	done := make(chan res, 1)
	target := n
	if target == nil {
		target = e.node
	}
	go func() {
		var c net.Conn
		err := target.Do(func(ns.NetNS) error {
			var d net.Dialer
			var err error
			c, err = d.DialContext(ctx, network, addr)
			if err == nil && network == "udp" {
				// A reply proves the datagram went both ways.
				if _, err = c.Write([]byte("x")); err == nil {
					errc := make(chan error, 1)
					go func() {
						buf := make([]byte, 8)
						_, err := c.Read(buf)
						errc <- err
					}()
					go func() { <-ctx.Done(); c.SetReadDeadline(time.Now()) }()
					err = <-errc
				}
			}
			return err
		})
		done <- res{c, err}
	}()
	tick := time.NewTicker(e.pollEvery())
	defer tick.Stop()
	for {
		select {
		case r := <-done:
			if r.err != nil {
				e.t.Fatalf("dial %s %s: %v", network, addr, r.err)
			}
			return r.c
		case <-tick.C:
			if e.denied() > before {
				cancel()
				if r := <-done; r.err == nil {
					// Allowed after all (a drop elsewhere counted meanwhile).
					return r.c
				}
				return nil
			}
		}
	}
}

// reach reports whether from (nil: the node) reaches to:port over network.
func (e *env) reach(from *tpod, to *tpod, network string, port int) bool {
	e.t.Helper()
	var n *testutil.NetNS
	if from != nil {
		n = from.netns
	}
	c := e.dialFrom(n, network, netip.AddrPortFrom(to.ip, uint16(port)).String())
	if c == nil {
		return false
	}
	defer c.Close()
	if network == "tcp" {
		if _, err := c.Write([]byte("p")); err != nil {
			return false
		}
		buf := make([]byte, 1)
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.ReadFull(c, buf); err != nil {
			return false
		}
	}
	return true
}

// roundTrip checks an open TCP connection still carries data: true when the
// echo came back, false when the policy program counted a drop first.
func (e *env) roundTrip(c net.Conn) bool {
	e.t.Helper()
	before := e.denied()
	errc := make(chan error, 1)
	go func() {
		if _, err := c.Write([]byte("r")); err != nil {
			errc <- err
			return
		}
		buf := make([]byte, 1)
		_, err := io.ReadFull(c, buf)
		errc <- err
	}()
	tick := time.NewTicker(e.pollEvery())
	defer tick.Stop()
	for {
		select {
		case err := <-errc:
			return err == nil
		case <-tick.C:
			if e.denied() > before {
				return false
			}
		}
	}
}

// pollEvery is how often the drop counters are read: the maps cost
// nothing, iptables-save a process.
func (e *env) pollEvery() time.Duration {
	if e.ipt != nil {
		return 20 * time.Millisecond
	}
	return 2 * time.Millisecond
}

// state renders the iptables datapath's rules and sets for a failure
// message (nothing for eBPF: `waggle bpf policy` reads the maps).
func (e *env) state() string {
	if e.ipt == nil {
		return ""
	}
	var b strings.Builder
	b.WriteString("\n" + e.node.Run(e.t, "iptables-save", "-c", "-t", "filter"))
	e.ipt.mu.Lock()
	defer e.ipt.mu.Unlock()
	for name, m := range e.ipt.sets {
		fmt.Fprintf(&b, "set %s:", name)
		for p := range m {
			b.WriteString(" " + p.String())
		}
		b.WriteString("\n")
	}
	return b.String()
}
