package clusterdns

import (
	"context"
	"net"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

func svc(ns, name string, mut func(*v1.Service)) *v1.Service {
	s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP}}
	mut(s)
	return s
}

func slice(ns, svcName, name string, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: svcName}},
		AddressType: discoveryv1.AddressTypeIPv4, Ports: ports, Endpoints: eps}
}

// upstream is a resolver for names outside the cluster that counts queries.
type upstream struct {
	addr    string
	queries atomic.Int32
}

func startUpstream(t testing.TB) *upstream {
	u := &upstream{}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = pc.LocalAddr().String()
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		u.queries.Add(1)
		m := new(dns.Msg)
		m.SetReply(r)
		switch q := r.Question[0]; {
		case q.Name == "example.org." && q.Qtype == dns.TypeA:
			m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: net.ParseIP("93.184.215.14")}}
		case q.Name == "5.5.168.192.in-addr.arpa.":
			m.Answer = []dns.RR{&dns.PTR{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypePTR, Class: dns.ClassINET, Ttl: 300}, Ptr: "router.lan."}}
		default:
			m.Rcode = dns.RcodeNameError
			m.Ns = []dns.RR{&dns.SOA{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: 60}, Ns: "a.root.", Mbox: "x.root.", Minttl: 60}}
		}
		_ = w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return u
}

type testDNS struct {
	addr string
	up   *upstream
	s    *Server
}

func startServer(t testing.TB, domain string, objs ...runtime.Object) *testDNS {
	t.Helper()
	up := startUpstream(t)
	cs := fake.NewSimpleClientset(objs...)
	f := informers.NewSharedInformerFactory(cs, 0)
	s, err := New(Config{ListenAddress: "127.0.0.1:0", ClusterDomain: domain, Upstreams: []string{up.addr}}, f)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), s.synced) {
		t.Fatal("informers did not sync")
	}
	addrc := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, func(a net.Addr) { addrc <- a }) }()
	td := &testDNS{up: up, s: s}
	select {
	case a := <-addrc:
		td.addr = a.String()
	case err := <-done:
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		f.Shutdown()
	})
	return td
}

func (d *testDNS) query(t *testing.T, name string, qtype uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	r, _, err := (&dns.Client{Timeout: 5 * time.Second}).Exchange(m, d.addr)
	if err != nil {
		t.Fatalf("query %s %s: %v", name, dns.TypeToString[qtype], err)
	}
	return r
}

// values renders an answer section as sorted "TYPE value" strings.
func values(rrs []dns.RR) []string {
	var out []string
	for _, rr := range rrs {
		parts := strings.Fields(rr.String())
		out = append(out, dns.TypeToString[rr.Header().Rrtype]+" "+strings.Join(parts[4:], " "))
	}
	sort.Strings(out)
	return out
}

