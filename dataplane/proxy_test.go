package dataplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	wtestutil "github.com/waggle-io/waggle/internal/testutil"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/waggle-io/waggle/internal/ops"
)

// recordingBackend is a fake Backend that keeps the last State and can fail
// or block on demand.
type recordingBackend struct {
	mu      sync.Mutex
	states  []*State
	fail    error
	gate    chan struct{} // when set, Sync waits for it to close
	cleaned int
	updates chan struct{}
}

func newRecordingBackend() *recordingBackend {
	return &recordingBackend{updates: make(chan struct{}, 100)}
}

func (b *recordingBackend) Name() string { return "fake" }
func (b *recordingBackend) Sync(ctx context.Context, st *State) error {
	b.mu.Lock()
	gate := b.gate
	b.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.fail != nil {
		return b.fail
	}
	b.states = append(b.states, st)
	select {
	case b.updates <- struct{}{}:
	default:
	}
	return nil
}
func (b *recordingBackend) Cleanup(context.Context) error {
	b.mu.Lock()
	b.cleaned++
	b.mu.Unlock()
	return nil
}
func (b *recordingBackend) last() *State {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.states) == 0 {
		return nil
	}
	return b.states[len(b.states)-1]
}

func fakeMode(name string, b Backend, supported error, cleaned *[]string) Mode {
	return Mode{
		Name: name, AutoCandidate: name != ModeIPVS,
		Supported: func() error { return supported },
		New:       func(ModeConfig) (Backend, error) { return b, nil },
		Cleanup: func(context.Context, ModeConfig) error {
			if cleaned != nil {
				*cleaned = append(*cleaned, name)
			}
			return nil
		},
	}
}

func TestSelectMode(t *testing.T) {
	no := fmt.Errorf("no cgroup hooks: %w", ErrNotSupported)
	tests := []struct {
		name      string
		requested string
		ebpf      error
		want      string
		wantErr   bool
	}{
		{"auto picks ebpf where supported", ModeAuto, nil, ModeEBPF, false},
		{"auto falls back to iptables", ModeAuto, no, ModeIPTables, false},
		{"explicit iptables is honoured", ModeIPTables, nil, ModeIPTables, false},
		{"explicit ebpf where unsupported is refused", ModeEBPF, no, "", true},
		{"ipvs without kernel support is refused", ModeIPVS, nil, "", true},
		{"auto never picks ipvs", ModeAuto, no, ModeIPTables, false},
		{"unknown mode is refused", "userspace", nil, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			modes := []Mode{
				fakeMode(ModeEBPF, nil, tt.ebpf, nil),
				fakeMode(ModeIPTables, nil, nil, nil),
				fakeMode(ModeIPVS, nil, fmt.Errorf("no /proc/net/ip_vs: %w", ErrNotSupported), nil),
			}
			m, why, err := SelectMode(tt.requested, modes)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err == nil && (m.Name != tt.want || why == "") {
				t.Fatalf("picked %q (%s), want %q", m.Name, why, tt.want)
			}
			if tt.ebpf != nil && tt.requested == ModeAuto && !strings.Contains(why, "no cgroup hooks") {
				t.Errorf("auto's reason %q does not say why ebpf was not picked", why)
			}
		})
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	for _, tt := range []struct {
		name string
		mut  func(*Config)
	}{
		{"missing node name", func(c *Config) { c.NodeName = "" }},
		{"unknown mode", func(c *Config) { c.Mode = "kernelspace" }},
		{"min sync period above sync period", func(c *Config) { c.MinSyncPeriod = time.Hour }},
		{"zero sync period", func(c *Config) { c.SyncPeriod = 0 }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{NodeName: "a", Mode: ModeAuto, NetworkPolicy: "off", SyncPeriod: time.Minute, Client: fake.NewClientset(), Health: ops.NewHealth()}
			tt.mut(&cfg)
			if err := Run(context.Background(), cfg); !errors.Is(err, ErrBadConfig) {
				t.Fatalf("err = %v, want ErrBadConfig", err)
			}
		})
	}
}

