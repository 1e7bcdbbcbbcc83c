package ebpf

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/waggle-io/waggle/dataplane"
	"github.com/waggle-io/waggle/internal/testutil"
)

// env is one end-to-end fixture: a fresh cgroup with the programs attached,
// a fresh network namespace with backends on loopback addresses, and this
// test process moved into the cgroup so its sockets are load-balanced.
type env struct {
	t      testing.TB
	ns     *testutil.NetNS
	cgroup string
	cfg    Config
	b      *Backend
}

const testPinRoot = "/sys/fs/bpf/waggle-test"

func newEnv(t testing.TB, tweak ...func(*Config)) *env {
	t.Helper()
	testutil.RequiresKernelFeature(t, testutil.CgroupSockAddr)
	testutil.RequiresKernelFeature(t, testutil.BTF)
	cg := testutil.NewCgroup(t)
	n := testutil.NewNetNS(t)
	node := testutil.UniqueName("node")
	cfg := Config{NodeName: node, CgroupPath: cg, PinDir: filepath.Join(testPinRoot, node),
		MaxServices: 1 << 16, MaxBackends: 1 << 14, MaxAffinity: 1024, MaxReverseSockets: 1 << 14,
		Log: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	for _, f := range tweak {
		f(&cfg)
	}
	t.Cleanup(func() {
		if err := CleanupPinned(cfg.PinDir); err != nil {
			t.Errorf("cleanup pinned state: %v", err)
		}
		os.Remove(testPinRoot)
	})
	b, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	testutil.EnterCgroup(t, cg)
	return &env{t: t, ns: n, cgroup: cg, cfg: cfg, b: b}
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// addAddrs puts addresses on the namespace's loopback and waits until the
// namespace routes them to itself (for IPv6 the kernel adds that route after
// `ip addr add` returns, nodad or not: see testutil.WaitLocalAddrs).
func (e *env) addAddrs(addrs ...netip.Addr) {
	e.t.Helper()
	for _, a := range addrs {
		bits := 32
		if a.Is6() {
			bits = 128
		}
		e.ns.Run(e.t, "ip", "addr", "add", fmt.Sprintf("%s/%d", a, bits), "dev", "lo", "nodad")
	}
	e.ns.WaitLocalAddrs(e.t, addrs...)
}

// in runs fn in the test namespace (on a locked OS thread).
func (e *env) in(fn func() error) error {
	return e.ns.Do(func(ns.NetNS) error { return fn() })
}

// serveTCP starts a TCP server on addr in the namespace: on each
// connection it writes its own address and a newline, then echoes.
func (e *env) serveTCP(addr netip.AddrPort) {
	e.t.Helper()
	var ln net.Listener
	if err := e.in(func() (err error) { ln, err = net.Listen("tcp", addr.String()); return }); err != nil {
		e.t.Fatalf("listen %s: %v", addr, err)
	}
	e.t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				fmt.Fprintf(c, "%s\n", addr)
				io.Copy(c, c)
			}()
		}
	}()
}

// serveUDP starts a UDP server on addr in the namespace answering every
// datagram with its own address.
func (e *env) serveUDP(addr netip.AddrPort) {
	e.t.Helper()
	var pc net.PacketConn
	if err := e.in(func() (err error) { pc, err = net.ListenPacket("udp", addr.String()); return }); err != nil {
		e.t.Fatalf("listen udp %s: %v", addr, err)
	}
	e.t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo([]byte(addr.String()), from)
		}
	}()
}

// dialTCP connects to addr from inside the namespace (and the cgroup) and
// returns the connection and the backend that answered.
func (e *env) dialTCP(addr netip.AddrPort) (net.Conn, string, error) {
	var c net.Conn
	err := e.in(func() (err error) {
		c, err = net.DialTimeout("tcp", addr.String(), 2*time.Second)
		return
	})
	if err != nil {
		return nil, "", err
	}
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		c.Close()
		return nil, "", fmt.Errorf("read backend name: %w", err)
	}
	c.SetReadDeadline(time.Time{})
	return c, strings.TrimSpace(line), nil
}

// whoTCP connects, reads the backend's name and closes.
func (e *env) whoTCP(addr netip.AddrPort) (string, error) {
	c, who, err := e.dialTCP(addr)
	if err != nil {
		return "", err
	}
	c.Close()
	return who, nil
}

