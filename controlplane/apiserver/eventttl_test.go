package apiserver_test

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver"
	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// eventTTLServer starts a server whose Events live ttl.
func eventTTLServer(t *testing.T, ttl time.Duration) (*kubernetes.Clientset, *apiservertest.Server) {
	t.Helper()
	testutil.Privileged(t)
	s := apiservertest.Start(t, apiservertest.Options{Configure: func(c *apiserver.Config) { c.EventTTL = ttl }})
	cs, err := kubernetes.NewForConfig(s.Config)
	if err != nil {
		t.Fatal(err)
	}
	return cs, s
}

func coreEvent(name string) *corev1.Event {
	return &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: name, Namespace: "default"},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "p", APIVersion: "v1"},
		Reason:         "Tested", Message: "m", Type: corev1.EventTypeNormal, Count: 1,
		Source: corev1.EventSource{Component: "eventttl-test"},
	}
}

// etcdLease is the lease etcd keeps the object under key under (0: none).
func etcdLease(t *testing.T, s *apiservertest.Server, key string) clientv3.LeaseID {
	t.Helper()
	resp, err := s.Store().Client().Get(context.Background(), key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("etcd get %s: %v %v", key, resp, err)
	}
	return clientv3.LeaseID(resp.Kvs[0].Lease)
}

// awaitDeleted waits for a DELETED of name on w.
func awaitDeleted(t *testing.T, w watch.Interface, names ...string) {
	t.Helper()
	left := map[string]bool{}
	for _, n := range names {
		left[n] = true
	}
	deadline := time.After(60 * time.Second) // bounds a hang only
	for len(left) > 0 {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch ended; still there: %v", left)
			}
			e, isEvent := ev.Object.(*corev1.Event)
			if ev.Type == watch.Deleted && isEvent {
				delete(left, e.Name)
			}
		case <-deadline:
			t.Fatalf("not deleted after 60 s: %v", left)
		}
	}
}

func TestEventsExpireAfterEventTTLAndWatchersSeeDeleted(t *testing.T) {
	cs, s := eventTTLServer(t, 2*time.Second)
	ctx := context.Background()
	w, err := cs.CoreV1().Events("default").Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if _, err := cs.CoreV1().Events("default").Create(ctx, coreEvent("core"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// events.k8s.io/v1 Events are the same stored objects.
	ev1 := &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: "v1", Namespace: "default"},
		EventTime:  metav1.NewMicroTime(time.Now()), ReportingController: "waggle.io/eventttl-test", ReportingInstance: "i",
		Action: "Test", Reason: "Tested", Type: corev1.EventTypeNormal,
		Regarding: corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "p", APIVersion: "v1"},
	}
	if _, err := cs.EventsV1().Events("default").Create(ctx, ev1, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"core", "v1"} {
		if etcdLease(t, s, "/registry/events/default/"+name) == 0 {
			t.Fatalf("event %s is stored without a lease", name)
		}
	}
	// Other kinds never get one, on create or update.
	cm, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kept"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data = map[string]string{"k": "v"}
	if _, err := cs.CoreV1().ConfigMaps("default").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if id := etcdLease(t, s, "/registry/configmaps/default/kept"); id != 0 {
		t.Fatalf("a ConfigMap is stored under lease %x", id)
	}

	awaitDeleted(t, w, "core", "v1")
	for _, name := range []string{"core", "v1"} {
		if _, err := cs.CoreV1().Events("default").Get(ctx, name, metav1.GetOptions{}); err == nil {
			t.Fatalf("event %s still served after its DELETED", name)
		}
	}
	if _, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "kept", metav1.GetOptions{}); err != nil {
		t.Fatalf("the ConfigMap went with the Events: %v", err)
	}
}

func TestEventUpdateExtendsItsTTL(t *testing.T) {
	cs, s := eventTTLServer(t, 4*time.Second)
	ctx := context.Background()
	const key = "/registry/events/default/extended"
	e, err := cs.CoreV1().Events("default").Create(ctx, coreEvent("extended"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	first := etcdLease(t, s, key)
	remaining := func(id clientv3.LeaseID) int64 {
		resp, err := s.Store().Client().TimeToLive(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return resp.TTL // -1 once expired
	}
	// Update when the first lease has under 2 s left: the update's own
	// 4 s then ends over 2 s after it.
	testutil.WaitFor(t, 30*time.Second, "the first lease to run low", func() bool { return remaining(first) <= 1 })
	e.Count = 2
	e, err = cs.CoreV1().Events("default").Update(ctx, e, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	second := etcdLease(t, s, key)
	if second == 0 || second == first {
		t.Fatalf("updated under lease %x, want a new one (created under %x)", second, first)
	}
	w, err := cs.CoreV1().Events("default").Watch(ctx, metav1.ListOptions{ResourceVersion: e.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	testutil.WaitFor(t, 30*time.Second, "the first lease to expire", func() bool { return remaining(first) < 0 })
	if got, err := cs.CoreV1().Events("default").Get(ctx, "extended", metav1.GetOptions{}); err != nil || got.Count != 2 {
		t.Fatalf("the updated event did not outlive its first TTL: %v %v", got, err)
	}
	awaitDeleted(t, w, "extended")
}

func TestEventTTLRefusesWhatEtcdCannotKeep(t *testing.T) {
	for _, ttl := range []time.Duration{-time.Second, 500 * time.Millisecond} {
		_, err := apiserver.New(context.Background(), apiserver.Config{DataDir: t.TempDir(), EventTTL: ttl})
		if err == nil || !strings.Contains(err.Error(), "--event-ttl") {
			t.Fatalf("EventTTL %v: %v, want an --event-ttl error", ttl, err)
		}
	}
}

// --lease-reuse-duration-seconds must be a positive number of seconds, as
// kube-apiserver requires; Config's zero is the 60 s default.
func TestLeaseReuseRefusesUnderASecond(t *testing.T) {
	for _, s := range []int64{0, -1, math.MaxInt64} {
		if _, err := apiserver.LeaseReuseSeconds(s); err == nil || !strings.Contains(err.Error(), "--lease-reuse-duration-seconds") {
			t.Errorf("LeaseReuseSeconds(%d): %v, want a --lease-reuse-duration-seconds error", s, err)
		}
	}
	if d, err := apiserver.LeaseReuseSeconds(60); d != time.Minute || err != nil {
		t.Errorf("LeaseReuseSeconds(60) = %v, %v; want 1m0s", d, err)
	}
	for _, d := range []time.Duration{-time.Second, 500 * time.Millisecond} {
		_, err := apiserver.New(context.Background(), apiserver.Config{DataDir: t.TempDir(), LeaseReuse: d})
		if err == nil || !strings.Contains(err.Error(), "--lease-reuse-duration-seconds") {
			t.Errorf("LeaseReuse %v: %v, want a --lease-reuse-duration-seconds error", d, err)
		}
	}
}
