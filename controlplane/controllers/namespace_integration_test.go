package controllers

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
)

// Deleting a namespace through the controller-manager (its typed clients in
// protobuf, the namespace controller's dynamic client in JSON) empties it
// of built-in and custom resources (found by discovery) and removes it;
// also as the namespace-controller service account, whose role must reach
// custom resources.
func TestNamespaceDeletionThroughTheManagerEmptiesIt(t *testing.T) {
	t.Run("AdminCredentials", func(t *testing.T) { testNamespaceDeletion(t, false) })
	t.Run("ServiceAccountCredentials", func(t *testing.T) { testNamespaceDeletion(t, true) })
}

func testNamespaceDeletion(t *testing.T, serviceAccounts bool) {
	c := newCluster(t)
	ctx := context.Background()
	thingies := schema.GroupVersionResource{Group: "ns.waggle.io", Version: "v1", Resource: "thingies"}
	apiservertest.CreateNamespacedCRD(t, c.rc, thingies, "Thingy")
	dyn, err := dynamic.NewForConfig(c.rc)
	if err != nil {
		t.Fatal(err)
	}
	c.startManager("cm-0", func(cfg *Config) { cfg.UseServiceAccountCredentials = serviceAccounts })

	if _, err := c.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "doomed"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.cs.CoreV1().ConfigMaps("doomed").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	thingy := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "ns.waggle.io/v1", "kind": "Thingy",
		"metadata": map[string]any{"name": "t"}}}
	if _, err := dyn.Resource(thingies).Namespace("doomed").Create(ctx, thingy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.cs.CoreV1().Namespaces().Delete(ctx, "doomed", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() error {
		ns, err := c.cs.CoreV1().Namespaces().Get(ctx, "doomed", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("namespace still there: phase %s, conditions %+v", ns.Status.Phase, ns.Status.Conditions)
	})
	if _, err := c.cs.CoreV1().ConfigMaps("doomed").Get(ctx, "cm", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the namespace's ConfigMap: %v, want NotFound", err)
	}
	// Listed across namespaces: what etcd still holds.
	all, err := dyn.Resource(thingies).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range all.Items {
		t.Errorf("custom resource %s/%s left after its namespace went", it.GetNamespace(), it.GetName())
	}
}
