package apiserver_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"
)

// kindFixtures reads testdata/kinds: one small valid manifest per kind,
// keyed by file name (the resource, or the group for a second version).
func kindFixtures(t *testing.T) map[string]*unstructured.Unstructured {
	t.Helper()
	files, err := filepath.Glob("testdata/kinds/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("fixtures: %v %v", files, err)
	}
	out := map[string]*unstructured.Unstructured{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(b, &u.Object); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[strings.TrimSuffix(filepath.Base(f), ".yaml")] = u
	}
	return out
}

// resourceOf finds the catalog resource serving u's apiVersion and kind.
func resourceOf(t *testing.T, u *unstructured.Unstructured) *catalog.Resource {
	t.Helper()
	gvk := u.GroupVersionKind()
	for _, r := range catalog.All() {
		if r.GroupVersionKind() == gvk {
			return &r
		}
	}
	t.Fatalf("%s is not served", gvk)
	return nil
}

// TestEveryNewKindRoundTrips: each kind is created, read, listed,
// watched, patched (merge), written with dryRun (nothing stored) and
// deleted through client-go's dynamic client, with the server's defaults
// and metadata in place.
func TestEveryNewKindRoundTrips(t *testing.T) {
	_, s := newClient(t)
	dc, err := dynamic.NewForConfig(s.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for name, fx := range kindFixtures(t) {
		t.Run(name, func(t *testing.T) {
			r := resourceOf(t, fx)
			var ri dynamic.ResourceInterface = dc.Resource(r.GroupVersionResource)
			if r.Namespaced {
				ri = dc.Resource(r.GroupVersionResource).Namespace("default")
			}
			w, err := ri.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + fx.GetName()})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			dry, err := ri.Create(ctx, fx.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if err != nil {
				t.Fatalf("dry-run create: %v", err)
			}
			if dry.GetUID() == "" {
				t.Errorf("dry-run create answered without server fields: %v", dry.Object["metadata"])
			}
			if _, err := ri.Get(ctx, fx.GetName(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Fatalf("dry-run create stored the object: %v", err)
			}
			created, err := ri.Create(ctx, fx.DeepCopy(), metav1.CreateOptions{FieldValidation: "Strict"})
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			if created.GetResourceVersion() == "" || created.GetCreationTimestamp().Time.IsZero() {
				t.Errorf("server fields missing: %v", created.Object["metadata"])
			}
			if e := <-w.ResultChan(); e.Type != watch.Added {
				t.Errorf("watch: first event %s, want ADDED", e.Type)
			}
			got, err := ri.Get(ctx, fx.GetName(), metav1.GetOptions{})
			if err != nil || got.GetUID() != created.GetUID() {
				t.Fatalf("get: %v", err)
			}
			list, err := ri.List(ctx, metav1.ListOptions{})
			if err != nil || len(list.Items) == 0 {
				t.Fatalf("list: %v %v", list, err)
			}
			patched, err := ri.Patch(ctx, fx.GetName(), types.MergePatchType, []byte(`{"metadata":{"labels":{"patched":"yes"}}}`), metav1.PatchOptions{})
			if err != nil || patched.GetLabels()["patched"] != "yes" {
				t.Fatalf("patch: %v", err)
			}
			if e := <-w.ResultChan(); e.Type != watch.Modified {
				t.Errorf("watch: second event %s, want MODIFIED", e.Type)
			}
			if err := ri.Delete(ctx, fx.GetName(), metav1.DeleteOptions{}); err != nil {
				t.Fatalf("delete: %v", err)
			}
			if _, err := ri.Get(ctx, fx.GetName(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("after delete: %v", err)
			}
		})
	}
}

// TestOneStoreServesTwoVersions: an autoscaling/v2 HPA reads back as
// autoscaling/v1 (CPU target converted), and an events.k8s.io/v1 event as
// a core/v1 one, as kube-apiserver stores them.
func TestOneStoreServesTwoVersions(t *testing.T) {
	_, s := newClient(t)
	dc, err := dynamic.NewForConfig(s.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	fx := kindFixtures(t)
	as2 := schema.GroupVersionResource{Group: "autoscaling", Version: "v2", Resource: "horizontalpodautoscalers"}
	if _, err := dc.Resource(as2).Namespace("default").Create(ctx, fx["horizontalpodautoscalers"], metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	v1, err := dc.Resource(schema.GroupVersionResource{Group: "autoscaling", Version: "v1", Resource: "horizontalpodautoscalers"}).Namespace("default").Get(ctx, "hpa1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cpu, _, _ := unstructured.NestedInt64(v1.Object, "spec", "targetCPUUtilizationPercentage"); cpu != 60 || v1.GetAPIVersion() != "autoscaling/v1" {
		t.Errorf("autoscaling/v1 view: %v", v1.Object)
	}
	ev := schema.GroupVersionResource{Group: "events.k8s.io", Version: "v1", Resource: "events"}
	if _, err := dc.Resource(ev).Namespace("default").Create(ctx, fx["events.k8s.io"], metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	core, err := dc.Resource(schema.GroupVersionResource{Version: "v1", Resource: "events"}).Namespace("default").Get(ctx, "ev1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if msg, _, _ := unstructured.NestedString(core.Object, "message"); msg != "an events.k8s.io/v1 event" {
		t.Errorf("core/v1 view of an events.k8s.io/v1 event: %v", core.Object)
	}
}

// TestCertificateSigningRequestApprovalAndStatus: a CSR records its
// requester (not what the client claims), approval writes only
// conditions, and a status write sets the certificate but cannot drop the
// approval, as kube-apiserver's CSR strategies.
func TestCertificateSigningRequestApprovalAndStatus(t *testing.T) {
	cs, _ := newClient(t)
	ctx := context.Background()
	fx := kindFixtures(t)
	csr := &certificatesv1.CertificateSigningRequest{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(fx["certificatesigningrequests"].Object, csr); err != nil {
		t.Fatal(err)
	}
	csr.Spec.Username, csr.Spec.Groups = "mallory", []string{"system:masters"}
	csrs := cs.CertificatesV1().CertificateSigningRequests()
	got, err := csrs.Create(ctx, csr, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.Username != "admin" || len(got.Status.Conditions) != 0 {
		t.Fatalf("requester = %q %v (want the caller, admin), conditions %v", got.Spec.Username, got.Spec.Groups, got.Status.Conditions)
	}
	got.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "Test", Message: "approved by the test"}}
	got.Spec.SignerName = "example.com/other" // ignored: approval writes conditions (and metadata) only
	got.Annotations = map[string]string{"patchedapproval": "true"}
	approved, err := csrs.UpdateApproval(ctx, got.Name, got, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(approved.Status.Conditions) != 1 || approved.Status.Conditions[0].LastUpdateTime.IsZero() || approved.Spec.SignerName != "example.com/signer" ||
		approved.Annotations["patchedapproval"] != "true" {
		t.Fatalf("after approval: conditions %+v, signer %q, annotations %v (upstream's approval strategy keeps metadata changes)", approved.Status.Conditions, approved.Spec.SignerName, approved.Annotations)
	}
	bundle, _, _ := unstructured.NestedString(fx["clustertrustbundles"].Object, "spec", "trustBundle")
	approved.Status.Certificate = []byte(bundle)
	approved.Status.Conditions = nil // a status write cannot drop the approval
	issued, err := csrs.UpdateStatus(ctx, approved, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(issued.Status.Certificate) == 0 || len(issued.Status.Conditions) != 1 || issued.Status.Conditions[0].Type != certificatesv1.CertificateApproved {
		t.Fatalf("after status: certificate %d bytes, conditions %+v", len(issued.Status.Certificate), issued.Status.Conditions)
	}
	// A status write that appends a condition and keeps the approval keeps
	// the order it wrote (upstream preserves Approved in place).
	issued.Status.Conditions = append(issued.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{Type: "StatusUpdate", Status: corev1.ConditionTrue, Reason: "Test"})
	again, err := csrs.UpdateStatus(ctx, issued, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(again.Status.Conditions); n != 2 || again.Status.Conditions[0].Type != certificatesv1.CertificateApproved || again.Status.Conditions[1].Type != "StatusUpdate" {
		t.Fatalf("after appending a status condition: %+v", again.Status.Conditions)
	}
}
