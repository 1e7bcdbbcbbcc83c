package kubelet_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func restarts(p *v1.Pod) int32 {
	if len(p.Status.ContainerStatuses) == 0 {
		return -1
	}
	return p.Status.ContainerStatuses[0].RestartCount
}

func TestProbesRestartAndUnready(t *testing.T) {
	n := newNode(t, nil)
	n.create(echoPod(n, "probed", func(p *v1.Pod) {
		c := &p.Spec.Containers[0]
		c.LivenessProbe = &v1.Probe{PeriodSeconds: 1, FailureThreshold: 1,
			ProbeHandler: v1.ProbeHandler{HTTPGet: &v1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}}}
		c.ReadinessProbe = &v1.Probe{PeriodSeconds: 1,
			ProbeHandler: v1.ProbeHandler{Exec: &v1.ExecAction{Command: []string{"/waggle-echo", "cat", "/tmp/ready"}}}}
		c.StartupProbe = &v1.Probe{PeriodSeconds: 1, FailureThreshold: 30,
			ProbeHandler: v1.ProbeHandler{TCPSocket: &v1.TCPSocketAction{Port: intstr.FromString("http")}}}
	}))
	p := n.waitPod("probed", "running, started, not ready", 60*time.Second, func(p *v1.Pod) bool {
		return p.Status.Phase == v1.PodRunning && len(p.Status.ContainerStatuses) == 1 &&
			p.Status.ContainerStatuses[0].Started != nil && *p.Status.ContainerStatuses[0].Started
	})
	if podCond(p, v1.PodReady) {
		t.Fatal("ready before its readiness probe passed")
	}
	if _, _, err := n.exec("probed", "echo", false, "", "/waggle-echo", "touch", "/tmp/ready"); err != nil {
		t.Fatal(err)
	}
	n.waitPod("probed", "ready", 30*time.Second, runningReady)
	if _, _, err := n.exec("probed", "echo", false, "", "/waggle-echo", "rm", "/tmp/ready"); err != nil {
		t.Fatal(err)
	}
	n.waitPod("probed", "unready again", 30*time.Second, func(p *v1.Pod) bool { return !podCond(p, v1.PodReady) && p.Status.Phase == v1.PodRunning })
	// A failing liveness probe restarts the container.
	if _, _, err := n.exec("probed", "echo", false, "", "/waggle-echo", "touch", "/tmp/unhealthy"); err != nil {
		t.Fatal(err)
	}
	p = n.waitPod("probed", "restarted by liveness", 60*time.Second, func(p *v1.Pod) bool { return restarts(p) == 1 })
	if lt := p.Status.ContainerStatuses[0].LastTerminationState.Terminated; lt == nil {
		t.Errorf("no last termination state after a liveness restart: %+v", p.Status.ContainerStatuses[0])
	}
	// The new container starts healthy (fresh /tmp): it stays.
	n.waitPod("probed", "running after restart", 30*time.Second, func(p *v1.Pod) bool {
		return p.Status.Phase == v1.PodRunning && p.Status.ContainerStatuses[0].State.Running != nil
	})
}

func TestRestartPoliciesBackoffAndOOM(t *testing.T) {
	n := newNode(t, nil)
	exitPod := func(name string, policy v1.RestartPolicy, code string) {
		n.create(echoPod(n, name, func(p *v1.Pod) {
			p.Spec.RestartPolicy = policy
			p.Spec.Containers[0].Command = []string{"/waggle-echo", "log", "3", code}
		}))
	}
	exitPod("onfailure", v1.RestartPolicyOnFailure, "3")
	exitPod("never-ok", v1.RestartPolicyNever, "0")
	exitPod("never-fail", v1.RestartPolicyNever, "4")
	exitPod("always", v1.RestartPolicyAlways, "0")
	n.create(echoPod(n, "oom", func(p *v1.Pod) {
		p.Spec.RestartPolicy = v1.RestartPolicyNever
		p.Spec.Containers[0].Command = []string{"/waggle-echo", "alloc", "200"}
		p.Spec.Containers[0].Resources.Limits = v1.ResourceList{v1.ResourceMemory: resource.MustParse("32Mi")}
	}))

	p := n.waitPod("never-ok", "Succeeded", 60*time.Second, func(p *v1.Pod) bool { return p.Status.Phase == v1.PodSucceeded })
	if term := p.Status.ContainerStatuses[0].State.Terminated; term == nil || term.ExitCode != 0 || term.Reason != "Completed" {
		t.Errorf("never-ok state = %+v", p.Status.ContainerStatuses[0].State)
	}
	p = n.waitPod("never-fail", "Failed", 60*time.Second, func(p *v1.Pod) bool { return p.Status.Phase == v1.PodFailed })
	if term := p.Status.ContainerStatuses[0].State.Terminated; term == nil || term.ExitCode != 4 || term.Reason != "Error" {
		t.Errorf("never-fail state = %+v", p.Status.ContainerStatuses[0].State)
	}
	p = n.waitPod("oom", "OOMKilled", 60*time.Second, func(p *v1.Pod) bool {
		return p.Status.Phase == v1.PodFailed && p.Status.ContainerStatuses[0].State.Terminated != nil
	})
	if r := p.Status.ContainerStatuses[0].State.Terminated.Reason; r != "OOMKilled" {
		t.Errorf("oom reason = %q (exit %d)", r, p.Status.ContainerStatuses[0].State.Terminated.ExitCode)
	}
	// OnFailure and Always restart, then back off.
	for _, name := range []string{"onfailure", "always"} {
		p = n.waitPod(name, "CrashLoopBackOff", 60*time.Second, func(p *v1.Pod) bool {
			w := p.Status.ContainerStatuses
			return len(w) == 1 && w[0].RestartCount >= 1 && w[0].State.Waiting != nil && w[0].State.Waiting.Reason == "CrashLoopBackOff"
		})
		if p.Status.Phase != v1.PodRunning {
			t.Errorf("%s phase = %s", name, p.Status.Phase)
		}
	}
	// Logs of the previous attempt.
	code, prev := n.httpGet("/containerLogs/default/onfailure/echo?previous=true")
	if code != 200 || !strings.Contains(prev, "line 3") {
		t.Errorf("previous logs: %d %q", code, prev)
	}
	// Terminal pods gave their addresses back.
	waitFor(t, 10*time.Second, "addresses of terminal pods released", func() (bool, string) {
		return n.ipsAllocated() == 2, fmt.Sprintf("%d allocated, want 2 (onfailure, always)", n.ipsAllocated())
	})
}