func fixtures() []runtime.Object {
	web := svc("prod", "web", func(s *v1.Service) {
		s.Spec.ClusterIP, s.Spec.ClusterIPs = "10.96.0.20", []string{"10.96.0.20", "fd00::20"}
		s.Spec.Ports = []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}, {Name: "dns", Port: 53, Protocol: v1.ProtocolUDP}}
	})
	db := svc("prod", "db", func(s *v1.Service) {
		s.Spec.ClusterIP, s.Spec.ClusterIPs = v1.ClusterIPNone, []string{v1.ClusterIPNone}
		s.Spec.Ports = []v1.ServicePort{{Name: "pg", Port: 5432}}
	})
	ext := svc("prod", "ext", func(s *v1.Service) {
		s.Spec.Type, s.Spec.ExternalName = v1.ServiceTypeExternalName, "example.org"
	})
	alias := svc("prod", "alias", func(s *v1.Service) {
		s.Spec.Type, s.Spec.ExternalName = v1.ServiceTypeExternalName, "web.prod.svc.cluster.local"
	})
	pg := []discoveryv1.EndpointPort{{Name: ptr.To("pg"), Port: ptr.To[int32](5432), Protocol: ptr.To(v1.ProtocolTCP)}}
	dbSlice := slice("prod", "db", "db-abc", pg,
		discoveryv1.Endpoint{Addresses: []string{"10.244.1.5"}, Hostname: ptr.To("db-0"), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
		discoveryv1.Endpoint{Addresses: []string{"10.244.2.6"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
		discoveryv1.Endpoint{Addresses: []string{"10.244.3.7"}, Hostname: ptr.To("db-2"), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(false)}},
	)
	return []runtime.Object{web, db, ext, alias, dbSlice}
}

func TestServiceDiscoverySpec(t *testing.T) {
	d := startServer(t, "cluster.local", fixtures()...)
	for _, tc := range []struct {
		name  string
		qtype uint16
		rcode int
		want  []string
	}{
		{"web.prod.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"A 10.96.0.20"}},
		{"WEB.Prod.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"A 10.96.0.20"}},
		{"web.prod.svc.cluster.local.", dns.TypeAAAA, dns.RcodeSuccess, []string{"AAAA fd00::20"}},
		{"web.prod.svc.cluster.local.", dns.TypeTXT, dns.RcodeSuccess, nil},
		{"_http._tcp.web.prod.svc.cluster.local.", dns.TypeSRV, dns.RcodeSuccess,
			[]string{"SRV 0 50 80 web.prod.svc.cluster.local.", "SRV 0 50 80 web.prod.svc.cluster.local."}},
		{"_dns._udp.web.prod.svc.cluster.local.", dns.TypeSRV, dns.RcodeSuccess,
			[]string{"SRV 0 50 53 web.prod.svc.cluster.local.", "SRV 0 50 53 web.prod.svc.cluster.local."}},
		{"_http._udp.web.prod.svc.cluster.local.", dns.TypeSRV, dns.RcodeNameError, nil},
		{"db.prod.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"A 10.244.1.5", "A 10.244.2.6"}},
		{"db-0.db.prod.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"A 10.244.1.5"}},
		{"10-244-2-6.db.prod.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"A 10.244.2.6"}},
		{"db-2.db.prod.svc.cluster.local.", dns.TypeA, dns.RcodeNameError, nil},
		{"_pg._tcp.db.prod.svc.cluster.local.", dns.TypeSRV, dns.RcodeSuccess,
			[]string{"SRV 0 50 5432 10-244-2-6.db.prod.svc.cluster.local.", "SRV 0 50 5432 db-0.db.prod.svc.cluster.local."}},
		{"ext.prod.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"A 93.184.215.14", "CNAME example.org."}},
		{"alias.prod.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"A 10.96.0.20", "CNAME web.prod.svc.cluster.local."}},
		{"10-244-9-9.prod.pod.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"A 10.244.9.9"}},
		{"nope.prod.svc.cluster.local.", dns.TypeA, dns.RcodeNameError, nil},
		{"web.other.svc.cluster.local.", dns.TypeA, dns.RcodeNameError, nil},
		{"prod.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, nil},
		{"dns-version.cluster.local.", dns.TypeTXT, dns.RcodeSuccess, []string{`TXT "1.1.0"`}},
		{"20.0.96.10.in-addr.arpa.", dns.TypePTR, dns.RcodeSuccess, []string{"PTR web.prod.svc.cluster.local."}},
		{"5.1.244.10.in-addr.arpa.", dns.TypePTR, dns.RcodeSuccess, []string{"PTR db-0.db.prod.svc.cluster.local."}},
		{"0.2.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.d.f.ip6.arpa.", dns.TypePTR, dns.RcodeSuccess, []string{"PTR web.prod.svc.cluster.local."}},
		{"5.5.168.192.in-addr.arpa.", dns.TypePTR, dns.RcodeSuccess, []string{"PTR router.lan."}},
		{"example.org.", dns.TypeA, dns.RcodeSuccess, []string{"A 93.184.215.14"}},
		{"missing.example.", dns.TypeA, dns.RcodeNameError, nil},
	} {
		t.Run(tc.name+"/"+dns.TypeToString[tc.qtype], func(t *testing.T) {
			r := d.query(t, tc.name, tc.qtype)
			if r.Rcode != tc.rcode {
				t.Fatalf("rcode %s, want %s\n%v", dns.RcodeToString[r.Rcode], dns.RcodeToString[tc.rcode], r)
			}
			if got := values(r.Answer); strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Errorf("answer %q, want %q", got, tc.want)
			}
			if strings.HasSuffix(tc.name, "cluster.local.") && len(r.Answer) == 0 && (len(r.Ns) != 1 || r.Ns[0].Header().Rrtype != dns.TypeSOA) {
				t.Errorf("negative answer without SOA: %v", r.Ns)
			}
		})
	}
	// SRV answers carry their targets' addresses.
	r := d.query(t, "_pg._tcp.db.prod.svc.cluster.local.", dns.TypeSRV)
	if got := values(r.Extra); strings.Join(got, "|") != "A 10.244.1.5|A 10.244.2.6" {
		t.Errorf("SRV additional %q", got)
	}
}

func TestClusterDomainIsConfigurable(t *testing.T) {
	d := startServer(t, "corp.internal", fixtures()...)
	if r := d.query(t, "web.prod.svc.corp.internal.", dns.TypeA); len(r.Answer) != 1 {
		t.Errorf("web.prod.svc.corp.internal: %v", r)
	}
	// cluster.local is now an outside name: it goes upstream.
	before := d.up.queries.Load()
	if r := d.query(t, "web.prod.svc.cluster.local.", dns.TypeA); r.Rcode != dns.RcodeNameError || d.up.queries.Load() != before+1 {
		t.Errorf("cluster.local under another domain: rcode %d, upstream queries %d→%d", r.Rcode, before, d.up.queries.Load())
	}
}

func TestForwardedAnswersAreCachedPositiveAndNegative(t *testing.T) {
	d := startServer(t, "cluster.local")
	for i := 0; i < 3; i++ {
		if r := d.query(t, "example.org.", dns.TypeA); len(r.Answer) != 1 {
			t.Fatalf("example.org: %v", r)
		}
		if r := d.query(t, "missing.example.", dns.TypeA); r.Rcode != dns.RcodeNameError {
			t.Fatalf("missing.example: %v", r)
		}
	}
	if n := d.up.queries.Load(); n != 2 {
		t.Errorf("upstream saw %d queries for 2 names asked 3 times each, want 2", n)
	}
	// Expiry: with the clock moved past the cap, the upstream is asked again.
	d.s.cache.mu.Lock()
	d.s.cache.now = func() time.Time { return time.Now().Add(DefaultCacheTTL + time.Second) }
	d.s.cache.mu.Unlock()
	d.query(t, "example.org.", dns.TypeA)
	if n := d.up.queries.Load(); n != 3 {
		t.Errorf("after expiry upstream saw %d queries, want 3", n)
	}
}

func TestUpstreamsFromResolvConf(t *testing.T) {
	p := t.TempDir() + "/resolv.conf"
	if err := writeFile(p, "search example\nnameserver 192.0.2.1\nnameserver 2001:db8::1\noptions ndots:2\n"); err != nil {
		t.Fatal(err)
	}
	got, err := UpstreamsFromResolvConf(p)
	if err != nil || strings.Join(got, ",") != "192.0.2.1:53,[2001:db8::1]:53" {
		t.Errorf("upstreams %v, %v", got, err)
	}
}

func writeFile(p, s string) error { return os.WriteFile(p, []byte(s), 0o644) }
