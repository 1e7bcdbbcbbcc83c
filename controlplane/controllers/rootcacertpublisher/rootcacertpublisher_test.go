package rootcacertpublisher

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/waggle-io/waggle/internal/testutil"
)

const ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"

func start(t *testing.T, objs ...*corev1.Namespace) *fake.Clientset {
	t.Helper()
	cs := fake.NewClientset()
	for _, ns := range objs {
		if _, err := cs.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	watches := testutil.TrackWatches(cs)
	f := informers.NewSharedInformerFactory(cs, 0)
	c, err := New(cs, f, slog.New(slog.DiscardHandler), []byte(ca))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f.Start(ctx.Done())
	done := make(chan struct{})
	go func() { c.Run(ctx, 2); close(done) }()
	t.Cleanup(func() { cancel(); <-done; f.Shutdown() })
	watches.WaitOpen(t, 2, 30*time.Second) // namespaces, configmaps
	return cs
}

func bundle(cs *fake.Clientset, ns string) (string, bool) {
	cm, err := cs.CoreV1().ConfigMaps(ns).Get(context.Background(), ConfigMapName, metav1.GetOptions{})
	if err != nil {
		return "", false
	}
	return cm.Data[DataKey], true
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.Eventually(t, 45*time.Second, func() error {
		if !cond() {
			return fmt.Errorf("waiting for %s", what)
		}
		return nil
	})
}

func TestEveryNamespaceGetsTheBundleBackAfterDeletionOrEdit(t *testing.T) {
	cs := start(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "existing"}})
	published := func(ns string) func() bool {
		return func() bool { b, ok := bundle(cs, ns); return ok && b == ca }
	}
	waitFor(t, "bundle in a namespace that existed at start", published("existing"))

	ctx := context.Background()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "new"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "bundle in a new namespace", published("new"))

	if err := cs.CoreV1().ConfigMaps("new").Delete(ctx, ConfigMapName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "bundle re-created after deletion", published("new"))

	cm, _ := cs.CoreV1().ConfigMaps("existing").Get(ctx, ConfigMapName, metav1.GetOptions{})
	cm.Data[DataKey] = "tampered"
	cm.Annotations["team"] = "kept"
	if _, err := cs.CoreV1().ConfigMaps("existing").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "bundle restored after an edit", published("existing"))
	if cm, _ := cs.CoreV1().ConfigMaps("existing").Get(ctx, ConfigMapName, metav1.GetOptions{}); cm.Annotations["team"] != "kept" || cm.Annotations[descriptionAnnotation] != description {
		t.Fatalf("annotations after the restore: %v", cm.Annotations)
	}
}

func TestTerminatingNamespaceGetsNoBundle(t *testing.T) {
	cs := start(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "going"}, Status: corev1.NamespaceStatus{Phase: corev1.NamespaceTerminating}})
	// A namespace created later is handled after "going": once it has its
	// bundle, "going" has been handled too.
	if _, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "later"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "bundle in the later namespace", func() bool { _, ok := bundle(cs, "later"); return ok })
	if _, ok := bundle(cs, "going"); ok {
		t.Fatal("published into a terminating namespace")
	}
}

func TestNoBundleIsAConfigError(t *testing.T) {
	cs := fake.NewClientset()
	if _, err := New(cs, informers.NewSharedInformerFactory(cs, 0), slog.New(slog.DiscardHandler), nil); err == nil {
		t.Fatal("New accepted an empty CA bundle")
	}
}
