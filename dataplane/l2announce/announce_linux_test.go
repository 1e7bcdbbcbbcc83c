package l2announce

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
)

func netnsFor(t *testing.T, role string) string { return netnsNamed(t, "ns-l2", role) }

func netnsNamed(t *testing.T, prefix, role string) string {
	t.Helper()
	var b [3]byte
	rand.Read(b[:])
	name := prefix + role + hex.EncodeToString(b[:])
	run(t, "ip", "netns", "add", name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	run(t, "ip", "netns", "exec", name, "ip", "link", "set", "lo", "up")
	return name
}

func run(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func in(t *testing.T, n string, args ...string) string {
	return run(t, append([]string{"ip", "netns", "exec", n}, args...)...)
}

func mac(t *testing.T, n, dev string) string {
	var hw string
	err := ns.WithNetNSPath(filepath.Join("/run/netns", n), func(ns.NetNS) error {
		ifc, err := net.InterfaceByName(dev)
		if err == nil {
			hw = ifc.HardwareAddr.String()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return hw
}

// The leader of an IP's Lease answers ARP for it; when it stops, the other
// node takes the Lease over and its gratuitous ARP moves the client's
// neighbour entry to it.
func TestOneNodeAnswersARPAndAnotherTakesOver(t *testing.T) {
	takeover(t, "ns-l2", func(i int) string { return fmt.Sprintf("10.27.20.%d/24", i) }, netip.MustParseAddr("10.27.20.50"))
}

// The same for an IPv6 LoadBalancer IP: neighbour solicitations answered by
// the leader, an unsolicited neighbour advertisement on takeover.
func TestOneNodeAnswersNDPAndAnotherTakesOver(t *testing.T) {
	takeover(t, "ns6-l2", func(i int) string { return fmt.Sprintf("fd06:20::%d/64", i) }, netip.MustParseAddr("fd06:20::50"))
}

func takeover(t *testing.T, prefix string, addr func(i int) string, ip netip.Addr) {
	testutil.RequiresRoot(t)
	srv := apiservertest.Start(t, apiservertest.Options{})
	cs, err := kubernetes.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	wire, client := netnsNamed(t, prefix, "w"), netnsNamed(t, prefix, "c")
	nodes := []string{netnsNamed(t, prefix, "a"), netnsNamed(t, prefix, "b")}
	in(t, wire, "ip", "link", "add", "br0", "type", "bridge")
	in(t, wire, "ip", "link", "set", "br0", "up")
	for i, n := range append([]string{client}, nodes...) {
		port := fmt.Sprintf("p%d", i)
		in(t, wire, "ip", "link", "add", port, "type", "veth", "peer", "name", "tmp"+port)
		in(t, wire, "ip", "link", "set", "tmp"+port, "netns", n)
		in(t, n, "ip", "link", "set", "tmp"+port, "name", "eth0")
		in(t, wire, "ip", "link", "set", port, "master", "br0", "up")
		in(t, n, "ip", "addr", "add", addr(i+1), "dev", "eth0", "nodad")
		in(t, n, "ip", "link", "set", "eth0", "up")
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	var anns []*Announcer
	var stops []context.CancelFunc
	for i, n := range nodes {
		a, err := New(Config{Client: cs, NodeName: fmt.Sprintf("node-%d", i), Devices: []string{"eth0"},
			NetNS: filepath.Join("/run/netns", n), LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second,
			RetryPeriod: 500 * time.Millisecond, Log: log.With("node", i)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { a.Run(ctx); close(done) }()
		stop := func() { cancel(); <-done }
		t.Cleanup(stop)
		testutil.Eventually(t, 10*time.Second, func() error {
			a.mu.Lock()
			defer a.mu.Unlock()
			if a.ctx == nil {
				return fmt.Errorf("not running")
			}
			return nil
		})
		a.SetCandidates([]netip.Addr{ip})
		anns, stops = append(anns, a), append(stops, stop)
	}
	leader := -1
	testutil.Eventually(t, 30*time.Second, func() error {
		n := 0
		for i, a := range anns {
			if len(a.Owned()) == 1 {
				leader, n = i, n+1
			}
		}
		if n != 1 {
			return fmt.Errorf("%d nodes own %s", n, ip)
		}
		return nil
	})
	neigh := func() string {
		// A datagram makes the client's kernel resolve the IP.
		ns.WithNetNSPath(filepath.Join("/run/netns", client), func(ns.NetNS) error {
			c, err := net.Dial("udp", netip.AddrPortFrom(ip, 9).String())
			if err == nil {
				c.Write([]byte("x"))
				c.Close()
			}
			return nil
		})
		return in(t, client, "ip", "neigh", "show", ip.String())
	}
	want := mac(t, nodes[leader], "eth0")
	testutil.Eventually(t, 30*time.Second, func() error {
		if got := neigh(); !strings.Contains(got, want) {
			return fmt.Errorf("client's neighbour entry %q, want lladdr %s (node %d)", strings.TrimSpace(got), want, leader)
		}
		return nil
	})
	// The leader stops (releasing its Lease): the other node takes over
	// and announces itself.
	stops[leader]()
	other := 1 - leader
	testutil.Eventually(t, 30*time.Second, func() error {
		if len(anns[other].Owned()) != 1 {
			return fmt.Errorf("node %d does not own %s yet", other, ip)
		}
		return nil
	})
	want = mac(t, nodes[other], "eth0")
	testutil.Eventually(t, 30*time.Second, func() error {
		if got := in(t, client, "ip", "neigh", "show", ip.String()); !strings.Contains(got, want) {
			return fmt.Errorf("after failover: %q, want lladdr %s", strings.TrimSpace(got), want)
		}
		return nil
	})
	// The Lease names the new holder.
	l, err := cs.CoordinationV1().Leases("kube-system").Get(context.Background(), LeaseName(ip), metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != fmt.Sprintf("node-%d", other) {
		t.Fatalf("lease %s: %+v, %v", LeaseName(ip), l.Spec, err)
	}
}
