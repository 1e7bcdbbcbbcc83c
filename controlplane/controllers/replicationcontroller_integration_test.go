package controllers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A ReplicationController manifest of the kubectl rolling-update era.
const classicRC = `apiVersion: v1
kind: ReplicationController
metadata:
  name: nginx
spec:
  replicas: 3
  selector:
    app: nginx
  template:
    metadata:
      labels:
        app: nginx
    spec:
      containers:
      - name: nginx
        image: nginx:1.7.9
        ports:
        - containerPort: 80
`

func TestReplicationControllerKeepsReplicasAndScalesThroughKubectl(t *testing.T) {
	c := newCluster(t)
	requiresResource(t, c, "v1", "replicationcontrollers")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c.startKubelets(ctx, 2, nil)
	c.startManager("cm-0", nil)
	f := filepath.Join(t.TempDir(), "rc.yaml")
	if err := os.WriteFile(f, []byte(classicRC), 0o644); err != nil {
		t.Fatal(err)
	}
	c.kubectlOK("apply", "-f", f)
	rc, err := c.cs.CoreV1().ReplicationControllers("default").Get(ctx, "nginx", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := func(n int) {
		t.Helper()
		eventually(t, 60*time.Second, func() error {
			got, err := c.cs.CoreV1().ReplicationControllers("default").Get(ctx, "nginx", metav1.GetOptions{})
			if err != nil {
				return err
			}
			m, err := c.images(ctx, rc.UID)
			if err != nil {
				return err
			}
			if len(m) != n || got.Status.ReadyReplicas != int32(n) || got.Status.Replicas != int32(n) || got.Status.ObservedGeneration != got.Generation {
				return fmt.Errorf("%d pods, status %+v", len(m), got.Status)
			}
			return nil
		})
	}
	want(3)
	// A deleted pod is replaced.
	m, _ := c.images(ctx, rc.UID)
	for name := range m {
		if err := c.cs.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		break
	}
	want(3)
	c.kubectlOK("scale", "rc/nginx", "--replicas=1")
	want(1)
	if out := c.kubectlOK("get", "events", "--field-selector", "involvedObject.kind=ReplicationController,involvedObject.name=nginx"); !strings.Contains(out, "SuccessfulCreate") || !strings.Contains(out, "SuccessfulDelete") {
		t.Fatalf("events:\n%s", out)
	}
	if out := c.kubectlOK("get", "rc", "nginx"); !strings.Contains(out, "nginx   1         1         1") {
		t.Fatalf("kubectl get rc:\n%s", out)
	}
}
