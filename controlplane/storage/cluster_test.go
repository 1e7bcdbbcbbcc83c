package storage

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/waggle-io/waggle/controlplane/apiserver/pki"
	"github.com/waggle-io/waggle/internal/testutil"
)

// memberTLS makes dir's etcd PKI from the shared CA of ca (copied, as a
// joining server receives it) with a serving certificate for host.
func memberTLS(t *testing.T, caDir, dir, host string) (EmbeddedConfig, *tls.Config) {
	t.Helper()
	if caDir != "" {
		for _, f := range []string{pki.EtcdCACertFile, pki.EtcdCAKeyFile} {
			b, err := os.ReadFile(filepath.Join(caDir, "pki", f))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(filepath.Join(dir, "pki", "etcd"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "pki", f), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	p, err := pki.EnsureEtcd(filepath.Join(dir, "pki"), []string{host})
	if err != nil {
		t.Fatal(err)
	}
	tc, err := ClientTLS(p.CAFile, p.ClientCertFile, p.ClientKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	return EmbeddedConfig{DataDir: dir, UnsafeNoFsync: true, CertFile: p.ServerCertFile, KeyFile: p.ServerKeyFile, TrustedCAFile: p.CAFile, ClientTLS: tc}, tc
}

// Three embedded members form one cluster the way servers do: the first
// starts it (--cluster-init), the others join as learners through the
// existing members' client URLs (peer TLS and client certificates of one
// etcd CA) and are promoted; a write through one member is read through
// another, the cluster keeps serving when its leader goes, and removing a
// member takes it out of the membership.
func TestMembersJoinAsLearnersAndSurviveTheLeader(t *testing.T) {
	testutil.Privileged(t)
	ctx := context.Background()
	hosts := []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"}
	var ems []*Embedded
	var clientTLS *tls.Config
	var first string
	var clientURLs []string
	for i, h := range hosts {
		dir := t.TempDir()
		if i == 0 {
			first = dir
		}
		caDir := first
		if i == 0 {
			caDir = ""
		}
		cfg, tc := memberTLS(t, caDir, dir, h)
		clientTLS = tc
		cfg.Member = &MemberConfig{Name: fmt.Sprintf("s%d", i), Host: h, PeerPort: 26380, ClientPort: 26379}
		if i > 0 {
			cfg.Member.Join = &JoinConfig{Endpoints: clientURLs}
		}
		e, err := StartEmbedded(ctx, cfg)
		if err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
		t.Cleanup(e.Close)
		ems = append(ems, e)
		clientURLs = append(clientURLs, cfg.Member.ClientURL())
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: clientURLs, TLS: clientTLS, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	list, err := c.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Members) != 3 {
		t.Fatalf("%d members, want 3", len(list.Members))
	}
	for _, m := range list.Members {
		if m.IsLearner {
			t.Errorf("member %s still a learner", m.Name)
		}
	}
	if _, err := c.Put(ctx, "/k", "v1"); err != nil {
		t.Fatal(err)
	}
	// Read through the last member only (linearizable).
	last, err := clientv3.New(clientv3.Config{Endpoints: clientURLs[2:], TLS: clientTLS, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer last.Close()
	if r, err := last.Get(ctx, "/k"); err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v1" {
		t.Fatalf("read through member 2: %v %v", r, err)
	}

	// Stop the leader: the other two elect a new one and serve writes.
	st, err := c.Status(ctx, clientURLs[0])
	if err != nil {
		t.Fatal(err)
	}
	leader := -1
	for i := range ems {
		if uint64(ems[i].etcd.Server.MemberID()) == st.Leader {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatal("no leader among the members")
	}
	ems[leader].Close()
	var rest []string
	for i, u := range clientURLs {
		if i != leader {
			rest = append(rest, u)
		}
	}
	c2, err := clientv3.New(clientv3.Config{Endpoints: rest, TLS: clientTLS, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	testutil.Eventually(t, 30*time.Second, func() error {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := c2.Put(cctx, "/k", "v2")
		return err
	})
	if err := removeMember(ctx, c2, fmt.Sprintf("s%d", leader), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	list, err = c2.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Members) != 2 {
		t.Fatalf("%d members after removing s%d, want 2", len(list.Members), leader)
	}
}
