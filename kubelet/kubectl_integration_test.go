package kubelet_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/waggle-io/waggle/internal/testutil"
)

// TestKubectlLogsAndExecThroughAPIServer drives the real kubectl, old
// (SPDY) and new (WebSocket v5), through the API server's pods/log and
// pods/exec to this kubelet.
func TestKubectlLogsAndExecThroughAPIServer(t *testing.T) {
	testutil.RequiresBinary(t, "kubectl")
	n := newNode(t, nil)
	n.create(echoPod(n, "kc", func(p *v1.Pod) {
		p.Spec.Containers = append(p.Spec.Containers, v1.Container{Name: "logger", Image: p.Spec.Containers[0].Image,
			ImagePullPolicy: v1.PullNever, Command: []string{"/waggle-echo", "log", "5"}})
	}))
	n.create(echoPod(n, "crashy", func(p *v1.Pod) {
		p.Spec.RestartPolicy = v1.RestartPolicyOnFailure
		p.Spec.Containers[0].Command = []string{"/waggle-echo", "log", "3", "1"}
	}))
	n.waitPod("kc", "running", 60*time.Second, runningReady)
	n.waitPod("crashy", "restarted", 60*time.Second, func(p *v1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount >= 1
	})
	kubeconfig := filepath.Join(n.apiDir, "admin.kubeconfig")
	kubectls := []string{"kubectl"}
	for _, v := range []string{"1.27", "1.33"} {
		if p, err := exec.LookPath("/usr/lib/google-cloud-sdk/bin/kubectl." + v); err == nil {
			kubectls = append(kubectls, p)
		}
	}
	for _, kc := range kubectls {
		t.Run(filepath.Base(kc), func(t *testing.T) {
			run := func(args ...string) (string, error) {
				cmd := exec.Command(kc, append([]string{"--kubeconfig", kubeconfig}, args...)...)
				out, err := cmd.CombinedOutput()
				return string(out), err
			}
			out, err := run("logs", "kc", "-c", "logger", "--tail", "2")
			if err != nil || out != "line 4\nline 5\n" {
				t.Errorf("kubectl logs --tail 2: %v %q", err, out)
			}
			// --timestamps prints each line's record time; --since-time in
			// the future leaves nothing, an hour back everything.
			out, err = run("logs", "kc", "-c", "logger", "--tail", "1", "--timestamps")
			if ts, line, ok := strings.Cut(out, " "); err != nil || !ok || line != "line 5\n" {
				t.Errorf("kubectl logs --timestamps: %v %q", err, out)
			} else if _, err := time.Parse(time.RFC3339Nano, ts); err != nil {
				t.Errorf("kubectl logs --timestamps: %q is not RFC 3339: %v", ts, err)
			}
			out, err = run("logs", "kc", "-c", "logger", "--since", "1h")
			if err != nil || out != "line 1\nline 2\nline 3\nline 4\nline 5\n" {
				t.Errorf("kubectl logs --since 1h: %v %q", err, out)
			}
			out, err = run("logs", "kc", "-c", "logger", "--since-time", time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
			if err != nil || out != "" {
				t.Errorf("kubectl logs --since-time <in an hour>: %v %q", err, out)
			}
			out, err = run("logs", "crashy", "--previous")
			if err != nil || out != "line 1\nline 2\nline 3\n" {
				t.Errorf("kubectl logs --previous: %v %q", err, out)
			}
			// -f ends when the followed container does.
			out, err = run("logs", "-f", "crashy", "--request-timeout=60s")
			if err != nil || !strings.HasSuffix(out, "line 3\n") {
				t.Errorf("kubectl logs -f: %v %q", err, out)
			}
			out, err = run("exec", "kc", "-c", "echo", "--", "/waggle-echo", "env")
			if err != nil || !strings.Contains(out, "POD_NAME=kc") {
				t.Errorf("kubectl exec env: %v %q", err, out)
			}
			cmd := exec.Command(kc, "--kubeconfig", kubeconfig, "exec", "-i", "kc", "-c", "echo", "--", "/waggle-echo", "stdin-echo")
			cmd.Stdin = strings.NewReader("through the apiserver\n")
			b, err := cmd.CombinedOutput()
			if err != nil || string(b) != "through the apiserver\n" {
				t.Errorf("kubectl exec -i: %v %q", err, b)
			}
			out, err = run("exec", "kc", "-c", "echo", "--", "/waggle-echo", "exit", "7")
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 7 {
				t.Errorf("kubectl exec exit 7: %v %q", err, out)
			}
		})
	}
}
