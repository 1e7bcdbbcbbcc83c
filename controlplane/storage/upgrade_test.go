package storage

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestOpensAnEtcd35DataDir starts the embedded etcd on a data dir that the
// embedded etcd of etcd v3.5.17 (the previous Waggle release) wrote, so a
// cluster made before the move to etcd 3.7 resumes with its objects.
// testdata/etcd-3.5.17-datadir.tar.gz holds that data dir's member/
// directory with three ConfigMaps under /registry/configmaps/default/.
func TestOpensAnEtcd35DataDir(t *testing.T) {
	dir := t.TempDir()
	etcdDir := filepath.Join(dir, "etcd")
	if err := os.MkdirAll(etcdDir, 0o700); err != nil {
		t.Fatal(err)
	}
	tarball, err := filepath.Abs("testdata/etcd-3.5.17-datadir.tar.gz")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("tar", "-xzf", tarball, "-C", etcdDir).CombinedOutput(); err != nil {
		t.Fatalf("unpack: %v: %s", err, out)
	}
	ctx := context.Background()
	s, err := Open(ctx, withTLS(t, dir, Config{UnsafeNoFsync: true}))
	if err != nil {
		t.Fatalf("open the 3.5 data dir: %v", err)
	}
	closed := false
	defer func() {
		if !closed {
			s.Close()
		}
	}()
	res, err := s.List(ctx, "/registry/configmaps/default/", ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.KVs) != 3 {
		t.Fatalf("%d ConfigMaps after the upgrade, want 3", len(res.KVs))
	}
	for i, kv := range res.KVs {
		if want := fmt.Sprintf(`"k":"v%d"`, i); !strings.Contains(string(kv.Value), want) {
			t.Errorf("%s = %s, want it to contain %s", kv.Key, kv.Value, want)
		}
	}
	// Revisions are kept (clients' resourceVersions stay valid), and the
	// upgraded member takes writes after them.
	last := res.KVs[len(res.KVs)-1].ModRevision
	if res.KVs[0].ModRevision < 2 {
		t.Errorf("first ConfigMap at revision %d: the 3.5 revisions were not kept", res.KVs[0].ModRevision)
	}
	rev, err := s.Create(ctx, "/registry/configmaps/default/after", []byte(`{}`))
	if err != nil {
		t.Fatalf("write after the upgrade: %v", err)
	}
	if rev <= last {
		t.Errorf("write after the upgrade at revision %d, not after the 3.5 data's %d", rev, last)
	}
	backups, _ := filepath.Glob(filepath.Join(dir, "etcd.etcd35-*"))
	if len(backups) != 1 {
		t.Fatalf("want the 3.5 data dir kept beside the new one, found %v", backups)
	}
	// A second start finds a current data dir and leaves it alone.
	s.Close()
	closed = true
	s2, err := Open(ctx, withTLS(t, dir, Config{UnsafeNoFsync: true}))
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer s2.Close()
	if kv, _, err := s2.Get(ctx, "/registry/configmaps/default/after"); err != nil || kv == nil {
		t.Fatalf("the write after the upgrade is gone after a restart: %v", err)
	}
	if b, _ := filepath.Glob(filepath.Join(dir, "etcd.etcd35-*")); len(b) != 1 {
		t.Fatalf("a current data dir was upgraded again: %v", b)
	}
}
