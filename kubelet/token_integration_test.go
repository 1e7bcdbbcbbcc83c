package kubelet_test

import (
	"context"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/waggle-io/waggle/controlplane/apiserver"
)

// TestProjectedServiceAccountVolume runs a pod with the volume the
// ServiceAccount admission plugin adds: the kubelet fetches a pod-bound
// token through TokenRequest, the cluster CA and the namespace, swaps them
// in atomically (..data), and follows a change of the ConfigMap.
func TestProjectedServiceAccountVolume(t *testing.T) {
	n := newNode(t, nil)
	ctx := context.Background()
	const dir = apiserver.ServiceAccountTokenMountPath
	if _, err := n.client.CoreV1().ServiceAccounts("default").Create(ctx, &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "bot"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.client.CoreV1().ConfigMaps("default").Create(ctx, &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: apiserver.RootCAConfigMap}, Data: map[string]string{"ca.crt": "CA-1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := n.create(echoPod(n, "sa", func(p *v1.Pod) {
		p.Spec.ServiceAccountName = "bot"
		p.Spec.Volumes = []v1.Volume{{Name: "kube-api-access-test", VolumeSource: v1.VolumeSource{Projected: apiserver.TokenVolumeSource()}}}
		p.Spec.Containers[0].VolumeMounts = []v1.VolumeMount{{Name: "kube-api-access-test", MountPath: dir, ReadOnly: true}}
	}))
	n.waitPod("sa", "running", 60*time.Second, runningReady)
	cat := func(f string) string {
		t.Helper()
		out, stderr, err := n.exec("sa", "echo", true, "", "/waggle-echo", "cat", dir+"/"+f)
		if err != nil {
			t.Fatalf("cat %s: %v %s", f, err, stderr)
		}
		return out
	}
	if got := cat("namespace"); got != "default" {
		t.Errorf("namespace = %q", got)
	}
	if got := cat("ca.crt"); got != "CA-1" {
		t.Errorf("ca.crt = %q", got)
	}
	rev, err := n.client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: cat("token")}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !rev.Status.Authenticated || rev.Status.User.Username != "system:serviceaccount:default:bot" ||
		strings.Join(rev.Status.User.Extra["authentication.kubernetes.io/pod-uid"], "") != string(pod.UID) {
		t.Errorf("the mounted token reviews as %+v", rev.Status)
	}
	ls, _, err := n.exec("sa", "echo", true, "", "/waggle-echo", "ls", dir)
	if err != nil || !strings.Contains(ls, "..data\n") {
		t.Errorf("volume listing %q (%v): want the ..data symlink", ls, err)
	}

	// A new CA reaches the running container through the ..data swap.
	if _, err := n.client.CoreV1().ConfigMaps("default").Update(ctx, &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: apiserver.RootCAConfigMap}, Data: map[string]string{"ca.crt": "CA-2"}}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 90*time.Second, "the new ca.crt in the container", func() (bool, string) {
		out, _, _ := n.exec("sa", "echo", true, "", "/waggle-echo", "cat", dir+"/ca.crt")
		return out == "CA-2", out
	})
}
