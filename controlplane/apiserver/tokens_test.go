package apiserver_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/waggle-io/waggle/controlplane/apiserver"
	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/controlplane/apiserver/pki"
	"github.com/waggle-io/waggle/controlplane/apiserver/serviceaccount"
	"github.com/waggle-io/waggle/internal/testutil"
)

// tokenServer is a test server with the ServiceAccount admission plugin on.
func tokenServer(t *testing.T) (*apiservertest.Server, *kubernetes.Clientset) {
	t.Helper()
	testutil.Privileged(t)
	s := apiservertest.Start(t, apiservertest.Options{Configure: func(c *apiserver.Config) { c.DisableAdmissionPlugins = nil }})
	return s, kubernetes.NewForConfigOrDie(s.Config)
}

// tokenClient authenticates to s with only a bearer token.
func tokenClient(s *apiservertest.Server, tok string) *kubernetes.Clientset {
	rc := rest.AnonymousClientConfig(s.Config)
	rc.BearerToken = tok
	return kubernetes.NewForConfigOrDie(rc)
}

// must returns obj, or ends the test (a panic, which the test reports
// with its stack) when a setup call failed.
func must[T any](obj T, err error) T {
	if err != nil {
		panic(err)
	}
	return obj
}

func whoami(t *testing.T, cs *kubernetes.Clientset) (authenticationv1.UserInfo, error) {
	t.Helper()
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(context.Background(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return authenticationv1.UserInfo{}, err
	}
	return r.Status.UserInfo, nil
}

func TestServiceAccountAdmissionMountsTheProjectedTokenVolume(t *testing.T) {
	s, admin := tokenServer(t)
	ctx := context.Background()
	must(admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team"}}, metav1.CreateOptions{}))
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{{Name: "init", Image: "busybox"}},
		Containers:     []corev1.Container{{Name: "c", Image: "busybox"}}}}

	// No default ServiceAccount yet: refused as upstream, nothing stored.
	_, err := admin.CoreV1().Pods("team").Create(ctx, pod, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `error looking up service account team/default: serviceaccount "default" not found`) {
		t.Fatalf("pod without a default ServiceAccount: want 403 error looking up service account, got %v", err)
	}
	if _, err := admin.CoreV1().Pods("team").Get(ctx, "p", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("refused pod was stored: %v", err)
	}

	must(admin.CoreV1().ServiceAccounts("team").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"},
		ImagePullSecrets: []corev1.LocalObjectReference{{Name: "regcred"}}}, metav1.CreateOptions{}))
	got := must(admin.CoreV1().Pods("team").Create(ctx, pod, metav1.CreateOptions{}))
	if got.Spec.ServiceAccountName != "default" {
		t.Errorf("serviceAccountName = %q, want default", got.Spec.ServiceAccountName)
	}
	if len(got.Spec.ImagePullSecrets) != 1 || got.Spec.ImagePullSecrets[0].Name != "regcred" {
		t.Errorf("imagePullSecrets = %v, want the ServiceAccount's", got.Spec.ImagePullSecrets)
	}
	if len(got.Spec.Volumes) != 1 || !strings.HasPrefix(got.Spec.Volumes[0].Name, "kube-api-access-") || got.Spec.Volumes[0].Projected == nil {
		t.Fatalf("volumes = %+v, want one projected kube-api-access-*", got.Spec.Volumes)
	}
	v := got.Spec.Volumes[0]
	src := v.Projected.Sources
	if len(src) != 3 || src[0].ServiceAccountToken == nil || *src[0].ServiceAccountToken.ExpirationSeconds != 3607 || src[0].ServiceAccountToken.Path != "token" ||
		src[1].ConfigMap == nil || src[1].ConfigMap.Name != "kube-root-ca.crt" || src[1].ConfigMap.Items[0].Path != "ca.crt" ||
		src[2].DownwardAPI == nil || src[2].DownwardAPI.Items[0].FieldRef.FieldPath != "metadata.namespace" || *v.Projected.DefaultMode != 0o644 {
		t.Errorf("projected sources = %+v, want token (3607 s), kube-root-ca.crt ca.crt, namespace; mode 0644", src)
	}
	for _, c := range append(got.Spec.InitContainers, got.Spec.Containers...) {
		if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].Name != v.Name || c.VolumeMounts[0].MountPath != "/var/run/secrets/kubernetes.io/serviceaccount" || !c.VolumeMounts[0].ReadOnly {
			t.Errorf("container %s mounts %+v, want %s read-only at the serviceaccount path", c.Name, c.VolumeMounts, v.Name)
		}
	}

	// automountServiceAccountToken: the pod's false wins; the ServiceAccount's false applies otherwise.
	no, yes := false, true
	must(admin.CoreV1().ServiceAccounts("team").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "quiet"}, AutomountServiceAccountToken: &no}, metav1.CreateOptions{}))
	for _, tc := range []struct {
		name, sa  string
		automount *bool
		want      int
	}{{"pod-off", "default", &no, 0}, {"sa-off", "quiet", nil, 0}, {"pod-on-sa-off", "quiet", &yes, 1}} {
		p := pod.DeepCopy()
		p.Name, p.Spec.ServiceAccountName, p.Spec.AutomountServiceAccountToken = tc.name, tc.sa, tc.automount
		got := must(admin.CoreV1().Pods("team").Create(ctx, p, metav1.CreateOptions{}))
		if len(got.Spec.Volumes) != tc.want {
			t.Errorf("%s: %d volumes, want %d", tc.name, len(got.Spec.Volumes), tc.want)
		}
	}
	p := pod.DeepCopy()
	p.Name, p.Spec.ServiceAccountName = "ghost-sa", "ghost"
	if _, err := admin.CoreV1().Pods("team").Create(ctx, p, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("pod naming a missing ServiceAccount: want 403, got %v", err)
	}
	_ = s
}

