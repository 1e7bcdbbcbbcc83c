package apiserver_test

import (
	"context"
	"net/netip"
	"testing"

	"github.com/waggle-io/waggle/controlplane/apiserver"
	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

func svcWith(name string, policy *corev1.IPFamilyPolicy, fams ...corev1.IPFamily) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.ServiceSpec{
		Selector: map[string]string{"app": name}, Ports: []corev1.ServicePort{{Port: 80}}, IPFamilyPolicy: policy, IPFamilies: fams}}
}

// families returns the family of each of the Service's clusterIPs, checking
// they lie in the cluster's ranges.
func families(t *testing.T, s *corev1.Service) []corev1.IPFamily {
	t.Helper()
	v4, v6 := netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("fd00:10:96::/112")
	var out []corev1.IPFamily
	for _, ip := range s.Spec.ClusterIPs {
		a := netip.MustParseAddr(ip)
		switch {
		case v4.Contains(a):
			out = append(out, corev1.IPv4Protocol)
		case v6.Contains(a):
			out = append(out, corev1.IPv6Protocol)
		default:
			t.Fatalf("%s: clusterIP %s outside the cluster's ranges", s.Name, ip)
		}
	}
	if s.Spec.ClusterIP != s.Spec.ClusterIPs[0] {
		t.Fatalf("%s: clusterIP %s is not clusterIPs[0] %v", s.Name, s.Spec.ClusterIP, s.Spec.ClusterIPs)
	}
	return out
}

