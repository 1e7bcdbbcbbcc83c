package apiserver_test

import (
	"context"
	"testing"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

func TestNodeAuthorizerAndNodeRestriction(t *testing.T) {
	s := apiservertest.Start(t, apiservertest.Options{})
	ctx := context.Background()
	admin := kubernetes.NewForConfigOrDie(s.Config)
	n1 := clientFor(t, s, "system:node:n1", "system:nodes")
	for _, name := range []string{"n1", "n2"} {
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"team": "a"}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"mine", "other"} {
		if _, err := admin.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, StringData: map[string]string{"k": "v"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mkPod := func(name, node, secret string) {
		t.Helper()
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "c", Image: "img"}},
			Volumes:    []corev1.Volume{{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: secret}}}},
		}}
		if _, err := admin.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mkPod("on-n1", "n1", "mine")
	mkPod("on-n2", "n2", "other")

	// The node reads its pod's Secret (once the graph has the pod), not another's.
	within(t, "own pod's secret readable", 2*time.Second, func() bool {
		_, err := n1.CoreV1().Secrets("default").Get(ctx, "mine", metav1.GetOptions{})
		return err == nil
	})
	if _, err := n1.CoreV1().Secrets("default").Get(ctx, "other", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node reading an unrelated secret: %v, want 403", err)
	}
	if _, err := n1.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node listing secrets: %v, want 403", err)
	}
	// Its own Node: readable and writable; another's: neither.
	if _, err := n1.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{}); err != nil {
		t.Errorf("node reading itself: %v", err)
	}
	// Reading other Nodes is granted by RBAC (waggle:node-routes: the node
	// agent routes to their pod CIDRs), writing them is not.
	if _, err := n1.CoreV1().Nodes().Get(ctx, "n2", metav1.GetOptions{}); err != nil {
		t.Errorf("node reading another node: %v", err)
	}
	patch := []byte(`{"metadata":{"labels":{"team":"b"}}}`)
	if _, err := n1.CoreV1().Nodes().Patch(ctx, "n2", types.MergePatchType, patch, metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node patching another node: %v, want 403", err)
	}
	if err := n1.CoreV1().Nodes().Delete(ctx, "n2", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node deleting a node: %v, want 403", err)
	}
	restricted := []byte(`{"metadata":{"labels":{"node-restriction.kubernetes.io/pool":"secure"}}}`)
	if _, err := n1.CoreV1().Nodes().Patch(ctx, "n1", types.MergePatchType, restricted, metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node setting a node-restriction label: %v, want 403", err)
	}
	if _, err := n1.CoreV1().Nodes().Patch(ctx, "n1", types.MergePatchType, []byte(`{"metadata":{"labels":{"team":"c"}}}`), metav1.PatchOptions{}); err != nil {
		t.Errorf("node relabelling itself: %v", err)
	}
	// Pods: only mirror pods bound to itself; only its pods' status.
	plain := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sneaky", Namespace: "default"}, Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "img"}}}}
	if _, err := n1.CoreV1().Pods("default").Create(ctx, plain, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node creating a non-mirror pod: %v, want 403", err)
	}
	mirror := plain.DeepCopy()
	mirror.Name, mirror.Annotations = "static-n1", map[string]string{corev1.MirrorPodAnnotationKey: "x"}
	if _, err := n1.CoreV1().Pods("default").Create(ctx, mirror, metav1.CreateOptions{}); err != nil {
		t.Errorf("node creating its mirror pod: %v", err)
	}
	mirror2 := mirror.DeepCopy()
	mirror2.Name, mirror2.Spec.NodeName = "static-n2", "n2"
	if _, err := n1.CoreV1().Pods("default").Create(ctx, mirror2, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node creating a mirror pod for another node: %v, want 403", err)
	}
	other, err := admin.CoreV1().Pods("default").Get(ctx, "on-n2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other.Status.Phase = corev1.PodFailed
	if _, err := n1.CoreV1().Pods("default").UpdateStatus(ctx, other, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node updating another node's pod status: %v, want 403", err)
	}
	if err := n1.CoreV1().Pods("default").Delete(ctx, "on-n2", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node deleting another node's pod: %v, want 403", err)
	}
	// Nothing changed.
	if n2, err := admin.CoreV1().Nodes().Get(ctx, "n2", metav1.GetOptions{}); err != nil || n2.Labels["team"] != "a" {
		t.Errorf("n2 changed: %v %v", n2.Labels, err)
	}
	if p, err := admin.CoreV1().Pods("default").Get(ctx, "on-n2", metav1.GetOptions{}); err != nil || p.Status.Phase == corev1.PodFailed || p.DeletionTimestamp != nil {
		t.Errorf("on-n2 changed: %v %v", p.Status.Phase, err)
	}
	for _, name := range []string{"sneaky", "static-n2"} {
		if _, err := admin.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("refused pod %s stored: %v", name, err)
		}
	}
	// Pod lists only for itself.
	if _, err := n1.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("node listing all pods: %v, want 403", err)
	}
	if _, err := n1.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=n1"}); err != nil {
		t.Errorf("node listing its pods: %v", err)
	}
}
