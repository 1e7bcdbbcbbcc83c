package kubelet_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/moby/sys/mountinfo"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestSecurityContextAndEmptyDirInContainer: a pod's and its container's
// securityContext reach the running process (the container's runAsUser
// over the pod's, the pod's runAsGroup, supplementalGroups and fsGroup as
// groups, no_new_privs, a read-only root filesystem, a namespaced sysctl),
// and its emptyDir volumes are what upstream's are: mode 0777 so a
// non-root user writes in them, medium Memory on a tmpfs of sizeLimit, a
// subPathExpr expanded from the container's env, all unmounted and gone
// with the pod.
func TestSecurityContextAndEmptyDirInContainer(t *testing.T) {
	n := newNode(t, nil)
	yes, no := true, false
	n.create(echoPod(n, "secctx", func(p *v1.Pod) {
		p.Spec.SecurityContext = &v1.PodSecurityContext{
			RunAsUser: ptrInt64(1001), RunAsGroup: ptrInt64(2002),
			SupplementalGroups: []int64{3003}, FSGroup: ptrInt64(4004),
			Sysctls: []v1.Sysctl{{Name: "kernel.shm_rmid_forced", Value: "1"}},
		}
		limit := resource.MustParse("8Mi")
		p.Spec.Volumes = []v1.Volume{
			{Name: "disk", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
			{Name: "mem", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{Medium: v1.StorageMediumMemory, SizeLimit: &limit}}},
		}
		c := &p.Spec.Containers[0]
		c.SecurityContext = &v1.SecurityContext{RunAsUser: ptrInt64(1002), ReadOnlyRootFilesystem: &yes, AllowPrivilegeEscalation: &no}
		c.VolumeMounts = []v1.VolumeMount{
			{Name: "disk", MountPath: "/disk"},
			{Name: "mem", MountPath: "/mem"},
			{Name: "disk", MountPath: "/sub", SubPathExpr: "logs/$(POD_NAME)"},
		}
	}))
	n.waitPod("secctx", "running", 60*time.Second, runningReady)

	run := func(cmd ...string) (string, error) {
		t.Helper()
		out, stderr, err := n.exec("secctx", "echo", false, "", append([]string{"/waggle-echo"}, cmd...)...)
		return out + stderr, err
	}
	status, err := run("cat", "/proc/self/status")
	if err != nil {
		t.Fatalf("cat /proc/self/status: %v: %s", err, status)
	}
	for _, want := range []string{`(?m)^Uid:\s+1002\s`, `(?m)^Gid:\s+2002\s`, `(?m)^Groups:.*\b3003\b`, `(?m)^Groups:.*\b4004\b`, `(?m)^NoNewPrivs:\s+1$`} {
		if !regexp.MustCompile(want).MatchString(status) {
			t.Errorf("process status does not match %s:\n%s", want, status)
		}
	}
	if out, err := run("cat", "/proc/sys/kernel/shm_rmid_forced"); err != nil || strings.TrimSpace(out) != "1" {
		t.Errorf("sysctl kernel.shm_rmid_forced = %q (%v), want 1", out, err)
	}
	if out, err := run("touch", "/file"); err == nil || !strings.Contains(out, "read-only file system") {
		t.Errorf("write to the read-only root filesystem: %v %q", err, out)
	}
	// Non-root writes into both emptyDirs and into the subPathExpr
	// directory, which is logs/<pod name> of the disk volume.
	for _, f := range []string{"/disk/a", "/mem/b", "/sub/c"} {
		if out, err := run("touch", f); err != nil {
			t.Errorf("touch %s as uid 1002: %v %s", f, err, out)
		}
	}
	if out, err := run("ls", "/disk/logs/secctx"); err != nil || strings.TrimSpace(out) != "c" {
		t.Errorf("subPathExpr directory holds %q (%v), want the file c", out, err)
	}
	mounts, err := run("cat", "/proc/self/mounts")
	if err != nil || !regexp.MustCompile(`(?m)^tmpfs /mem tmpfs \S*size=8192k`).MatchString(mounts) {
		t.Errorf("/mem is not a tmpfs of 8Mi (%v):\n%s", err, mounts)
	}
	p := n.get("secctx")
	for _, name := range []string{"disk", "mem"} {
		dir := filepath.Join(n.cfg.RootDir, "pods", string(p.UID), "volumes", name)
		st, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if want := os.ModeDir | os.ModeSetgid | 0o777; st.Mode() != want {
			t.Errorf("emptyDir %s mode %v, want %v (0777, setgid for the fsGroup)", name, st.Mode(), want)
		}
	}

	n.delete("secctx")
	n.waitGone("secctx", 30*time.Second)
	podDir := filepath.Join(n.cfg.RootDir, "pods", string(p.UID))
	waitFor(t, 30*time.Second, "pod dir removed", func() (bool, string) {
		_, err := os.Stat(podDir)
		return os.IsNotExist(err), podDir
	})
	if ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(podDir)); err != nil || len(ms) > 0 {
		t.Errorf("mounts left under the pod's dir: %v %v", ms, err)
	}
}

// TestSubPathExprFailsUntilThePodChanges: a subPathExpr that names an
// unset variable, expands to ".." or to an absolute path keeps its
// container waiting in CreateContainerConfigError; once the pod's
// annotation gives the variable a value, the container runs.
func TestSubPathExprFailsUntilThePodChanges(t *testing.T) {
	n := newNode(t, nil)
	withExpr := func(value string, fromAnnotation bool) func(*v1.Pod) {
		return func(p *v1.Pod) {
			p.Spec.Volumes = []v1.Volume{{Name: "d", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}}
			c := &p.Spec.Containers[0]
			e := v1.EnvVar{Name: "SUB", Value: value}
			if fromAnnotation {
				e = v1.EnvVar{Name: "SUB", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.annotations['sub']"}}}
			}
			c.Env = append(c.Env, e)
			c.VolumeMounts = []v1.VolumeMount{{Name: "d", MountPath: "/sub", SubPathExpr: "$(SUB)/x"}}
		}
	}
	n.create(echoPod(n, "dotdot", withExpr("..", false)))
	n.create(echoPod(n, "absolute", withExpr("/tmp", false)))
	n.create(echoPod(n, "later", withExpr("", true)))
	configError := func(p *v1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Waiting != nil &&
			p.Status.ContainerStatuses[0].State.Waiting.Reason == "CreateContainerConfigError"
	}
	for _, name := range []string{"dotdot", "absolute", "later"} {
		n.waitPod(name, "CreateContainerConfigError", 60*time.Second, configError)
	}
	p := n.get("later")
	p.Annotations = map[string]string{"sub": "given"}
	if _, err := n.client.CoreV1().Pods("default").Update(t.Context(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	n.waitPod("later", "running once the annotation is set", 60*time.Second, runningReady)
	dir := filepath.Join(n.cfg.RootDir, "pods", string(p.UID), "volumes", "d", "given", "x")
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		t.Errorf("subPathExpr directory %s: %v", dir, err)
	}
	for _, name := range []string{"dotdot", "absolute"} {
		if p := n.get(name); !configError(p) {
			t.Errorf("%s: container status %+v, want CreateContainerConfigError", name, p.Status.ContainerStatuses)
		}
	}
}