func sameFamilies(a []corev1.IPFamily, b ...corev1.IPFamily) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestDualStackServices: with an IPv4 and an IPv6 service range, Services
// get one address per family their ipFamilyPolicy and ipFamilies ask for,
// from the right range, in the right order; upgrades allocate and
// downgrades release the secondary; on a single-stack cluster what cannot be
// served is Invalid and nothing is stored.
func TestDualStackServices(t *testing.T) {
	testutil.Privileged(t)
	srv := apiservertest.Start(t, apiservertest.Options{Configure: func(c *apiserver.Config) {
		c.ServiceClusterIPRange = "10.96.0.0/16,fd00:10:96::/112"
	}})
	cs := kubernetes.NewForConfigOrDie(srv.Config)
	ctx := context.Background()
	svcs := cs.CoreV1().Services("default")
	v4, v6 := corev1.IPv4Protocol, corev1.IPv6Protocol
	single, prefer, require := ptr(corev1.IPFamilyPolicySingleStack), ptr(corev1.IPFamilyPolicyPreferDualStack), ptr(corev1.IPFamilyPolicyRequireDualStack)

	for _, c := range []struct {
		name   string
		svc    *corev1.Service
		policy corev1.IPFamilyPolicy
		want   []corev1.IPFamily
	}{
		{"default", svcWith("plain", nil), corev1.IPFamilyPolicySingleStack, []corev1.IPFamily{v4}},
		{"ipv6 single stack", svcWith("six", nil, v6), corev1.IPFamilyPolicySingleStack, []corev1.IPFamily{v6}},
		{"prefer dual stack", svcWith("prefer", prefer), corev1.IPFamilyPolicyPreferDualStack, []corev1.IPFamily{v4, v6}},
		{"require dual stack, IPv6 first", svcWith("require6", require, v6), corev1.IPFamilyPolicyRequireDualStack, []corev1.IPFamily{v6, v4}},
		{"two families without a policy", svcWith("both", nil, v4, v6), corev1.IPFamilyPolicyRequireDualStack, []corev1.IPFamily{v4, v6}},
	} {
		got, err := svcs.Create(ctx, c.svc, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if *got.Spec.IPFamilyPolicy != c.policy || !sameFamilies(got.Spec.IPFamilies, c.want...) || !sameFamilies(families(t, got), c.want...) {
			t.Errorf("%s: policy %s families %v clusterIPs %v, want %s %v", c.name, *got.Spec.IPFamilyPolicy, got.Spec.IPFamilies, got.Spec.ClusterIPs, c.policy, c.want)
		}
	}

	// Requested addresses of both families are kept.
	s := svcWith("fixed", nil)
	s.Spec.ClusterIPs = []string{"10.96.3.3", "fd00:10:96::303"}
	s.Spec.ClusterIP = "10.96.3.3"
	got, err := svcs.Create(ctx, s, metav1.CreateOptions{})
	if err != nil || *got.Spec.IPFamilyPolicy != corev1.IPFamilyPolicyRequireDualStack || got.Spec.ClusterIPs[1] != "fd00:10:96::303" {
		t.Fatalf("requested clusterIPs: %v %+v", err, got.Spec)
	}
	// Upgrade to dual stack allocates the IPv6 address; downgrade releases it.
	up, err := svcs.Patch(ctx, "plain", types.MergePatchType, []byte(`{"spec":{"ipFamilyPolicy":"PreferDualStack"}}`), metav1.PatchOptions{})
	if err != nil || !sameFamilies(families(t, up), v4, v6) {
		t.Fatalf("upgrade: %v %v", err, up.Spec.ClusterIPs)
	}
	down, err := svcs.Patch(ctx, "plain", types.MergePatchType, []byte(`{"spec":{"ipFamilyPolicy":"SingleStack"}}`), metav1.PatchOptions{})
	if err != nil || !sameFamilies(families(t, down), v4) || len(down.Spec.IPFamilies) != 1 || down.Spec.ClusterIPs[0] != up.Spec.ClusterIPs[0] {
		t.Fatalf("downgrade: %v %v %v", err, down.Spec.ClusterIPs, down.Spec.IPFamilies)
	}
	reuse := svcWith("reuse", nil, v6)
	reuse.Spec.ClusterIP = up.Spec.ClusterIPs[1]
	if _, err := svcs.Create(ctx, reuse, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the released IPv6 address is not free again: %v", err)
	}
	// The primary family never changes.
	if _, err := svcs.Patch(ctx, "prefer", types.MergePatchType, []byte(`{"spec":{"ipFamilies":["IPv6","IPv4"]}}`), metav1.PatchOptions{}); !invalidAt(err, "spec.ipFamilies[0]") {
		t.Errorf("primary family change: %v", err)
	}
	// A clusterIP of the other family than ipFamilies says: Invalid.
	bad := svcWith("mismatch", nil, v6)
	bad.Spec.ClusterIP = "10.96.4.4"
	if _, err := svcs.Create(ctx, bad, metav1.CreateOptions{}); !invalidAt(err, "spec.ipFamilies[0]") {
		t.Errorf("family mismatch: %v", err)
	}
	// Headless without a selector: RequireDualStack over both families.
	hl := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "headless"}, Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: []corev1.ServicePort{{Port: 80}}}}
	if got, err := svcs.Create(ctx, hl, metav1.CreateOptions{}); err != nil || *got.Spec.IPFamilyPolicy != corev1.IPFamilyPolicyRequireDualStack ||
		!sameFamilies(got.Spec.IPFamilies, v4, v6) || len(got.Spec.ClusterIPs) != 1 || got.Spec.ClusterIPs[0] != "None" {
		t.Errorf("headless: %v %+v", err, got.Spec)
	}

	t.Run("a single-stack cluster refuses what it cannot serve", func(t *testing.T) {
		cs1, _ := newClient(t)
		svcs1 := cs1.CoreV1().Services("default")
		for name, c := range map[string]struct {
			svc   *corev1.Service
			field string
		}{
			"require":  {svcWith("require", require), "spec.ipFamilyPolicy"},
			"ipv6":     {svcWith("ipv6", nil, v6), "spec.ipFamilies[0]"},
			"ipv6addr": {func() *corev1.Service { s := svcWith("ipv6addr", nil); s.Spec.ClusterIP = "fd00::1"; return s }(), "spec.ipFamilies[0]"},
			"single2":  {svcWith("single2", single, v4, v6), "spec.ipFamilies"},
		} {
			if _, err := svcs1.Create(ctx, c.svc, metav1.CreateOptions{}); !invalidAt(err, c.field) {
				t.Errorf("%s: want 422 at %s, got %v", name, c.field, err)
			}
			if _, err := svcs1.Get(ctx, c.svc.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("%s: a refused Service was stored: %v", name, err)
			}
		}
		got, err := svcs1.Create(ctx, svcWith("prefer", prefer), metav1.CreateOptions{})
		if err != nil || len(got.Spec.ClusterIPs) != 1 || !sameFamilies(got.Spec.IPFamilies, v4) {
			t.Errorf("PreferDualStack on a single-stack cluster: %v %+v", err, got.Spec)
		}
	})
}
