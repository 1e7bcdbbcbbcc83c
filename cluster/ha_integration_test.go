package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/waggle-io/waggle/cluster/join"
	"github.com/waggle-io/waggle/controlplane/apiserver"
	"github.com/waggle-io/waggle/controlplane/apiserver/authz/rbac/bootstrap"
	"github.com/waggle-io/waggle/internal/testutil"
)

// haServer is `waggle up --node=false` for server i on 127.0.0.<i+2>.
func haServer(t *testing.T, i int, mutate func(*Config)) (string, func()) {
	t.Helper()
	ip := fmt.Sprintf("127.0.0.%d", i+2)
	c := Defaults()
	c.DataDir, c.Out, c.Node, c.LogLevel = filepath.Join(t.TempDir(), "s"), io.Discard, false, "error"
	c.NodeName, c.AdvertiseAddress, c.BindAddress, c.ComponentsBindAddress = fmt.Sprintf("s%d", i), ip, ip, ip
	c.SecurePort, c.SchedulerPort, c.ControllerManagerPort, c.EtcdPeerPort, c.EtcdClientPort = 26443, 26259, 26257, 26380, 26379
	mutate(&c)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, c) }()
	stop := func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("server %d: %v", i, err)
		}
	}
	kc := filepath.Join(c.DataDir, "admin.kubeconfig")
	testutil.Eventually(t, 90*time.Second, func() error {
		select {
		case err := <-done:
			t.Fatalf("server %d exited: %v", i, err)
		default:
		}
		rc, err := clientcmd.BuildConfigFromFlags("", kc)
		if err != nil {
			return err
		}
		cs, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return err
		}
		_, err = cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err
	})
	return kc, stop
}

// The first server starts the cluster (--cluster-init); a second joins with
// a server token: it pins the CA, receives the shared certificates, its etcd
// member joins (learner, then voter), and both API servers serve one store
// and list each other in the kubernetes endpoints. A node token cannot read
// the shared certificates.
func TestServerJoinsTheControlPlaneWithAToken(t *testing.T) {
	testutil.Privileged(t)
	kc1, stop1 := haServer(t, 0, func(c *Config) { c.ClusterInit = true })
	defer stop1()
	rc, err := clientcmd.BuildConfigFromFlags("", kc1)
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(rc)
	ctx := context.Background()
	nodeTok, err := join.CreateToken(ctx, cs, join.TokenOptions{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	srvTok, err := join.CreateToken(ctx, cs, join.TokenOptions{TTL: time.Hour, Groups: []string{bootstrap.BootstrapServerGroup}})
	if err != nil {
		t.Fatal(err)
	}
	ca := rc.TLSClientConfig.CAData
	hash, err := join.CACertHash(ca)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fetchControlPlaneBootstrap(ctx, &join.Discovered{Server: rc.Host, CAPEM: ca}, nodeTok); err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("a node token read the control plane certificates: %v", err)
	}
	kc2, stop2 := haServer(t, 1, func(c *Config) {
		c.Server, c.Token, c.CACertHashes = rc.Host, srvTok, []string{hash}
	})
	defer stop2()
	rc2, err := clientcmd.BuildConfigFromFlags("", kc2)
	if err != nil {
		t.Fatal(err)
	}
	cs2 := kubernetes.NewForConfigOrDie(rc2)
	b, err := cs2.Discovery().RESTClient().Get().AbsPath(apiserver.ControlPlaneBootstrapPath).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var doc apiserver.ControlPlaneBootstrap
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.EtcdMembers) != 2 {
		t.Fatalf("etcd members %+v, want s0 and s1", doc.EtcdMembers)
	}
	for _, m := range doc.EtcdMembers {
		if m.IsLearner {
			t.Errorf("member %s is still a learner", m.Name)
		}
	}
	// One store: written through server 1, read through server 2.
	if _, err := cs.CoreV1().Namespaces().Create(ctx, nsObj("through-s0"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs2.CoreV1().Namespaces().Get(ctx, "through-s0", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() error {
		ep, err := cs2.CoreV1().Endpoints("default").Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			return err
		}
		n := 0
		for _, ss := range ep.Subsets {
			n += len(ss.Addresses)
		}
		if n != 2 {
			return fmt.Errorf("kubernetes endpoints %+v, want both servers", ep.Subsets)
		}
		return nil
	})
}

func nsObj(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
}