// whoUDP sends one datagram through a fresh connected UDP socket and
// returns the reply and the address it came from (as recvmsg shows it).
func (e *env) whoUDP(addr netip.AddrPort, connected bool) (who string, from netip.AddrPort, err error) {
	var c *net.UDPConn
	err = e.in(func() (err error) {
		if connected {
			c, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(addr))
		} else {
			c, err = net.ListenUDP("udp", nil)
		}
		return
	})
	if err != nil {
		return "", from, err
	}
	defer c.Close()
	if connected {
		_, err = c.Write([]byte("ping"))
	} else {
		_, err = c.WriteToUDPAddrPort([]byte("ping"), addr)
	}
	if err != nil {
		return "", from, err
	}
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 256)
	n, from, err := c.ReadFromUDPAddrPort(buf)
	if err != nil {
		return "", from, err
	}
	return string(buf[:n]), netip.AddrPortFrom(from.Addr().Unmap(), from.Port()), nil
}

func (e *env) sync(st *dataplane.State) {
	e.t.Helper()
	if err := e.b.Sync(context.Background(), st); err != nil {
		e.t.Fatalf("Sync: %v", err)
	}
	// Sockets of removed backends are terminated off the sync path.
	if err := e.b.WaitSocketsTerminated(context.Background()); err != nil {
		e.t.Fatal(err)
	}
}

// errno extracts the syscall errno from a network error.
func errno(err error) syscall.Errno {
	var en syscall.Errno
	if errors.As(err, &en) {
		return en
	}
	return 0
}

// helper is a client process living in the test's namespace and cgroup
// (re-executed test binary), for behaviour that the kernel ties to a
// process's own namespace, such as the sockets the backend destroys.
type helper struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
	mu  sync.Mutex
}

const helperEnv = "WAGGLE_EBPF_TEST_HELPER"

func (e *env) startHelper() *helper {
	e.t.Helper()
	cmd := exec.Command("ip", "netns", "exec", e.ns.Name, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=udp")
	cmd.Stderr = testWriter{e.t}
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		e.t.Fatalf("start helper: %v", err)
	}
	e.t.Cleanup(func() {
		in.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	if err := os.WriteFile(filepath.Join(e.cgroup, "cgroup.procs"), []byte(fmt.Sprint(cmd.Process.Pid)), 0o644); err != nil {
		e.t.Fatalf("move helper into cgroup: %v", err)
	}
	return &helper{cmd: cmd, in: in, out: bufio.NewReader(out)}
}

// do sends a command and returns the helper's answer lines (up to "end").
func (h *helper) do(t *testing.T, cmd string) []string {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	fmt.Fprintln(h.in, cmd)
	var lines []string
	for {
		l, err := h.out.ReadString('\n')
		if err != nil {
			t.Fatalf("helper %q: %v (got %q)", cmd, err, lines)
		}
		l = strings.TrimSpace(l)
		if l == "end" {
			return lines
		}
		lines = append(lines, l)
	}
}

// runHelper is the helper process: "dial ADDR N" opens N connected UDP
// sockets to ADDR and prints "ok I BACKEND" per socket; "poll" sends on
// every socket again and prints "ok I BACKEND" or "err I ERRNO".
func runHelper() {
	var conns []*net.UDPConn
	sc := bufio.NewScanner(os.Stdin)
	ping := func(i int, c *net.UDPConn) {
		if _, err := c.Write([]byte("ping")); err != nil {
			fmt.Printf("err %d %s\n", i, errnoName(err))
			return
		}
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 256)
		n, err := c.Read(buf)
		if err != nil {
			fmt.Printf("err %d %s\n", i, errnoName(err))
			return
		}
		fmt.Printf("ok %d %s\n", i, buf[:n])
	}
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 3 && f[0] == "dial":
			var n int
			fmt.Sscan(f[2], &n)
			for range n {
				c, err := net.Dial("udp", f[1])
				if err != nil {
					fmt.Printf("err %d %s\n", len(conns), errnoName(err))
					continue
				}
				conns = append(conns, c.(*net.UDPConn))
				ping(len(conns)-1, conns[len(conns)-1])
			}
		case len(f) == 1 && f[0] == "poll":
			// A destroyed socket reports its error on the next receive;
			// a live one has nothing to read and then answers a ping.
			for i, c := range conns {
				c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
				if _, err := c.Read(make([]byte, 16)); err != nil && errnoName(err) != "timeout" {
					fmt.Printf("err %d %s\n", i, errnoName(err))
					continue
				}
				ping(i, c)
			}
		}
		fmt.Println("end")
	}
}

func errnoName(err error) string {
	if en := errno(err); en != 0 {
		return fmt.Sprintf("errno=%d", int(en))
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout"
	}
	return strings.ReplaceAll(err.Error(), " ", "_")
}

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "udp" {
		runHelper()
		return
	}
	os.Exit(m.Run())
}
