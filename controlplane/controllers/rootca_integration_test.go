package controllers

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/waggle-io/waggle/internal/testutil"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/waggle-io/waggle/controlplane/controllers/rootcacertpublisher"
)

// Against the real API server (RBAC on), the controller-manager publishes
// the CA it trusts the API server with as kube-root-ca.crt in every
// namespace, including one created after it started.
func TestRootCAIsPublishedInEveryNamespace(t *testing.T) {
	c := newCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c.startManager("cm-0", nil)
	want := c.rc.TLSClientConfig.CAData
	if len(want) == 0 {
		b, err := os.ReadFile(c.rc.TLSClientConfig.CAFile)
		if err != nil {
			t.Fatal(err)
		}
		want = b
	}
	if _, err := c.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "later"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"default", "kube-system", "later"} {
		testutil.Eventually(t, 60*time.Second, func() error {
			cm, err := c.cs.CoreV1().ConfigMaps(ns).Get(ctx, rootcacertpublisher.ConfigMapName, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("kube-root-ca.crt in %s: %w", ns, err)
			}
			if !bytes.Equal([]byte(cm.Data[rootcacertpublisher.DataKey]), want) {
				return fmt.Errorf("kube-root-ca.crt in %s does not hold the cluster CA", ns)
			}
			return nil
		})
	}
}
