package apiserver_test

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/waggle-io/waggle/internal/testutil"

	"github.com/waggle-io/waggle/controlplane/apiserver"
	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// BenchmarkAuthorizationCost measures what authorization adds to a GET:
// one server with Node,RBAC and 1,000 ClusterRoleBindings (the user's own
// grant among them), one with AlwaysAllow, the same GET by the same
// non-admin user against each, interleaved so load moves both alike.
//
//	go test -run '^$' -bench BenchmarkAuthorizationCost -benchtime 1x ./controlplane/apiserver/
func BenchmarkAuthorizationCost(b *testing.B) {
	ctx := context.Background()
	setup := func(modes []string) *kubernetes.Clientset {
		s := apiservertest.Start(b, apiservertest.Options{Configure: func(c *apiserver.Config) { c.AuthorizationModes = modes }})
		admin := kubernetes.NewForConfigOrDie(s.Config)
		if _, err := admin.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cfg"}, Data: map[string]string{"k": "v"}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		if modes[0] != apiserver.ModeAlwaysAllow {
			if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "cm-reader"},
				Rules: []rbacv1.PolicyRule{{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"configmaps"}}}}, metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
			for i := 0; i < 1000; i++ {
				user := fmt.Sprintf("user-%d", i)
				if i == 500 {
					user = "bench"
				}
				if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("b-%d", i)},
					RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cm-reader"},
					Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}, {APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: fmt.Sprintf("group-%d", i)}}}, metav1.CreateOptions{}); err != nil {
					b.Fatal(err)
				}
			}
		}
		rc := s.UserConfig(b, "bench", "team-a", "team-b")
		rc.QPS, rc.Burst = -1, 0
		cs := kubernetes.NewForConfigOrDie(rc)
		testutil.Eventually(b, 10*time.Second, func() error {
			_, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "cfg", metav1.GetOptions{})
			return err
		})
		return cs
	}
	rbacCS := setup(apiserver.DefaultAuthorizationModes)
	allowCS := setup([]string{apiserver.ModeAlwaysAllow})
	const n = 3000
	get := func(cs *kubernetes.Clientset) time.Duration {
		t0 := time.Now()
		if _, err := cs.CoreV1().ConfigMaps("default").Get(ctx, "cfg", metav1.GetOptions{ResourceVersion: "0"}); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	for i := 0; i < b.N; i++ {
		var r, a []time.Duration
		for j := 0; j < n; j++ {
			r = append(r, get(rbacCS))
			a = append(a, get(allowCS))
		}
		pct := func(d []time.Duration, p float64) time.Duration {
			sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
			return d[int(float64(len(d)-1)*p)]
		}
		rp50, rp99, ap50, ap99 := pct(r, .5), pct(r, .99), pct(a, .5), pct(a, .99)
		b.Logf("GET configmap, %d each, interleaved: RBAC+1000 CRBs p50 %v p99 %v | AlwaysAllow p50 %v p99 %v | added p50 %+.1f%% p99 %+.1f%%",
			n, rp50, rp99, ap50, ap99, 100*(float64(rp50)/float64(ap50)-1), 100*(float64(rp99)/float64(ap99)-1))
	}
}
