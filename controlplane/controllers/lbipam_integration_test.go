package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/controlplane/controllers/lbipam"
	"github.com/waggle-io/waggle/internal/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// TestLoadBalancerIPAM: LoadBalancer Services get addresses from the pool
// (status.loadBalancer.ingress, ipMode VIP), a requested address is honoured
// or refused with an Event, another loadBalancerClass is left alone, an
// exhausted pool leaves a Service pending until an address is released
// (by deletion or a type change), and a new leader keeps every address.
func TestLoadBalancerIPAM(t *testing.T) {
	testutil.Privileged(t)
	srv := apiservertest.Start(t, apiservertest.Options{})
	cs, err := kubernetes.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	svcs := cs.CoreV1().Services("default")
	start := func(identity string) func() {
		cfg := DefaultConfig()
		cfg.RestConfig = srv.UserConfig(t, "system:kube-controller-manager")
		cfg.SecureServing.SecurePort = 0
		cfg.Controllers = []string{lbipam.Name}
		cfg.LoadBalancerIPPools = []string{"192.0.2.10-192.0.2.12"}
		cfg.LeaderElection = defaultLease(identity)
		cfg.LeaderElection.Enabled = false
		cfg.Log = testLogger(t, identity)
		mctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- Run(mctx, cfg) }()
		stop := func() { cancel(); <-done }
		t.Cleanup(func() {
			select {
			case <-mctx.Done():
			default:
				stop()
			}
		})
		return stop
	}
	create := func(name string, mod func(*corev1.Service)) {
		t.Helper()
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}}}
		if mod != nil {
			mod(s)
		}
		if _, err := svcs.Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ingress := func(name string) ([]string, error) {
		s, err := svcs.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		var out []string
		for _, in := range s.Status.LoadBalancer.Ingress {
			if in.IPMode == nil || *in.IPMode != corev1.LoadBalancerIPModeVIP {
				return nil, fmt.Errorf("ingress %+v without ipMode VIP", in)
			}
			out = append(out, in.IP)
		}
		return out, nil
	}
	hasIngress := func(name string, want ...string) {
		t.Helper()
		eventually(t, 45*time.Second, func() error {
			got, err := ingress(name)
			if err != nil {
				return err
			}
			if !slices.Equal(got, want) {
				return fmt.Errorf("%s ingress %v, want %v", name, got, want)
			}
			return nil
		})
	}
	event := func(name, reason, text string) {
		t.Helper()
		eventually(t, 45*time.Second, func() error {
			evs, err := cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
			if err != nil {
				return err
			}
			for _, e := range evs.Items {
				if e.Reason == reason && strings.Contains(e.Message, text) {
					return nil
				}
			}
			return fmt.Errorf("no %s event %q for %s", reason, text, name)
		})
	}

	other := "example.com/other-lb"
	create("wants-12", func(s *corev1.Service) { s.Annotations = map[string]string{lbipam.Annotation: "192.0.2.12"} })
	create("first", nil)
	create("foreign", func(s *corev1.Service) { s.Spec.LoadBalancerClass = &other })
	create("outside", func(s *corev1.Service) { s.Spec.LoadBalancerIP = "198.51.100.1" })
	stop := start("cm-lb-0")

	hasIngress("wants-12", "192.0.2.12")
	hasIngress("first", "192.0.2.10")
	event("outside", lbipam.ReasonFailed, "requested address 198.51.100.1 is not in any --loadbalancer-ip-pool")
	hasIngress("outside")
	create("second", nil)
	hasIngress("second", "192.0.2.11")
	create("third", nil)
	event("third", lbipam.ReasonFailed, "no IPv4 address left in --loadbalancer-ip-pool")
	create("taken", func(s *corev1.Service) {
		s.Annotations = map[string]string{"metallb.universe.tf/loadBalancerIPs": "192.0.2.10"}
	})
	event("taken", lbipam.ReasonFailed, "requested address 192.0.2.10 is already allocated to default/first")
	// The foreign class's Service was never touched (a positive marker
	// first: every served Service has been handled).
	if got, err := ingress("foreign"); err != nil || len(got) != 0 {
		t.Fatalf("foreign class got %v (%v)", got, err)
	}

	// A leader change keeps the addresses where they are.
	stop()
	start("cm-lb-1")
	create("after-restart", func(s *corev1.Service) { s.Spec.LoadBalancerIP = "192.0.2.11" })
	event("after-restart", lbipam.ReasonFailed, "already allocated to default/second")
	hasIngress("first", "192.0.2.10")

	// Deleting a Service frees its address for the pending one; a type
	// change releases and clears the status.
	if err := svcs.Delete(ctx, "first", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 45*time.Second, func() error {
		a, err := ingress("third")
		if err != nil {
			return err
		}
		b, err := ingress("taken")
		if err != nil {
			return err
		}
		if len(a)+len(b) != 1 {
			return fmt.Errorf("third %v, taken %v: want 192.0.2.10 for exactly one", a, b)
		}
		return nil
	})
	// Nothing else may compete for the next freed address.
	for _, n := range []string{"third", "taken"} {
		if err := svcs.Delete(ctx, n, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	s, err := svcs.Get(ctx, "second", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Spec.Type = corev1.ServiceTypeClusterIP
	s.Spec.LoadBalancerIP = ""
	for i := range s.Spec.Ports {
		s.Spec.Ports[i].NodePort = 0
	}
	s.Spec.AllocateLoadBalancerNodePorts = nil
	s.Spec.ExternalTrafficPolicy = ""
	if _, err := svcs.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	hasIngress("second")
	hasIngress("after-restart", "192.0.2.11")
}