func TestServiceAccountTokensAuthenticateBoundToTheLiveObject(t *testing.T) {
	s, admin := tokenServer(t)
	ctx := context.Background()
	must(admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team"}}, metav1.CreateOptions{}))
	sa := must(admin.CoreV1().ServiceAccounts("team").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "bot"}}, metav1.CreateOptions{}))
	pod := must(admin.CoreV1().Pods("team").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "worker"},
		Spec: corev1.PodSpec{ServiceAccountName: "bot", Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}, metav1.CreateOptions{}))

	tr := must(admin.CoreV1().ServiceAccounts("team").CreateToken(ctx, "bot", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: "worker", UID: pod.UID}}}, metav1.CreateOptions{}))
	if tr.Status.Token == "" || time.Until(tr.Status.ExpirationTimestamp.Time) < 59*time.Minute {
		t.Fatalf("token request status = %+v, want a token valid for an hour", tr.Status)
	}
	bot := tokenClient(s, tr.Status.Token)
	u, err := whoami(t, bot)
	if err != nil {
		t.Fatalf("whoami with the token: %v", err)
	}
	if u.Username != "system:serviceaccount:team:bot" || u.UID != string(sa.UID) ||
		strings.Join(u.Groups, ",") != "system:serviceaccounts,system:serviceaccounts:team,system:authenticated" ||
		u.Extra["authentication.kubernetes.io/pod-name"][0] != "worker" || u.Extra["authentication.kubernetes.io/pod-uid"][0] != string(pod.UID) {
		t.Errorf("user = %+v", u)
	}

	// No binding: 403; a RoleBinding to list pods: allowed, exactly that.
	if _, err := bot.CoreV1().Pods("team").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("list pods without a binding: want 403, got %v", err)
	}
	must(admin.RbacV1().Roles("team").Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "pod-lister"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}}}}, metav1.CreateOptions{}))
	must(admin.RbacV1().RoleBindings("team").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "bot-lists"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "pod-lister"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "bot", Namespace: "team"}}}, metav1.CreateOptions{}))
	within(t, "the binding takes effect", 30*time.Second, func() bool {
		_, err := bot.CoreV1().Pods("team").List(ctx, metav1.ListOptions{})
		return err == nil
	})

	// TokenReview by the admin: who it is; for another audience: not authenticated.
	rev := must(admin.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: tr.Status.Token}}, metav1.CreateOptions{}))
	if !rev.Status.Authenticated || rev.Status.User.Username != "system:serviceaccount:team:bot" || len(rev.Status.Audiences) == 0 {
		t.Errorf("token review = %+v", rev.Status)
	}
	rev = must(admin.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: tr.Status.Token, Audiences: []string{"vault"}}}, metav1.CreateOptions{}))
	if rev.Status.Authenticated || rev.Status.Error == "" {
		t.Errorf("token review for audience vault = %+v, want unauthenticated with an error", rev.Status)
	}

	// A token for another audience, an expired one: 401, nothing written.
	other := must(admin.CoreV1().ServiceAccounts("team").CreateToken(ctx, "bot", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"vault"}}}, metav1.CreateOptions{}))
	expired, err := s.Tokens().Issue(ctx, sa, serviceaccount.Bound{}, -300, 0, s.Tokens().APIAudiences())
	if err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "from-a-bad-token"}}
	for name, tok := range map[string]string{"wrong audience": other.Status.Token, "expired": expired, "garbage": "not-a-jwt"} {
		if _, err := tokenClient(s, tok).CoreV1().ConfigMaps("team").Create(ctx, cm, metav1.CreateOptions{}); !apierrors.IsUnauthorized(err) {
			t.Errorf("%s token: want 401, got %v", name, err)
		}
	}

	// The bound pod deleted: its token stops working at once.
	if err := admin.CoreV1().Pods("team").Delete(ctx, "worker", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	within(t, "the pod is gone", 30*time.Second, func() bool {
		_, err := admin.CoreV1().Pods("team").Get(ctx, "worker", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	// The server checks the bound pod in its watch cache (upstream: its
	// informers), which follows etcd within milliseconds.
	within(t, "the token of the deleted pod is refused", 30*time.Second, func() bool {
		_, err := bot.CoreV1().ConfigMaps("team").Create(ctx, cm, metav1.CreateOptions{})
		return apierrors.IsUnauthorized(err)
	})
	// The positive marker: a write after the refused ones is seen, theirs are not.
	must(admin.CoreV1().ConfigMaps("team").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "marker"}}, metav1.CreateOptions{}))
	list := must(admin.CoreV1().ConfigMaps("team").List(ctx, metav1.ListOptions{}))
	for _, c := range list.Items {
		if c.Name == cm.Name {
			t.Errorf("a refused token wrote %s", c.Name)
		}
	}
}

