package apilb

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// A dial goes to the current server while it answers, and to the next
// known server when it does not, which then stays current.
func TestDialFailsOverToTheNextServer(t *testing.T) {
	a, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	bal := &Balancer{seed: a.Addr().String(), servers: []string{a.Addr().String(), b.Addr().String()},
		ready: map[string]bool{a.Addr().String(): true, b.Addr().String(): true}, current: a.Addr().String()}
	bal.log = discard()
	c, err := bal.DialContext(context.Background(), "tcp", "ignored:443")
	if err != nil {
		t.Fatal(err)
	}
	if c.RemoteAddr().String() != a.Addr().String() {
		t.Fatalf("dialled %s, want the current server %s", c.RemoteAddr(), a.Addr())
	}
	c.Close()
	a.Close() // the server goes away: connection refused
	c, err = bal.DialContext(context.Background(), "tcp", "ignored:443")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.RemoteAddr().String() != b.Addr().String() {
		t.Fatalf("dialled %s after %s went away, want %s", c.RemoteAddr(), a.Addr(), b.Addr())
	}
	if _, cur := bal.Servers(); cur != b.Addr().String() {
		t.Fatalf("current server %s, want %s", cur, b.Addr())
	}
	// A server that is up but not ready (a partitioned minority) is
	// skipped while a ready one exists.
	bal.mu.Lock()
	bal.ready[b.Addr().String()] = false
	bal.mu.Unlock()
	if _, err := bal.DialContext(context.Background(), "tcp", "x"); err != nil {
		t.Fatalf("the only reachable server, even not ready, is still dialled: %v", err)
	}
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// kube-proxy's role may list endpoints but not get them: the balancer still
// learns the servers, through a LIST narrowed to default/kubernetes.
func TestRefreshLearnsServersWithListOnly(t *testing.T) {
	cs := fake.NewClientset(&corev1.Endpoints{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: "kubernetes"},
		Subsets: []corev1.EndpointSubset{{
			Addresses: []corev1.EndpointAddress{{IP: "10.0.0.2"}, {IP: "10.0.0.3"}},
			Ports:     []corev1.EndpointPort{{Name: "https", Port: 6443}},
		}},
	}, &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: "other"},
		Subsets: []corev1.EndpointSubset{{Addresses: []corev1.EndpointAddress{{IP: "10.9.9.9"}}, Ports: []corev1.EndpointPort{{Port: 1}}}}})
	cs.PrependReactor("get", "endpoints", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(corev1.Resource("endpoints"), "kubernetes", errors.New("no get"))
	})
	seed := "10.0.0.2:6443"
	bal := &Balancer{log: discard(), seed: seed, servers: []string{seed}, ready: map[string]bool{seed: true}, current: seed}
	bal.refresh(context.Background(), cs)
	all, _ := bal.Servers()
	if want := []string{seed, "10.0.0.3:6443"}; !slices.Equal(all, want) {
		t.Fatalf("servers %v, want %v", all, want)
	}
}