func TestTerminationHonoursGraceAndPreStop(t *testing.T) {
	n := newNode(t, nil)
	hostDir := t.TempDir()
	n.create(echoPod(n, "stubborn", func(p *v1.Pod) {
		p.Spec.TerminationGracePeriodSeconds = ptrInt64(2)
		p.Spec.Containers[0].Args = []string{"--ignore-sigterm"}
	}))
	n.create(echoPod(n, "polite", func(p *v1.Pod) {
		p.Spec.TerminationGracePeriodSeconds = ptrInt64(30)
		p.Spec.Volumes = []v1.Volume{{Name: "h", VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: hostDir}}}}
		c := &p.Spec.Containers[0]
		c.VolumeMounts = []v1.VolumeMount{{Name: "h", MountPath: "/host"}}
		c.Lifecycle = &v1.Lifecycle{PreStop: &v1.LifecycleHandler{Exec: &v1.ExecAction{Command: []string{"/waggle-echo", "write", "/host/prestop", "ran"}}}}
	}))
	n.waitPod("stubborn", "running", 60*time.Second, runningReady)
	n.waitPod("polite", "running", 60*time.Second, runningReady)

	// Watch the kubelet's final status before the pods go.
	final := map[string]*v1.ContainerStateTerminated{}
	w, err := n.client.CoreV1().Pods("default").Watch(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	n.delete("stubborn")
	n.delete("polite")
	deadline := time.After(60 * time.Second)
	for len(final) < 2 {
		select {
		case ev := <-w.ResultChan():
			p, ok := ev.Object.(*v1.Pod)
			if !ok || len(p.Status.ContainerStatuses) == 0 {
				continue
			}
			if term := p.Status.ContainerStatuses[0].State.Terminated; term != nil {
				final[p.Name] = term
			}
		case <-deadline:
			t.Fatalf("no final status: %v", final)
		}
	}
	// SIGTERM ignored: SIGKILL after the grace period (137); SIGTERM
	// honoured: a clean exit.
	if final["stubborn"].ExitCode != 137 {
		t.Errorf("stubborn exit = %d, want 137 (SIGKILL after grace)", final["stubborn"].ExitCode)
	}
	if final["polite"].ExitCode != 0 {
		t.Errorf("polite exit = %d, want 0", final["polite"].ExitCode)
	}
	if d := final["stubborn"].FinishedAt.Sub(final["stubborn"].StartedAt.Time); d < 2*time.Second {
		t.Errorf("stubborn ran %s, less than its 2 s grace period", d)
	}
	b, err := os.ReadFile(filepath.Join(hostDir, "prestop"))
	if err != nil || strings.TrimSpace(string(b)) != "ran" {
		t.Errorf("preStop hook did not run: %v %q", err, b)
	}
	n.waitGone("stubborn", 30*time.Second)
	n.waitGone("polite", 30*time.Second)
}

