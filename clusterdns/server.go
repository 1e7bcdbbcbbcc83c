// Package clusterdns is Waggle's cluster DNS: the Kubernetes DNS-based
// service discovery specification (A/AAAA of Services and of headless
// Services' endpoints, SRV of named ports, PTR, pod A records
// a-b-c-d.<ns>.pod.<zone>, ExternalName as CNAME, dns-version TXT) under a
// configurable cluster domain, answered from Service and EndpointSlice
// informers, with every other name forwarded to the node's resolvers through
// a cache that also keeps negative answers.
//
// It runs inside every node's service proxy (`waggle proxy`, so in `waggle
// up` and in each lab node), listening on the node; the controller-manager
// publishes the kube-dns Service (10.96.0.10 in the default range) with each
// node's server as an endpoint and internalTrafficPolicy Local, so a pod's
// queries reach its own node's server through the dataplane like any
// Service. It is not the resolv.conf writer (the kubelet) nor a general
// recursive resolver.
package clusterdns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sync/singleflight"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// Defaults of Config.
const (
	DefaultClusterDomain = "cluster.local"
	DefaultPort          = 10053
	DefaultTTL           = 5 * time.Second
	DefaultCacheTTL      = 30 * time.Second
	DefaultCacheSize     = 10000
)

// Config is the cluster DNS server's configuration.
type Config struct {
	// Kubeconfig reaches the API server (empty: in-cluster); Client, when
	// set, is used instead.
	Kubeconfig string
	Client     kubernetes.Interface
	// ListenAddress is host:port of the UDP and TCP listeners (default
	// ":10053").
	ListenAddress string
	// ClusterDomain is the zone answered from the API (default cluster.local).
	ClusterDomain string
	// Upstreams are the resolvers (host:port) for names outside the zone;
	// empty reads them from ResolvConf.
	Upstreams []string
	// ResolvConf is the node's resolver configuration (default
	// /etc/resolv.conf; systemd-resolved's stub is replaced by the real
	// upstreams of /run/systemd/resolve/resolv.conf, as the kubelet does).
	ResolvConf string
	// TTL of the zone's records (default 5 s, CoreDNS kubernetes' default).
	TTL time.Duration
	// CacheTTL caps how long forwarded answers, positive and negative, are
	// kept (default 30 s, as kubeadm's Corefile `cache 30`); CacheSize caps
	// the entries (default 10000).
	CacheTTL  time.Duration
	CacheSize int
	Log       *slog.Logger
}