func TestTokenRequestValidatesAsUpstream(t *testing.T) {
	_, admin := tokenServer(t)
	ctx := context.Background()
	must(admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team"}}, metav1.CreateOptions{}))
	must(admin.CoreV1().ServiceAccounts("team").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "bot"}}, metav1.CreateOptions{}))
	must(admin.CoreV1().ServiceAccounts("team").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}))
	other := must(admin.CoreV1().Pods("team").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "other"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}, metav1.CreateOptions{}))
	short := int64(60)
	for name, tc := range map[string]struct {
		sa   string
		spec authenticationv1.TokenRequestSpec
		want func(error) bool
	}{
		"under 10 minutes":     {"bot", authenticationv1.TokenRequestSpec{ExpirationSeconds: &short}, apierrors.IsInvalid},
		"missing sa":           {"ghost", authenticationv1.TokenRequestSpec{}, apierrors.IsNotFound},
		"pod of another sa":    {"bot", authenticationv1.TokenRequestSpec{BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: "other"}}, apierrors.IsBadRequest},
		"stale pod uid":        {"default", authenticationv1.TokenRequestSpec{BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: "other", UID: "nope"}}, apierrors.IsConflict},
		"unsupported kind":     {"bot", authenticationv1.TokenRequestSpec{BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "ConfigMap", APIVersion: "v1", Name: "x"}}, apierrors.IsBadRequest},
		"missing bound secret": {"bot", authenticationv1.TokenRequestSpec{BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Secret", APIVersion: "v1", Name: "x"}}, apierrors.IsNotFound},
	} {
		_, err := admin.CoreV1().ServiceAccounts("team").CreateToken(ctx, tc.sa, &authenticationv1.TokenRequest{Spec: tc.spec}, metav1.CreateOptions{})
		if !tc.want(err) {
			t.Errorf("%s: got %v", name, err)
		}
	}
	_ = other
}

func TestNodeMayRequestTokensOnlyForItsOwnPodsServiceAccount(t *testing.T) {
	s, admin := tokenServer(t)
	ctx := context.Background()
	must(admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team"}}, metav1.CreateOptions{}))
	for _, n := range []string{"bot", "other", "default"} {
		must(admin.CoreV1().ServiceAccounts("team").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}))
	}
	for _, n := range []string{"n1", "n2"} {
		must(admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}))
	}
	mine := must(admin.CoreV1().Pods("team").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "mine"},
		Spec: corev1.PodSpec{NodeName: "n1", ServiceAccountName: "bot", Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}, metav1.CreateOptions{}))
	theirs := must(admin.CoreV1().Pods("team").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "theirs"},
		Spec: corev1.PodSpec{NodeName: "n2", ServiceAccountName: "bot", Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}, metav1.CreateOptions{}))
	node := clientFor(t, s, "system:node:n1", "system:nodes")
	req := func(sa string, p *corev1.Pod) error {
		ref := &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID}
		_, err := node.CoreV1().ServiceAccounts("team").CreateToken(ctx, sa, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{BoundObjectRef: ref}}, metav1.CreateOptions{})
		return err
	}
	var err error
	within(t, "the node graph has its pod", 30*time.Second, func() bool { err = req("bot", mine); return err == nil })
	if err := req("other", mine); !apierrors.IsForbidden(err) {
		t.Errorf("token for another ServiceAccount than the pod's: want 403, got %v", err)
	}
	if err := req("bot", theirs); !apierrors.IsForbidden(err) {
		t.Errorf("token for a pod on another node: want 403, got %v", err)
	}
	if _, err := node.CoreV1().ServiceAccounts("team").CreateToken(ctx, "bot", &authenticationv1.TokenRequest{}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("unbound token from a node: want 403, got %v", err)
	}
	// The node's token carries the node, as upstream infers it.
	tr := must(admin.CoreV1().ServiceAccounts("team").CreateToken(ctx, "bot", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: "mine", UID: mine.UID}}}, metav1.CreateOptions{}))
	u, err := whoami(t, tokenClient(s, tr.Status.Token))
	if err != nil {
		t.Fatal(err)
	}
	if u.Extra["authentication.kubernetes.io/node-name"][0] != "n1" {
		t.Errorf("extra = %v, want node-name n1", u.Extra)
	}
}