func TestRunCleanupCleansEveryMode(t *testing.T) {
	var cleaned []string
	cfg := Config{Cleanup: true, Modes: []Mode{fakeMode(ModeEBPF, nil, nil, &cleaned), fakeMode(ModeIPTables, nil, nil, &cleaned), fakeMode(ModeIPVS, nil, ErrNotSupported, &cleaned)}}
	if err := Run(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	if strings.Join(cleaned, ",") != "ebpf,iptables,ipvs" {
		t.Errorf("cleaned %v", cleaned)
	}
}

type proxyHarness struct {
	t       *testing.T
	client  *fake.Clientset
	backend *recordingBackend
	health  *ops.Health
	cleaned []string
	done    chan error
	cancel  func()
}

func startProxy(t *testing.T, backend *recordingBackend, objs ...runtimeObject) *proxyHarness {
	h := &proxyHarness{t: t, backend: backend, health: ops.NewHealth(), done: make(chan error, 1)}
	h.client = fake.NewClientset()
	for _, o := range objs {
		o(t, h.client)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cfg := Config{
		Client: h.client, NodeName: "a", Mode: ModeIPTables, NetworkPolicy: "off", SyncPeriod: time.Hour, MinSyncPeriod: 0, Health: h.health,
		Log:   slog.New(slog.DiscardHandler),
		Modes: []Mode{fakeMode(ModeEBPF, nil, ErrNotSupported, &h.cleaned), fakeMode(ModeIPTables, backend, nil, &h.cleaned)},
	}
	go func() { h.done <- Run(ctx, cfg) }()
	h.cancel = func() {
		cancel()
		if err := <-h.done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	t.Cleanup(func() {
		if cancel != nil {
			h.cancel()
		}
	})
	return h
}

type runtimeObject func(*testing.T, *fake.Clientset)

func withService(s *v1.Service) runtimeObject {
	return func(t *testing.T, c *fake.Clientset) {
		if _, err := c.CoreV1().Services(s.Namespace).Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// waitState waits until the backend's last State satisfies ok.
func (h *proxyHarness) waitState(what string, ok func(*State) bool) *State {
	h.t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		if st := h.backend.last(); st != nil && ok(st) {
			return st
		}
		select {
		case <-h.backend.updates:
		case <-time.After(20 * time.Millisecond):
		case <-deadline:
			h.t.Fatalf("backend never got a state where %s; last:\n%v", what, h.backend.last())
		}
	}
}

func (h *proxyHarness) get(path string) int {
	rec := httptest.NewRecorder()
	h.health.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code
}

func TestRunProgramsAndFollowsChanges(t *testing.T) {
	b := newRecordingBackend()
	h := startProxy(t, b, withService(svc("web")))
	h.waitState("the service has a frontend", func(st *State) bool { return len(st.Frontends) == 1 })
	if fmt.Sprint(h.cleaned) != "[ebpf]" {
		t.Errorf("starting in iptables mode cleaned %v, want the other mode [ebpf]", h.cleaned)
	}
	es := slice("web", "web-1", 8080, ready("10.0.0.1", "a"))
	es.Annotations = map[string]string{v1.EndpointsLastChangeTriggerTime: time.Now().Add(-time.Second).UTC().Format(time.RFC3339)}
	if _, err := h.client.DiscoveryV1().EndpointSlices("default").Create(context.Background(), es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitState("the endpoint is programmed", func(st *State) bool {
		return len(st.Frontends) == 1 && len(st.Frontends[0].Endpoints) == 1
	})
	if err := h.client.CoreV1().Services("default").Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.waitState("the deleted service is gone", func(st *State) bool { return len(st.Frontends) == 0 })
	if code := h.get("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz = %d after programming", code)
	}
	if n := testutil.CollectAndCount(h.health.Registry, "waggle_proxy_endpoint_change_to_programmed_seconds"); n != 1 {
		t.Errorf("change latency histogram missing (%d series)", n)
	}
}

func TestRunNotReadyUntilProgrammed(t *testing.T) {
	b := newRecordingBackend()
	b.gate = make(chan struct{})
	h := startProxy(t, b, withService(svc("web")))
	// Once the proxy registered its checks, /readyz must fail while the
	// first Sync is held back.
	for deadline := time.Now().Add(10 * time.Second); h.get("/readyz") == http.StatusOK; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("/readyz stayed ok although nothing was programmed")
		}
	}
	if code := h.get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d while starting", code)
	}
	close(b.gate)
	h.waitState("programmed", func(st *State) bool { return len(st.Frontends) == 1 })
	wtestutil.WaitFor(t, 10*time.Second, "/readyz ok", func() bool { return h.get("/readyz") == http.StatusOK })
}

func (h *proxyHarness) waitEvent(reason string) *v1.Event {
	h.t.Helper()
	var found *v1.Event
	wtestutil.Eventually(h.t, 20*time.Second, func() error {
		evs, err := h.client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		for i := range evs.Items {
			if evs.Items[i].Reason == reason {
				found = &evs.Items[i]
				return nil
			}
		}
		return fmt.Errorf("no %s event", reason)
	})
	return found
}

func TestRunRecordsEventForSCTP(t *testing.T) {
	b := newRecordingBackend()
	h := startProxy(t, b, withService(svc("sig", func(s *v1.Service) {
		s.Spec.Ports = []v1.ServicePort{{Name: "sctp", Port: 9, Protocol: v1.ProtocolSCTP}}
	})))
	ev := h.waitEvent(ReasonUnsupportedProtocol)
	if ev.InvolvedObject.Kind != "Service" || ev.InvolvedObject.Name != "sig" || ev.Type != v1.EventTypeWarning {
		t.Errorf("event on %+v type %s", ev.InvolvedObject, ev.Type)
	}
}

func TestRunRecordsEventForFullMap(t *testing.T) {
	b := newRecordingBackend()
	s := svc("big")
	b.fail = &FrontendError{
		Frontend: FrontendKey{Addr: mustAddr("10.96.0.10"), Port: 80, Protocol: TCP},
		Service:  ServicePortName{Namespace: "default", Name: "big", Port: "http"},
		Err:      fmt.Errorf("services map: %w", ErrMapFull),
	}
	h := startProxy(t, b, withService(s))
	ev := h.waitEvent(ReasonMapFull)
	if ev.InvolvedObject.Name != "big" || !strings.Contains(ev.Message, "map full") {
		t.Errorf("event %+v: %s", ev.InvolvedObject, ev.Message)
	}
	if n := testutil.ToFloat64(mustCounter(t, h)); n < 1 {
		t.Errorf("sync errors = %v", n)
	}
}

func TestRunRecordsEventOnEveryRejectedService(t *testing.T) {
	b := newRecordingBackend()
	rej := &RejectedFrontends{}
	var objs []runtimeObject
	for i := range 12 {
		name := fmt.Sprintf("big-%02d", i)
		ip := fmt.Sprintf("10.96.0.%d", 20+i)
		objs = append(objs, withService(svc(name, func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = ip, []string{ip} })))
		rej.Errs = append(rej.Errs, &FrontendError{Frontend: FrontendKey{Addr: mustAddr(ip), Port: 80, Protocol: TCP},
			Service: ServicePortName{Namespace: "default", Name: name, Port: "http"}, Err: fmt.Errorf("services map: %w", ErrMapFull)})
	}
	b.fail = rej
	h := startProxy(t, b, objs...)
	wtestutil.Eventually(t, 20*time.Second, func() error {
		evs, err := h.client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		seen := map[string]bool{}
		for _, ev := range evs.Items {
			if ev.Reason == ReasonMapFull {
				seen[ev.InvolvedObject.Name] = true
			}
		}
		if len(seen) != 12 {
			return fmt.Errorf("MapFull events on %d Services, want all 12: %v", len(seen), seen)
		}
		return nil
	})
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

func mustCounter(t *testing.T, h *proxyHarness) prometheus.Collector {
	t.Helper()
	mfs, err := h.health.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "waggle_proxy_sync_errors_total" {
			c := prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
			c.Add(mf.GetMetric()[0].GetCounter().GetValue())
			return c
		}
	}
	t.Fatal("no waggle_proxy_sync_errors_total")
	return nil
}