// WithDefaults fills unset fields.
func (c Config) WithDefaults() Config {
	if c.ListenAddress == "" {
		c.ListenAddress = fmt.Sprintf(":%d", DefaultPort)
	}
	if c.ClusterDomain == "" {
		c.ClusterDomain = DefaultClusterDomain
	}
	if c.ResolvConf == "" {
		c.ResolvConf = "/etc/resolv.conf"
	}
	if c.TTL <= 0 {
		c.TTL = DefaultTTL
	}
	if c.CacheTTL <= 0 {
		c.CacheTTL = DefaultCacheTTL
	}
	if c.CacheSize <= 0 {
		c.CacheSize = DefaultCacheSize
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

// Server answers DNS queries.
type Server struct {
	cfg       Config
	zone      *zone
	upstreams []string
	cache     *msgCache
	flight    singleflight.Group
	udp, tcp  *dns.Client
	synced    func() bool
}

// New builds a server on factory's Service and EndpointSlice informers
// (indexers are added here: call before factory.Start).
func New(cfg Config, factory informers.SharedInformerFactory) (*Server, error) {
	cfg = cfg.WithDefaults()
	svcInf := factory.Core().V1().Services().Informer()
	esInf := factory.Discovery().V1().EndpointSlices().Informer()
	if err := svcInf.AddIndexers(serviceIndexers()); err != nil {
		return nil, err
	}
	if err := esInf.AddIndexers(sliceIndexers()); err != nil {
		return nil, err
	}
	up := cfg.Upstreams
	if len(up) == 0 {
		var err error
		if up, err = UpstreamsFromResolvConf(cfg.ResolvConf); err != nil {
			cfg.Log.Warn("no upstream resolvers: names outside the cluster will fail", "err", err)
		}
	}
	s := &Server{
		cfg:       cfg,
		zone:      &zone{origin: dns.Fqdn(strings.ToLower(cfg.ClusterDomain)), ttl: uint32(cfg.TTL / time.Second), svcs: svcInf.GetIndexer(), slices: esInf.GetIndexer()},
		upstreams: up,
		cache:     newMsgCache(cfg.CacheSize, cfg.CacheTTL),
		udp:       &dns.Client{Net: "udp", Timeout: 2 * time.Second},
		tcp:       &dns.Client{Net: "tcp", Timeout: 2 * time.Second},
		synced:    func() bool { return svcInf.HasSynced() && esInf.HasSynced() },
	}
	return s, nil
}

// Upstreams returns the resolvers forwarded to.
func (s *Server) Upstreams() []string { return s.upstreams }

// UpstreamsFromResolvConf reads nameservers (as host:port) from path; a
// systemd-resolved stub (127.0.0.53) is replaced by the upstreams in
// /run/systemd/resolve/resolv.conf, since a forwarder in another network
// namespace could not reach it and a loop through it gains nothing.
func UpstreamsFromResolvConf(path string) ([]string, error) {
	cc, err := dns.ClientConfigFromFile(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range cc.Servers {
		if s == "127.0.0.53" && path != "/run/systemd/resolve/resolv.conf" {
			if real, err := UpstreamsFromResolvConf("/run/systemd/resolve/resolv.conf"); err == nil && len(real) > 0 {
				out = append(out, real...)
				continue
			}
		}
		out = append(out, net.JoinHostPort(s, cc.Port))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s lists no nameserver", path)
	}
	return out, nil
}

// ServeDNS implements dns.Handler.
func (s *Server) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	resp := s.Answer(context.Background(), req)
	size := dns.MinMsgSize
	if o := req.IsEdns0(); o != nil {
		size = int(o.UDPSize())
	}
	if _, tcp := w.RemoteAddr().(*net.TCPAddr); tcp {
		size = dns.MaxMsgSize
	}
	resp.Truncate(size)
	_ = w.WriteMsg(resp)
}

// Answer answers one query message.
func (s *Server) Answer(ctx context.Context, req *dns.Msg) *dns.Msg {
	m := new(dns.Msg)
	m.SetReply(req)
	if len(req.Question) != 1 || req.Opcode != dns.OpcodeQuery {
		m.SetRcode(req, dns.RcodeNotImplemented)
		return m
	}
	if o := req.IsEdns0(); o != nil {
		m.SetEdns0(o.UDPSize(), o.Do())
	}
	q := req.Question[0]
	qname := strings.ToLower(dns.Fqdn(q.Name))
	if s.inZone(qname) {
		if !s.synced() {
			m.SetRcode(req, dns.RcodeServerFailure)
			return m
		}
		s.fill(ctx, m, s.zone.lookup(qname, q.Qtype), q.Qtype, 0)
		return m
	}
	if q.Qtype == dns.TypePTR {
		if ip, ok := parseReverse(qname); ok && s.synced() {
			if r, ok := s.zone.reverse(q.Name, ip); ok {
				m.Authoritative = true
				m.Answer = r.answer
				return m
			}
		}
	}
	return s.forward(ctx, req)
}

func (s *Server) inZone(qname string) bool {
	o := s.zone.origin
	return qname == o || strings.HasSuffix(qname, "."+o)
}

// fill writes the zone's result into m, chasing an ExternalName's target
// (in the zone or upstream) for address queries.
func (s *Server) fill(ctx context.Context, m *dns.Msg, r result, qtype uint16, depth int) {
	m.Authoritative = true
	m.Rcode = r.rcode
	m.Answer = append(m.Answer, r.answer...)
	m.Extra = append(m.Extra, r.extra...)
	if r.rcode == dns.RcodeNameError || (len(r.answer) == 0) {
		m.Ns = []dns.RR{s.zone.soa()}
		return
	}
	if r.chase == "" || depth > 8 {
		return
	}
	if s.inZone(r.chase) {
		s.fill(ctx, m, s.zone.lookup(r.chase, qtype), qtype, depth+1)
		m.Rcode = dns.RcodeSuccess
		m.Ns = nil
		return
	}
	q := new(dns.Msg)
	q.SetQuestion(r.chase, qtype)
	q.RecursionDesired = true
	if up := s.forward(ctx, q); up.Rcode == dns.RcodeSuccess {
		m.Answer = append(m.Answer, up.Answer...)
	}
}

var errNoUpstream = errors.New("no upstream resolver")

// forward answers req from the cache or the upstreams; failures are SERVFAIL.
func (s *Server) forward(ctx context.Context, req *dns.Msg) *dns.Msg {
	q := req.Question[0]
	key := cacheKey(q, req.IsEdns0() != nil && req.IsEdns0().Do())
	if m := s.cache.get(key); m != nil {
		m.Id = req.Id
		return m
	}
	v, err, _ := s.flight.Do(key, func() (any, error) {
		m, err := s.exchange(ctx, req)
		if err != nil {
			return nil, err
		}
		s.cache.put(key, m)
		return m, nil
	})
	if err != nil {
		s.cfg.Log.Debug("forward", "name", q.Name, "err", err)
		m := new(dns.Msg)
		m.SetRcode(req, dns.RcodeServerFailure)
		return m
	}
	m := v.(*dns.Msg).Copy()
	m.Id = req.Id
	return m
}

func (s *Server) exchange(ctx context.Context, req *dns.Msg) (*dns.Msg, error) {
	if len(s.upstreams) == 0 {
		return nil, errNoUpstream
	}
	out := req.Copy()
	out.Id = dns.Id()
	var errs []error
	for _, up := range s.upstreams {
		m, _, err := s.udp.ExchangeContext(ctx, out, up)
		if err == nil && m.Truncated {
			m, _, err = s.tcp.ExchangeContext(ctx, out, up)
		}
		if err == nil {
			return m, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", up, err))
	}
	return nil, errors.Join(errs...)
}

// Serve answers on UDP and TCP at the configured address until ctx ends;
// ready, when non-nil, receives the bound UDP address once both listen.
func (s *Server) Serve(ctx context.Context, ready func(net.Addr)) error {
	pc, err := net.ListenPacket("udp", s.cfg.ListenAddress)
	if err != nil {
		return fmt.Errorf("cluster DNS: listen udp %s: %w", s.cfg.ListenAddress, err)
	}
	tcpAddr := s.cfg.ListenAddress
	if u := pc.LocalAddr().(*net.UDPAddr); u.Port != 0 {
		h, _, _ := net.SplitHostPort(s.cfg.ListenAddress)
		tcpAddr = net.JoinHostPort(h, fmt.Sprint(u.Port))
	}
	l, err := net.Listen("tcp", tcpAddr)
	if err != nil {
		pc.Close()
		return fmt.Errorf("cluster DNS: listen tcp %s: %w", tcpAddr, err)
	}
	udpSrv := &dns.Server{PacketConn: pc, Handler: s}
	tcpSrv := &dns.Server{Listener: l, Handler: s}
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	for _, srv := range []*dns.Server{udpSrv, tcpSrv} {
		wg.Add(1)
		go func() { defer wg.Done(); errc <- srv.ActivateAndServe() }()
	}
	s.cfg.Log.Info("cluster DNS serving", "address", pc.LocalAddr().String(), "domain", s.cfg.ClusterDomain, "upstreams", s.upstreams)
	if ready != nil {
		ready(pc.LocalAddr())
	}
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	_ = udpSrv.Shutdown()
	_ = tcpSrv.Shutdown()
	wg.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// ServiceIP is the conventional cluster DNS ClusterIP of a Service range:
// its tenth address (10.96.0.10 for 10.96.0.0/12), as kubeadm picks.
func ServiceIP(serviceCIDR netip.Prefix) netip.Addr {
	a := serviceCIDR.Masked().Addr()
	for i := 0; i < 10; i++ {
		a = a.Next()
	}
	return a
}

// Run serves cluster DNS until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	client := cfg.Client
	if client == nil {
		var rc *rest.Config
		var err error
		if cfg.Kubeconfig == "" {
			rc, err = rest.InClusterConfig()
		} else {
			rc, err = clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
		}
		if err != nil {
			return fmt.Errorf("cluster DNS: client config: %w", err)
		}
		rc.UserAgent = "waggle-cluster-dns"
		if client, err = kubernetes.NewForConfig(rc); err != nil {
			return err
		}
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	s, err := New(cfg, factory)
	if err != nil {
		return err
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), s.synced) {
		return nil
	}
	return s.Serve(ctx, nil)
}
