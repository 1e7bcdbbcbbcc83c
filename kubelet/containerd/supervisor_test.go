package containerd_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	ctrd "github.com/containerd/containerd"

	"github.com/waggle-io/waggle/internal/testutil"
	"github.com/waggle-io/waggle/kubelet/containerd"
)

func TestStartServesAndStopsByPID(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "containerd")
	dir, err := os.MkdirTemp("/tmp", "wsup")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	d, err := containerd.Start(context.Background(), containerd.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop(context.Background())
	c, err := ctrd.New(d.Address(), ctrd.WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	v, err := c.Version(context.Background())
	c.Close()
	if err != nil || v.Version == "" {
		t.Fatalf("version: %v %+v", err, v)
	}
	pid := d.PID()
	if err := d.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.Done():
	default:
		t.Fatal("Done not closed after Stop")
	}
	if _, err := os.Stat("/proc/" + itoa(pid)); err == nil {
		if b, _ := os.ReadFile("/proc/" + itoa(pid) + "/cmdline"); strings.Contains(string(b), dir) {
			t.Errorf("containerd %d still running after Stop", pid)
		}
	}
	if err := d.Stop(context.Background()); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func itoa(i int) string {
	b := []byte{}
	for i > 0 {
		b = append([]byte{byte('0' + i%10)}, b...)
		i /= 10
	}
	return string(b)
}

func TestStartRejectsBadOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts containerd.Options
		want string
	}{
		{"no dir", containerd.Options{}, "Dir is required"},
		{"missing binary", containerd.Options{Dir: t.TempDir(), Binary: "no-such-containerd-binary"}, "find containerd"},
		{"socket path too long", containerd.Options{Dir: "/tmp/" + strings.Repeat("x", 120), Binary: "sh"}, "too long"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := containerd.Start(context.Background(), tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestConfigKeepsEverythingUnderDir(t *testing.T) {
	cfg := containerd.Config("/x/y")
	for _, want := range []string{`root = "/x/y/root"`, `state = "/x/y/state"`, `address = "/x/y/containerd.sock"`, `"io.containerd.grpc.v1.cri"`} {
		if !strings.Contains(cfg, want) {
			t.Errorf("config lacks %s:\n%s", want, cfg)
		}
	}
}