func TestUnsetClusterCIDRIsIgnored(t *testing.T) {
	cfg := Config{NodeName: "a", Mode: ModeAuto, NetworkPolicy: "off", SyncPeriod: time.Minute,
		ClusterCIDRs: []netip.Prefix{{}, netip.MustParsePrefix("10.244.1.0/16")}}
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	if len(cfg.ClusterCIDRs) != 1 || cfg.ClusterCIDRs[0] != netip.MustParsePrefix("10.244.0.0/16") {
		t.Errorf("cluster CIDRs %v", cfg.ClusterCIDRs)
	}
}

func TestRunFailsAtOnceWhenTheHealthPortIsTaken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := Config{NodeName: "a", Mode: ModeIPTables, NetworkPolicy: "off", SyncPeriod: time.Minute, Client: fake.NewClientset(),
		HealthBindAddress: ln.Addr().String(), Log: slog.New(slog.DiscardHandler),
		Modes: []Mode{fakeMode(ModeIPTables, newRecordingBackend(), nil, nil)}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := Run(ctx, cfg); err == nil || !strings.Contains(err.Error(), "--health-bind-address") {
		t.Fatalf("Run = %v, want an error naming --health-bind-address", err)
	}
}

// incrementalBackend is a recordingBackend that also takes Changes.
type incrementalBackend struct {
	*recordingBackend
	changes chan *Change
	failOn  func(*Change) error
}

