package kubelet_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/cert"
)

func testCA(t *testing.T, cn string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	c, err := cert.NewSelfSignedCACert(cert.Config{CommonName: cn}, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}))
}

// TestClusterTrustBundleProjection mounts ClusterTrustBundles through a
// projected volume as upstream's kubelet does: one by name, a signer's
// bundles picked by a label selector (both anchors, not the unlabelled
// one), an optional source that matches nothing (an empty file); and a
// pod whose non-optional source matches nothing does not start.
func TestClusterTrustBundleProjection(t *testing.T) {
	n := newNode(t, nil)
	ctx := context.Background()
	const signer = "example.com/sec-signer"
	caA, caB, caC, caN := testCA(t, "a"), testCA(t, "b"), testCA(t, "c"), testCA(t, "named")
	for _, b := range []certificatesv1.ClusterTrustBundle{
		{ObjectMeta: metav1.ObjectMeta{Name: "example.com:sec-signer:a", Labels: map[string]string{"pick": "yes"}}, Spec: certificatesv1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: caA}},
		{ObjectMeta: metav1.ObjectMeta{Name: "example.com:sec-signer:b", Labels: map[string]string{"pick": "yes"}}, Spec: certificatesv1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: caB}},
		{ObjectMeta: metav1.ObjectMeta{Name: "example.com:sec-signer:c"}, Spec: certificatesv1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: caC}},
		{ObjectMeta: metav1.ObjectMeta{Name: "sec-named"}, Spec: certificatesv1.ClusterTrustBundleSpec{TrustBundle: caN}},
	} {
		if _, err := n.client.CertificatesV1().ClusterTrustBundles().Create(ctx, &b, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	strp := func(s string) *string { return &s }
	yes := true
	const dir = "/ctb"
	n.create(echoPod(n, "ctb", func(p *v1.Pod) {
		p.Spec.Volumes = []v1.Volume{{Name: "ctb", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
			{ClusterTrustBundle: &v1.ClusterTrustBundleProjection{Name: strp("sec-named"), Path: "named.pem"}},
			{ClusterTrustBundle: &v1.ClusterTrustBundleProjection{SignerName: strp(signer), LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pick": "yes"}}, Path: "signer.pem"}},
			{ClusterTrustBundle: &v1.ClusterTrustBundleProjection{Name: strp("sec-missing"), Optional: &yes, Path: "missing.pem"}},
		}}}}}
		p.Spec.Containers[0].VolumeMounts = []v1.VolumeMount{{Name: "ctb", MountPath: dir, ReadOnly: true}}
	}))
	n.waitPod("ctb", "running", 60*time.Second, runningReady)
	cat := func(f string) string {
		t.Helper()
		out, stderr, err := n.exec("ctb", "echo", true, "", "/waggle-echo", "cat", dir+"/"+f)
		if err != nil {
			t.Fatalf("cat %s: %v %s", f, err, stderr)
		}
		return out
	}
	if got := cat("named.pem"); got != caN {
		t.Errorf("named.pem = %q, want the named bundle's anchor", got)
	}
	got := cat("signer.pem")
	if !strings.Contains(got, caA) || !strings.Contains(got, caB) || strings.Contains(got, caC) {
		t.Errorf("signer.pem = %q, want exactly the anchors of the two labelled bundles", got)
	}
	if got := cat("missing.pem"); got != "" {
		t.Errorf("missing.pem = %q, want empty (optional, nothing matches)", got)
	}

	// Not optional and nothing matches: the volume cannot be set up and the
	// pod does not start (upstream: FailedMount, the pod stays Pending).
	n.create(echoPod(n, "ctb-required", func(p *v1.Pod) {
		p.Spec.Volumes = []v1.Volume{{Name: "ctb", VolumeSource: v1.VolumeSource{Projected: &v1.ProjectedVolumeSource{Sources: []v1.VolumeProjection{
			{ClusterTrustBundle: &v1.ClusterTrustBundleProjection{SignerName: strp(signer), LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pick": "nothing"}}, Path: "x.pem"}},
		}}}}}
		p.Spec.Containers[0].VolumeMounts = []v1.VolumeMount{{Name: "ctb", MountPath: dir, ReadOnly: true}}
	}))
	waitFor(t, 45*time.Second, "a FailedMount event for ctb-required", func() (bool, string) {
		evs, err := n.client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=ctb-required"})
		if err != nil {
			return false, err.Error()
		}
		for _, e := range evs.Items {
			if strings.Contains(e.Message, "matched zero ClusterTrustBundles") {
				return true, ""
			}
		}
		return false, "no event yet"
	})
	p, err := n.client.CoreV1().Pods("default").Get(ctx, "ctb-required", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != v1.PodPending {
		t.Errorf("ctb-required phase %s, want Pending", p.Status.Phase)
	}
	// Upstream's Ready condition for a pod whose volumes did not mount (the
	// conformance spec matches its reason and message exactly).
	waitFor(t, 45*time.Second, "ctb-required's Ready condition", func() (bool, string) {
		p, err := n.client.CoreV1().Pods("default").Get(ctx, "ctb-required", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodReady {
				return c.Status == v1.ConditionFalse && c.Reason == "ContainersNotReady" && c.Message == "containers with unready status: [echo]", fmt.Sprintf("%+v", c)
			}
		}
		return false, "no Ready condition"
	})
}
