package apiserver_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	corev1 "k8s.io/api/core/v1"
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
