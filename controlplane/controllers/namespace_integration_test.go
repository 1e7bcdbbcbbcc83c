package controllers

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Deleting a namespace through the controller-manager (its typed clients in
// protobuf, the namespace controller's dynamic client in JSON) empties it
// and removes it.
func TestNamespaceDeletionThroughTheManagerEmptiesIt(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	c.startManager("cm-0", nil)

	if _, err := c.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "doomed"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.cs.CoreV1().ConfigMaps("doomed").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm"}}, metav1.CreateOptions{}); err != nil {
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
}
