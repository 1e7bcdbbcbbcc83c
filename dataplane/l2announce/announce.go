// Package l2announce answers ARP and NDP for the LoadBalancer IPs this node owns,
// so that machines on the node network reach them without BGP: Layer 2
// announcement, as MetalLB's L2 mode and Cilium's L2 announcements do.
//
// Every node whose proxy runs north-south load balancing (--nodeport-devices)
// is a candidate for every LoadBalancer ingress IP it can serve (for
// externalTrafficPolicy Local, only while it has a ready local endpoint). One
// candidate per IP leads, through a coordination.k8s.io Lease named
// waggle-l2-<ip> in kube-system (internal/leaderelect: released on stop, so a
// standby takes over at once; after a node loss, after the lease duration).
// The leader answers ARP requests (IPv4) or neighbour solicitations (IPv6)
// for the IP on the devices with the device's MAC address and announces it
// with a gratuitous ARP or an unsolicited neighbour advertisement (override
// set) when it takes over, so switches and neighbours move to it at once. The
// node does not add the IP to an interface: the north-south tc programs
// translate packets to it.
//
// BGP is not implemented.
package l2announce

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/waggle-io/waggle/internal/leaderelect"
)

// LeasePrefix starts the name of each IP's Lease.
const LeasePrefix = "waggle-l2-"

// LeaseName is the Lease of ip: waggle-l2-10-0-0-5, waggle-l2-fd06-9--50.
// An IPv6 address ending in "::" gets a 0 (a name must end alphanumeric;
// the canonical form never ends in "::0", so names stay distinct).
func LeaseName(ip netip.Addr) string {
	n := LeasePrefix + strings.NewReplacer(".", "-", ":", "-").Replace(ip.Unmap().String())
	if strings.HasSuffix(n, "-") {
		n += "0"
	}
	return n
}

// Config configures an Announcer.
type Config struct {
	Client   kubernetes.Interface
	NodeName string
	// Devices answer ARP and NDP (the north-south devices).
	Devices []string
	// NetNS is the network namespace of Devices (empty: the caller's).
	NetNS string
	// LeaseNamespace (default kube-system) and the lease timings (default
	// leaderelect's 15 s / 10 s / 2 s).
	LeaseNamespace                            string
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	Log                                       *slog.Logger
}

// Announcer runs one election per candidate IP and answers ARP for the IPs
// it leads.
type Announcer struct {
	cfg  Config
	resp responder

	mu      sync.Mutex
	ctx     context.Context
	running map[netip.Addr]context.CancelFunc
	owned   map[netip.Addr]bool
	want    map[netip.Addr]bool
	wg      sync.WaitGroup
}

// responder answers ARP on the devices (arp_linux.go).
type responder interface {
	// announce sends a gratuitous ARP for ip on every device.
	announce(ip netip.Addr) error
	close() error
}

// New opens the ARP responder on the devices; Run starts answering.
func New(cfg Config) (*Announcer, error) {
	if len(cfg.Devices) == 0 {
		return nil, fmt.Errorf("L2 announcement needs at least one device")
	}
	if cfg.NodeName == "" || cfg.Client == nil {
		return nil, fmt.Errorf("L2 announcement needs a node name and an API client")
	}
	if cfg.LeaseNamespace == "" {
		cfg.LeaseNamespace = leaderelect.DefaultLeaseNamespace
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	a := &Announcer{cfg: cfg, running: map[netip.Addr]context.CancelFunc{}, owned: map[netip.Addr]bool{}}
	r, err := newResponder(cfg, a.owns)
	if err != nil {
		return nil, err
	}
	a.resp = r
	return a, nil
}

func (a *Announcer) owns(ip netip.Addr) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.owned[ip]
}

// Owned lists the IPs this node leads now.
func (a *Announcer) Owned() []netip.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []netip.Addr
	for ip := range a.owned {
		out = append(out, ip)
	}
	return out
}

// Run serves until ctx ends, then releases every Lease it holds.
func (a *Announcer) Run(ctx context.Context) error {
	a.mu.Lock()
	a.ctx = ctx
	a.reconcile()
	a.mu.Unlock()
	<-ctx.Done()
	a.mu.Lock()
	for _, cancel := range a.running {
		cancel()
	}
	a.mu.Unlock()
	a.wg.Wait()
	return a.resp.close()
}

// SetCandidates makes this node a candidate for exactly ips (IPv4 and
// IPv6): elections start for new ones, and stop (releasing the Lease) for
// the ones left out (before Run: once it starts).
func (a *Announcer) SetCandidates(ips []netip.Addr) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.want = map[netip.Addr]bool{}
	for _, ip := range ips {
		if ip.IsValid() {
			a.want[ip.Unmap()] = true
		}
	}
	a.reconcile()
}

// reconcile starts and stops elections to match a.want (a.mu held).
func (a *Announcer) reconcile() {
	if a.ctx == nil || a.ctx.Err() != nil {
		return
	}
	want := a.want
	for ip, cancel := range a.running {
		if !want[ip] {
			cancel()
			delete(a.running, ip)
		}
	}
	for ip := range want {
		if _, ok := a.running[ip]; ok {
			continue
		}
		ctx, cancel := context.WithCancel(a.ctx)
		a.running[ip] = cancel
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			a.elect(ctx, ip)
		}()
	}
}

// elect campaigns for ip until ctx ends; a lost lease campaigns again.
func (a *Announcer) elect(ctx context.Context, ip netip.Addr) {
	lc := leaderelect.Config{Enabled: true, LeaseName: LeaseName(ip), LeaseNamespace: a.cfg.LeaseNamespace,
		Identity: a.cfg.NodeName, LeaseDuration: a.cfg.LeaseDuration, RenewDeadline: a.cfg.RenewDeadline,
		RetryPeriod: a.cfg.RetryPeriod}
	if lc.LeaseDuration == 0 {
		lc.LeaseDuration, lc.RenewDeadline, lc.RetryPeriod = leaderelect.DefaultLeaseDuration, leaderelect.DefaultRenewDeadline, leaderelect.DefaultRetryPeriod
	}
	log := a.cfg.Log.With("ip", ip.String())
	for ctx.Err() == nil {
		err := leaderelect.Run(ctx, log, a.cfg.Client, lc, func(lead context.Context) {
			a.mu.Lock()
			a.owned[ip] = true
			a.mu.Unlock()
			how := "ARP"
			if ip.Is6() {
				how = "NDP"
			}
			log.Info("announcing LoadBalancer IP ("+how+")", "devices", strings.Join(a.cfg.Devices, ","))
			if err := a.resp.announce(ip); err != nil {
				log.Warn("announcement failed ("+how+")", "err", err)
			}
			<-lead.Done()
			a.mu.Lock()
			delete(a.owned, ip)
			a.mu.Unlock()
			log.Info("no longer announcing LoadBalancer IP")
		})
		if err != nil && ctx.Err() == nil {
			log.Warn("L2 announcement lease lost; campaigning again", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(lc.RetryPeriod):
			}
		}
	}
}
