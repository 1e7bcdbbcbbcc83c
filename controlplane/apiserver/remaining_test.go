package apiserver_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// TestListRemainingItemCountProtobuf: a limited LIST answers
// remainingItemCount in protobuf too (the API chunking conformance spec
// lists PodTemplates so), not only in JSON.
func TestListRemainingItemCountProtobuf(t *testing.T) {
	rc, _, stop := apiservertest.StartTestServer(t)
	defer stop()
	ctx := context.Background()
	pc := rest.CopyConfig(rc)
	pc.ContentType = "application/vnd.kubernetes.protobuf"
	cs := kubernetes.NewForConfigOrDie(pc)
	for i := 0; i < 5; i++ {
		pt := &corev1.PodTemplate{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pt%d", i)},
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}}
		if _, err := cs.CoreV1().PodTemplates("default").Create(ctx, pt, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	l, err := cs.CoreV1().PodTemplates("default").List(ctx, metav1.ListOptions{Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	if l.Continue == "" || l.RemainingItemCount == nil || *l.RemainingItemCount != 3 {
		t.Fatalf("continue %q remainingItemCount %v, want a token and 3", l.Continue, l.RemainingItemCount)
	}
	// A write between pages: the next page still answers the first's resourceVersion.
	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "bump"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	l2, err := cs.CoreV1().PodTemplates("default").List(ctx, metav1.ListOptions{Limit: 2, Continue: l.Continue})
	if err != nil || l2.ResourceVersion != l.ResourceVersion {
		t.Fatalf("second page: %v, resourceVersion %q, want the first page's %q", err, l2.ResourceVersion, l.ResourceVersion)
	}
}

// TestListContinueAfterCompaction: a continue token whose revision was
// compacted away answers 410 Gone with a token that continues after the
// same key at the latest revision (upstream's inconsistent continue); the
// rest of the list then pages at that one newer revision.
func TestListContinueAfterCompaction(t *testing.T) {
	cs, srv := newClient(t)
	ctx := context.Background()
	pts := cs.CoreV1().PodTemplates("default")
	for i := 0; i < 7; i++ {
		pt := &corev1.PodTemplate{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("pt%d", i)},
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}}
		if _, err := pts.Create(ctx, pt, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	first, err := pts.List(ctx, metav1.ListOptions{Limit: 2})
	if err != nil || first.Continue == "" {
		t.Fatalf("first page: %v %q", err, first.Continue)
	}
	// A write after the first page, then compaction past the page's revision.
	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "bump"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rev, err := srv.Store().Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Store().Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
	_, err = pts.List(ctx, metav1.ListOptions{Limit: 2, Continue: first.Continue})
	if !apierrors.IsResourceExpired(err) {
		t.Fatalf("continue at a compacted revision: %v, want 410 Expired", err)
	}
	token := err.(apierrors.APIStatus).Status().ListMeta.Continue
	if token == "" {
		t.Fatal("410 without an inconsistent continue token")
	}
	got := []string{first.Items[0].Name, first.Items[1].Name}
	opts := metav1.ListOptions{Limit: 2, Continue: token}
	lastRV := ""
	for {
		l, err := pts.List(ctx, opts)
		if err != nil {
			t.Fatalf("inconsistent continue: %v", err)
		}
		if l.ResourceVersion == first.ResourceVersion || (lastRV != "" && l.ResourceVersion != lastRV) {
			t.Fatalf("page at resourceVersion %s (first %s, previous %s)", l.ResourceVersion, first.ResourceVersion, lastRV)
		}
		lastRV = l.ResourceVersion
		if l.Continue != "" && (l.RemainingItemCount == nil || int(*l.RemainingItemCount)+len(l.Items)+len(got) != 7) {
			t.Fatalf("remainingItemCount %v after %d", l.RemainingItemCount, len(got)+len(l.Items))
		}
		for _, it := range l.Items {
			got = append(got, it.Name)
		}
		if l.Continue == "" {
			break
		}
		opts.Continue = l.Continue
	}
	if fmt.Sprint(got) != "[pt0 pt1 pt2 pt3 pt4 pt5 pt6]" {
		t.Fatalf("listed %v", got)
	}
}