func (b *incrementalBackend) Apply(_ context.Context, ch *Change) error {
	b.changes <- ch
	if b.failOn != nil {
		return b.failOn(ch)
	}
	return nil
}

func startIncrementalProxy(t *testing.T, b *incrementalBackend, objs ...runtimeObject) *proxyHarness {
	h := &proxyHarness{t: t, backend: b.recordingBackend, health: ops.NewHealth(), done: make(chan error, 1)}
	h.client = fake.NewClientset()
	for _, o := range objs {
		o(t, h.client)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cfg := Config{Client: h.client, NodeName: "a", Mode: ModeEBPF, NetworkPolicy: "off", SyncPeriod: time.Hour, MinSyncPeriod: time.Hour,
		Health: h.health, Log: slog.New(slog.DiscardHandler),
		Modes: []Mode{{Name: ModeEBPF, Supported: func() error { return nil }, New: func(ModeConfig) (Backend, error) { return b, nil }, LoopbackNodePorts: true}}}
	go func() { h.done <- Run(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-h.done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return h
}

func (b *incrementalBackend) next(t *testing.T) *Change {
	t.Helper()
	select {
	case ch := <-b.changes:
		return ch
	case <-time.After(20 * time.Second):
		t.Fatal("no Change applied")
	}
	return nil
}

// TestRunAppliesOnlyTheChangedService: the first sync is the whole State,
// every later event is applied at once (a min-sync-period of an hour does
// not hold an incremental backend back) as a Change holding only the
// Service concerned; a rejected Service is retried alone.
func TestRunAppliesOnlyTheChangedService(t *testing.T) {
	b := &incrementalBackend{recordingBackend: newRecordingBackend(), changes: make(chan *Change, 100)}
	var objs []runtimeObject
	for i := range 20 {
		ip := fmt.Sprintf("10.96.0.%d", 20+i)
		objs = append(objs, withService(svc(fmt.Sprintf("s%d", i), func(s *v1.Service) { s.Spec.ClusterIP, s.Spec.ClusterIPs = ip, []string{ip} })))
	}
	h := startIncrementalProxy(t, b, objs...)
	h.waitState("the first sync programs all 20 Services", func(st *State) bool { return len(st.Frontends) == 20 })
	rejectOnce := true
	b.failOn = func(ch *Change) error {
		if !rejectOnce {
			return nil
		}
		rejectOnce = false
		f := ch.Upsert[0]
		return &RejectedFrontends{Errs: []*FrontendError{{Frontend: f.FrontendKey, Service: f.Service, Err: ErrMapFull}}}
	}
	es := slice("s7", "s7-1", 8080, ready("10.0.0.1", "a"))
	if _, err := h.client.DiscoveryV1().EndpointSlices("default").Create(context.Background(), es, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, what := range []string{"the change", "the retry of the rejected Service"} {
		ch := b.next(t)
		if len(ch.Upsert) != 1 || ch.Upsert[0].Service.Name != "s7" || len(ch.Upsert[0].Endpoints) != 1 || len(ch.Remove) != 0 {
			t.Fatalf("%s: %+v, want s7's one frontend with its endpoint", what, ch)
		}
	}
	if err := h.client.CoreV1().Services("default").Delete(context.Background(), "s3", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if ch := b.next(t); len(ch.Upsert) != 0 || len(ch.Remove) != 1 || ch.Remove[0].Addr != mustAddr("10.96.0.23") {
		t.Fatalf("delete: %+v, want s3's frontend removed", ch)
	}
	b.mu.Lock()
	n := len(b.states)
	b.mu.Unlock()
	if n != 1 {
		t.Errorf("%d whole-State syncs, want only the first", n)
	}
}

// The informers' transform drops managedFields (the proxy's largest unread
// field) and leaves everything else, and passes what is not an object.
func TestInformersDropManagedFields(t *testing.T) {
	svc := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", Labels: map[string]string{"app": "web"},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}}},
		Spec: v1.ServiceSpec{ClusterIP: "10.96.0.10"}}
	out, err := stripManagedFields(svc)
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*v1.Service)
	if got.ManagedFields != nil || got.Labels["app"] != "web" || got.Spec.ClusterIP != "10.96.0.10" {
		t.Errorf("transformed Service: %+v", got.ObjectMeta)
	}
	if out, err := stripManagedFields("not an object"); err != nil || out != "not an object" {
		t.Errorf("non-object: %v, %v", out, err)
	}
}