func TestLegacySecretTokensWorkWhileTheSecretExists(t *testing.T) {
	s, admin := tokenServer(t)
	ctx := context.Background()
	must(admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team"}}, metav1.CreateOptions{}))
	sa := must(admin.CoreV1().ServiceAccounts("team").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "bot"}}, metav1.CreateOptions{}))
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bot-token", Annotations: map[string]string{corev1.ServiceAccountNameKey: "bot", corev1.ServiceAccountUIDKey: string(sa.UID)}},
		Type: corev1.SecretTypeServiceAccountToken}
	gen, err := serviceaccount.LegacyGenerator(filepath.Join(s.DataDir, "pki", pki.ServiceAccountKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := gen(ctx, sa, sec)
	if err != nil {
		t.Fatal(err)
	}
	sec.Data = map[string][]byte{corev1.ServiceAccountTokenKey: []byte(tok)}
	must(admin.CoreV1().Secrets("team").Create(ctx, sec, metav1.CreateOptions{}))
	u, err := whoami(t, tokenClient(s, tok))
	if err != nil || u.Username != "system:serviceaccount:team:bot" {
		t.Fatalf("legacy token: %+v, %v", u, err)
	}
	within(t, "the secret is labelled last-used today", 30*time.Second, func() bool {
		got, err := admin.CoreV1().Secrets("team").Get(ctx, "bot-token", metav1.GetOptions{})
		return err == nil && got.Labels[serviceaccount.LastUsedLabel] == time.Now().UTC().Format("2006-01-02")
	})
	if err := admin.CoreV1().Secrets("team").Delete(ctx, "bot-token", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	within(t, "the deleted secret's token is refused", 30*time.Second, func() bool {
		_, err := whoami(t, tokenClient(s, tok))
		return apierrors.IsUnauthorized(err)
	})
}

func TestOIDCDiscoveryServesTheIssuerAndKeys(t *testing.T) {
	s, admin := tokenServer(t)
	ctx := context.Background()
	must(admin.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "bot"}}, metav1.CreateOptions{}))
	tr := must(admin.CoreV1().ServiceAccounts("default").CreateToken(ctx, "bot", &authenticationv1.TokenRequest{}, metav1.CreateOptions{}))
	get := func(tok, path string) (int, []byte) {
		rc := rest.AnonymousClientConfig(s.Config)
		rc.BearerToken = tok
		c, err := rest.HTTPClientFor(rc)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Get(rc.Host + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	code, b := get(tr.Status.Token, "/.well-known/openid-configuration")
	var doc struct {
		Issuer  string   `json:"issuer"`
		JWKSURI string   `json:"jwks_uri"`
		Algs    []string `json:"id_token_signing_alg_values_supported"`
	}
	if code != http.StatusOK || json.Unmarshal(b, &doc) != nil || doc.Issuer != serviceaccount.DefaultIssuer || !strings.HasSuffix(doc.JWKSURI, "/openid/v1/jwks") || len(doc.Algs) != 1 || doc.Algs[0] != "RS256" {
		t.Errorf("discovery: %d %s", code, b)
	}
	code, b = get(tr.Status.Token, "/openid/v1/jwks")
	var jwks struct {
		Keys []struct {
			Kty, Alg, Use, Kid string
		} `json:"keys"`
	}
	if code != http.StatusOK || json.Unmarshal(b, &jwks) != nil || len(jwks.Keys) != 1 || jwks.Keys[0].Kty != "RSA" || jwks.Keys[0].Kid == "" {
		t.Errorf("jwks: %d %s", code, b)
	}
	// A user without system:service-account-issuer-discovery: 403.
	if code, _ := get("", "/openid/v1/jwks"); code != http.StatusUnauthorized {
		t.Errorf("jwks without credentials (anonymous auth off): %d, want 401", code)
	}
}
