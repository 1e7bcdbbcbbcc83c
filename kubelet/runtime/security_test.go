package runtime

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestSecurityOpts applies a Security to the spec an image config gives
// (user from the rootfs' /etc/passwd and /etc/group) and checks the
// process and root filesystem the OCI runtime would get.
func TestSecurityOpts(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	os.WriteFile(filepath.Join(root, "etc", "passwd"), []byte("root:x:0:0::/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\napp:x:1000:1000::/:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(root, "etc", "group"), []byte("root:x:0:\nwheel:x:10:app\nnogroup:x:65534:\n"), 0o644)
	i64 := func(v int64) *int64 { return &v }
	defaultCaps := []string{"CAP_CHOWN", "CAP_KILL", "CAP_NET_RAW"}
	for _, tc := range []struct {
		name   string
		sec    Security
		check  func(*oci.Spec) bool
		expect string
	}{
		{"zero value changes nothing", Security{}, func(s *oci.Spec) bool {
			return s.Process.User.UID == 0 && !s.Process.NoNewPrivileges && !s.Root.Readonly && slices.Equal(s.Process.Capabilities.Bounding, defaultCaps)
		}, "root, default caps"},
		{"uid takes its group from passwd", Security{RunAsUser: i64(65534)}, func(s *oci.Spec) bool {
			return s.Process.User.UID == 65534 && s.Process.User.GID == 65534
		}, "65534:65534"},
		{"uid unknown to the image gets group 0", Security{RunAsUser: i64(1001)}, func(s *oci.Spec) bool {
			return s.Process.User.UID == 1001 && s.Process.User.GID == 0
		}, "1001:0"},
		{"uid and gid", Security{RunAsUser: i64(1000), RunAsGroup: i64(2002), SupplementalGroups: []int64{3003, 10}}, func(s *oci.Spec) bool {
			return s.Process.User.UID == 1000 && s.Process.User.GID == 2002 && slices.Equal(s.Process.User.AdditionalGids, []uint32{2002, 10, 3003})
		}, "1000:2002, groups: the primary one, from /etc/group (10), then 3003, no duplicate"},
		{"gid alone keeps the image's user", Security{RunAsGroup: i64(5)}, func(s *oci.Spec) bool {
			return s.Process.User.UID == 0 && s.Process.User.GID == 5
		}, "0:5"},
		{"no new privileges, read-only rootfs, sysctl", Security{NoNewPrivileges: true, ReadOnlyRootfs: true, Sysctls: map[string]string{"kernel.shm_rmid_forced": "1"}}, func(s *oci.Spec) bool {
			return s.Process.NoNewPrivileges && s.Root.Readonly && s.Linux.Sysctl["kernel.shm_rmid_forced"] == "1"
		}, "set"},
		{"drop ALL add one", Security{DropCaps: []string{"ALL"}, AddCaps: []string{"NET_ADMIN"}}, func(s *oci.Spec) bool {
			return slices.Equal(s.Process.Capabilities.Bounding, []string{"CAP_NET_ADMIN"}) && slices.Equal(s.Process.Capabilities.Effective, []string{"CAP_NET_ADMIN"})
		}, "only CAP_NET_ADMIN"},
		{"drop one", Security{DropCaps: []string{"net_raw"}}, func(s *oci.Spec) bool {
			return slices.Equal(s.Process.Capabilities.Bounding, []string{"CAP_CHOWN", "CAP_KILL"})
		}, "CAP_NET_RAW dropped"},
		{"privileged", Security{Privileged: true}, func(s *oci.Spec) bool {
			return len(s.Process.Capabilities.Bounding) > len(defaultCaps) && len(s.Linux.MaskedPaths) == 0
		}, "every capability, nothing masked"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &oci.Spec{
				Root:    &specs.Root{Path: root},
				Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: defaultCaps, Effective: defaultCaps, Permitted: defaultCaps}},
				Linux:   &specs.Linux{MaskedPaths: []string{"/proc/kcore"}},
			}
			for _, o := range securityOpts(tc.sec) {
				if err := o(context.Background(), nil, &containers.Container{}, s); err != nil {
					t.Fatal(err)
				}
			}
			if !tc.check(s) {
				t.Errorf("want %s; got user %+v nnp %v ro %v caps %v sysctl %v", tc.expect, s.Process.User, s.Process.NoNewPrivileges, s.Root.Readonly, s.Process.Capabilities.Bounding, s.Linux.Sysctl)
			}
		})
	}
}
