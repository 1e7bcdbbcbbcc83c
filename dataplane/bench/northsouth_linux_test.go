package bench

import (
	"context"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/waggle-io/waggle/internal/testutil"
)

// BenchmarkNorthSouth runs RunNorthSouth once (-benchtime 1x), with
// upstream kube-proxy's iptables and nftables proxiers as peers:
// DP_NS_SERVICES (default 1), DP_NS_DURATION (default 1s), DP_NS_ROUNDS (3),
// DP_NS_KUBE_PROXY (iptables,nftables; none), DP_NS_TESTS (TCP_CRR,TCP_RR,
// UDP_RR: the default), DP_NS_XDP (1 or generic: the
// eBPF XDP column, generic XDP on a veth; native: native XDP on a veth whose
// peer runs an XDP_PASS program; generic,native: both), DP_NS_IPV6 (1: the
// direct and eBPF tc paths over IPv6 beside), DP_NS_DSR (1: the eBPF tc
// column in DSR mode, node2 running the programs too).
func BenchmarkNorthSouth(b *testing.B) {
	testutil.RequiresRoot(b)
	testutil.RequiresKernelFeature(b, testutil.BTF)
	cfg := NorthSouthConfig{IPTables: true, Out: os.Stdout, Log: slog.New(slog.NewTextHandler(os.Stderr, nil)),
		Output: os.Getenv("DP_NS_OUTPUT")}
	// DP_NS_KUBE_PROXY=iptables,nftables (default both; "none": no peer).
	peers := "iptables,nftables"
	if s := os.Getenv("DP_NS_KUBE_PROXY"); s != "" {
		peers = s
	}
	for _, m := range strings.Split(peers, ",") {
		if m == "iptables" || m == "nftables" {
			cfg.Peers = append(cfg.Peers, kubeProxyPeer(m))
		}
	}
	if s := os.Getenv("DP_NS_SERVICES"); s != "" {
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(f)
			if err != nil {
				b.Fatal(err)
			}
			cfg.ServiceCounts = append(cfg.ServiceCounts, n)
		}
	}
	tests, err := ParseTests(os.Getenv("DP_NS_TESTS"))
	if err != nil {
		b.Fatalf("DP_NS_TESTS: %v", err)
	}
	cfg.Tests = tests
	for _, m := range strings.Split(os.Getenv("DP_NS_XDP"), ",") {
		switch m {
		case "1", "generic":
			cfg.XDP = true
		case "native":
			cfg.XDPNative = true
		case "":
		default:
			b.Fatalf("DP_NS_XDP=%s: want generic (or 1), native, or generic,native", m)
		}
	}
	cfg.IPv6 = os.Getenv("DP_NS_IPV6") == "1"
	cfg.DSR = os.Getenv("DP_NS_DSR") == "1"
	if d, err := time.ParseDuration(os.Getenv("DP_NS_DURATION")); err == nil {
		cfg.Duration = d
	}
	if n, err := strconv.Atoi(os.Getenv("DP_NS_ROUNDS")); err == nil {
		cfg.Rounds = n
	}
	for range b.N {
		if _, err := RunNorthSouth(context.Background(), cfg); err != nil {
			b.Fatal(err)
		}
	}
}