func TestVolumesAndEnv(t *testing.T) {
	n := newNode(t, nil)
	ctx := context.Background()
	n.client.CoreV1().ConfigMaps("default").Create(ctx, &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm"}, Data: map[string]string{"color": "blue", "file.txt": "from configmap"}}, metav1.CreateOptions{})
	n.client.CoreV1().Secrets("default").Create(ctx, &v1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sec"}, Data: map[string][]byte{"token": []byte("s3cret")}}, metav1.CreateOptions{})
	n.create(echoPod(n, "vols", func(p *v1.Pod) {
		p.Spec.InitContainers = []v1.Container{{Name: "init", Image: p.Spec.Containers[0].Image, ImagePullPolicy: v1.PullNever,
			Command:      []string{"/waggle-echo", "write", "/work/init", "init ran"},
			VolumeMounts: []v1.VolumeMount{{Name: "scratch", MountPath: "/work"}}}}
		p.Spec.Volumes = []v1.Volume{
			{Name: "scratch", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
			{Name: "cm", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{LocalObjectReference: v1.LocalObjectReference{Name: "cm"}}}},
			{Name: "sec", VolumeSource: v1.VolumeSource{Secret: &v1.SecretVolumeSource{SecretName: "sec"}}},
			{Name: "info", VolumeSource: v1.VolumeSource{DownwardAPI: &v1.DownwardAPIVolumeSource{Items: []v1.DownwardAPIVolumeFile{
				{Path: "labels", FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.labels"}}}}}},
		}
		c := &p.Spec.Containers[0]
		c.WorkingDir = "/work"
		c.VolumeMounts = []v1.VolumeMount{{Name: "scratch", MountPath: "/work"}, {Name: "cm", MountPath: "/cm"}, {Name: "sec", MountPath: "/sec"}, {Name: "info", MountPath: "/info"}}
		c.Env = append(c.Env,
			v1.EnvVar{Name: "COLOR", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "cm"}, Key: "color"}}},
			v1.EnvVar{Name: "TOKEN", ValueFrom: &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "sec"}, Key: "token"}}},
			v1.EnvVar{Name: "NODE", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
			v1.EnvVar{Name: "GREETING", Value: "hello $(COLOR)"},
		)
	}))
	p := n.waitPod("vols", "running", 60*time.Second, runningReady)
	if !podCond(p, v1.PodInitialized) || p.Status.InitContainerStatuses[0].State.Terminated == nil {
		t.Errorf("init container status = %+v", p.Status.InitContainerStatuses)
	}
	for _, tc := range []struct {
		cmd  []string
		want string
	}{
		{[]string{"/waggle-echo", "env"}, "COLOR=blue"},
		{[]string{"/waggle-echo", "env"}, "TOKEN=s3cret"},
		{[]string{"/waggle-echo", "env"}, "NODE=" + n.name},
		{[]string{"/waggle-echo", "env"}, "GREETING=hello blue"},
		{[]string{"/waggle-echo", "pwd"}, "/work"},
		{[]string{"/waggle-echo", "cat", "/work/init"}, "init ran"},
		{[]string{"/waggle-echo", "cat", "/cm/file.txt"}, "from configmap"},
		{[]string{"/waggle-echo", "cat", "/sec/token"}, "s3cret"},
		{[]string{"/waggle-echo", "cat", "/info/labels"}, `app="vols"`},
	} {
		out, stderr, err := n.exec("vols", "echo", true, "", tc.cmd...)
		if err != nil || !strings.Contains(out, tc.want) {
			t.Errorf("%v: %v %q %q, want %q", tc.cmd, err, out, stderr, tc.want)
		}
	}
	// Read-only API volumes.
	if _, _, err := n.exec("vols", "echo", true, "", "/waggle-echo", "write", "/cm/x", "y"); err == nil {
		t.Error("wrote into a configMap volume")
	}
}

func TestStaticPodsAndMirrors(t *testing.T) {
	dir := t.TempDir()
	manifest := `apiVersion: v1
kind: Pod
metadata:
  name: static-echo
spec:
  containers:
  - name: echo
    image: waggle.local/waggle-echo:dev
    imagePullPolicy: Never
`
	os.WriteFile(filepath.Join(dir, "echo.yaml"), []byte(manifest), 0o644)
	os.WriteFile(filepath.Join(dir, "broken.yaml"), []byte("kind: Pod\nmetadata: {}\n"), 0o644)
	n := newNode(t, func(c *KubeletConfig) { c.PodManifestPath = dir })
	name := "static-echo-" + n.name
	p := n.waitPod(name, "mirror running", 60*time.Second, runningReady)
	if p.Annotations["kubernetes.io/config.mirror"] == "" {
		t.Errorf("mirror annotations = %v", p.Annotations)
	}
	body := dialEcho(t, p.Status.PodIP+":8080")
	firstUID := p.UID
	if err := n.client.CoreV1().Pods("default").Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	p = n.waitPod(name, "mirror back", 60*time.Second, func(p *v1.Pod) bool { return p.UID != "" && p.UID != firstUID && runningReady(p) })
	if restarts(p) != 0 {
		t.Errorf("static pod restarted when its mirror was deleted")
	}
	if again := dialEcho(t, p.Status.PodIP+":8080"); again != body[:len(again)] && !strings.HasPrefix(again, "pod=") {
		t.Errorf("static pod answers %q", again)
	}
	os.Remove(filepath.Join(dir, "echo.yaml"))
	n.waitGone(name, 60*time.Second)
	waitFor(t, 20*time.Second, "static pod's network released", func() (bool, string) {
		return n.ipsAllocated() == 0, fmt.Sprint(n.ipsAllocated())
	})
}
