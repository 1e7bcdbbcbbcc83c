package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// kubectls are the kubectl builds whose default streaming (WebSocket for
// exec, attach and port-forward since 1.31) must work: the one on PATH and,
// where the Cloud SDK ships it, 1.33.
func kubectls() []string {
	out := []string{"kubectl"}
	if _, err := os.Stat("/usr/lib/google-cloud-sdk/bin/kubectl.1.33"); err == nil {
		out = append(out, "/usr/lib/google-cloud-sdk/bin/kubectl.1.33")
	}
	return out
}

func (e *env) kubectlWith(ctx context.Context, bin string, stdin io.Reader, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig", e.kubeconfig}, args...)...)
	cmd.Stdin = stdin
	return cmd
}

const burnerPod = `
apiVersion: v1
kind: Pod
metadata: {name: burner, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: burn
    image: ` + echoImage + `
    imagePullPolicy: Never
    command: ["/waggle-echo", "burn"]
    resources:
      limits: {cpu: 100m, memory: 64Mi}
`

var milli = regexp.MustCompile(`^(\d+)m$`)

// testKubectlTop: kubectl top through the native metrics API shows every
// node and a busy pod's container with non-zero CPU and memory.
func testKubectlTop(t *testing.T, e *env, nodes []string) {
	e.apply(t, burnerPod)
	t.Cleanup(func() { e.kubectlErr("delete", "pod", "burner", "--wait=false") })
	e.kubectl(t, "wait", "--for=condition=Ready", "pod/burner", "--timeout=2m")
	// Two scrapes (15 s apart) make the first CPU rate.
	eventually(t, 2*time.Minute, "kubectl top pod burner shows its CPU and memory", func() error {
		out, err := e.kubectlErr("top", "pod", "burner", "--containers", "--no-headers")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		f := strings.Fields(out) // POD NAME CPU MEMORY
		if len(f) != 4 || f[1] != "burn" {
			return fmt.Errorf("unexpected: %q", out)
		}
		m := milli.FindStringSubmatch(f[2])
		if m == nil {
			return fmt.Errorf("CPU %q", f[2])
		}
		if n, _ := strconv.Atoi(m[1]); n < 20 || n > 150 {
			return fmt.Errorf("CPU %s, want about the 100m limit", f[2])
		}
		if f[3] == "0Mi" {
			return fmt.Errorf("memory %s", f[3])
		}
		return nil
	})
	out := e.kubectl(t, "top", "nodes", "--no-headers")
	for _, n := range nodes {
		if !strings.Contains(out, n+" ") {
			t.Errorf("kubectl top nodes has no %s:\n%s", n, out)
		}
	}
}

const pfPod = `
apiVersion: v1
kind: Pod
metadata: {name: pf, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: echo
    image: ` + echoImage + `
    imagePullPolicy: Never
    env:
    - {name: POD_NAME, value: pf}
    readinessProbe:
      tcpSocket: {port: 8080}
      periodSeconds: 1
`

var forwarding = regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+) -> 8080`)

// testPortForward: kubectl port-forward to a pod (each kubectl build, in
// its default protocol) reaches the pod's port.
func testPortForward(t *testing.T, e *env) {
	e.apply(t, pfPod)
	t.Cleanup(func() { e.kubectlErr("delete", "pod", "pf", "--wait=false") })
	e.kubectl(t, "wait", "--for=condition=Ready", "pod/pf", "--timeout=2m")
	for _, k := range kubectls() {
		t.Run(filepath.Base(k), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			cmd := e.kubectlWith(ctx, k, nil, "port-forward", "pod/pf", ":8080")
			stdout, _ := cmd.StdoutPipe()
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { cancel(); cmd.Wait() }()
			sc := bufio.NewScanner(stdout)
			port := ""
			for sc.Scan() {
				if m := forwarding.FindStringSubmatch(sc.Text()); m != nil {
					port = m[1]
					break
				}
			}
			if port == "" {
				t.Fatal("kubectl port-forward printed no local port")
			}
			go io.Copy(io.Discard, stdout)
			for i := 0; i < 3; i++ {
				resp, err := http.Get("http://127.0.0.1:" + port + "/")
				if err != nil {
					t.Fatalf("through port-forward: %v", err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if !strings.HasPrefix(string(body), "pod=pf ") {
					t.Errorf("through port-forward: %q", body)
				}
			}
		})
	}
}

func attachPod(name string) string {
	return fmt.Sprintf(`
apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  restartPolicy: Never
  containers:
  - name: cat
    image: %s
    imagePullPolicy: Never
    command: ["/waggle-echo", "stdin-echo"]
    stdin: true
    stdinOnce: true
`, name, echoImage)
}

// testAttach: kubectl attach -i to a running container (each kubectl
// build) sends stdin to its process and shows what it writes; with
// stdinOnce the process's stdin closes when the attach's does, so it
// completes.
func testAttach(t *testing.T, e *env) {
	for i, k := range kubectls() {
		name := fmt.Sprintf("attach-%d", i)
		t.Run(filepath.Base(k), func(t *testing.T) {
			e.apply(t, attachPod(name))
			t.Cleanup(func() { e.kubectlErr("delete", "pod", name, "--wait=false") })
			e.kubectl(t, "wait", "--for=condition=Ready", "pod/"+name, "--timeout=2m")
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			out, err := e.kubectlWith(ctx, k, strings.NewReader("hello through attach\n"), "attach", "-i", name, "-c", "cat").CombinedOutput()
			if err != nil || !strings.Contains(string(out), "hello through attach") {
				t.Fatalf("kubectl attach: %v\n%s", err, out)
			}
			eventually(t, time.Minute, name+" completes once its stdin closed", func() error {
				out, err := e.kubectlErr("get", "pod", name, "-o", "jsonpath={.status.phase}")
				if err != nil || out != "Succeeded" {
					return fmt.Errorf("phase %q %v", out, err)
				}
				return nil
			})
		})
	}
	// Without stdinOnce the attach ends with the client's input, as under a
	// CRI runtime (kubectl run --attach --leave-stdin-open), and the
	// container, its stdin still open, runs on.
	t.Run("StdinLeftOpen", func(t *testing.T) {
		name := "attach-open"
		e.apply(t, strings.Replace(attachPod(name), "stdinOnce: true", "stdinOnce: false", 1))
		t.Cleanup(func() { e.kubectlErr("delete", "pod", name, "--wait=false") })
		e.kubectl(t, "wait", "--for=condition=Ready", "pod/"+name, "--timeout=2m")
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := e.kubectlWith(ctx, "kubectl", strings.NewReader("left open\n"), "attach", "-i", name, "-c", "cat").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "left open") {
			t.Fatalf("kubectl attach (it must return once its input ended): %v\n%s", err, out)
		}
		if phase := e.kubectl(t, "get", "pod", name, "-o", "jsonpath={.status.phase}"); phase != "Running" {
			t.Errorf("after the attach the pod is %q, want Running (its stdin stays open)", phase)
		}
	})
}

const staticManifest = `
apiVersion: v1
kind: Pod
metadata: {name: static-web, namespace: default, labels: {app: static-web}}
spec:
  containers:
  - name: web
    image: ` + echoImage + `
    imagePullPolicy: Never
`

// testStaticPod: a manifest in a node's manifest dir runs there, and its
// mirror pod appears in the API with upstream's annotations; deleting the
// mirror does not stop it (the mirror comes back); removing the manifest
// removes both.
func testStaticPod(t *testing.T, e *env, node string) {
	path := filepath.Join(e.dataDir, "nodes", node, "manifests", "static-web.yaml")
	if err := os.WriteFile(path, []byte(staticManifest), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(path) })
	mirror := "static-web-" + node
	var uid string
	eventually(t, 2*time.Minute, "mirror pod "+mirror+" Running with its annotations", func() error {
		out, err := e.kubectlErr("get", "pod", mirror, "-o", `jsonpath={.status.phase} {.spec.nodeName} {.metadata.annotations.kubernetes\.io/config\.mirror} {.metadata.annotations.kubernetes\.io/config\.source} {.metadata.uid}`)
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		f := strings.Fields(out)
		if len(f) != 5 || f[0] != "Running" || f[1] != node || f[2] == "" || f[3] != "file" {
			return fmt.Errorf("mirror: %q", out)
		}
		uid = f[4]
		return nil
	})
	if out := e.kubectl(t, "exec", mirror, "--", "/waggle-echo", "hostname"); strings.TrimSpace(out) != "static-web-"+node {
		t.Errorf("exec in the static pod: %q", out)
	}
	e.kubectl(t, "delete", "pod", mirror, "--wait=false")
	eventually(t, time.Minute, "the mirror is made again", func() error {
		out, err := e.kubectlErr("get", "pod", mirror, "-o", "jsonpath={.metadata.uid} {.status.phase}")
		if err != nil || strings.HasPrefix(out, uid) || !strings.HasSuffix(out, "Running") {
			return fmt.Errorf("mirror %q %v", out, err)
		}
		return nil
	})
	os.Remove(path)
	eventually(t, time.Minute, "removing the manifest removes the mirror", func() error {
		out, err := e.kubectlErr("get", "pod", mirror)
		if err == nil || !strings.Contains(out, "NotFound") {
			return fmt.Errorf("still there: %s", out)
		}
		return nil
	})
}

// testIPAMPerNode is the regression test of the shared-IPAM bug: each lab
// node keeps its address reservations under its own directory (its CNI
// configuration's IPAM dataDir; never the host's /var/lib/cni/networks),
// and no address is reserved by two nodes; lab down removes the data dir.
func testIPAMPerNode(t *testing.T, e *env, nodes []string) {
	// A hostNetwork pod's IP is its node's: nothing is reserved for it.
	out := e.kubectl(t, "get", "pods", "-o", `jsonpath={range .items[?(@.status.podIP)]}{.spec.nodeName} {.status.podIP} {.spec.hostNetwork}{"\n"}{end}`)
	checked := 0
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || len(f) > 2 && f[2] == "true" {
			continue
		}
		node, ip := f[0], f[1]
		own, _ := filepath.Glob(filepath.Join(e.dataDir, "nodes", node, "kubelet", "ipam", "*", ip))
		if len(own) != 1 {
			t.Errorf("pod IP %s on %s: no reservation under the node's own IPAM dir", ip, node)
		}
		for _, other := range nodes {
			if other == node {
				continue
			}
			if m, _ := filepath.Glob(filepath.Join(e.dataDir, "nodes", other, "kubelet", "ipam", "*", ip)); len(m) > 0 {
				t.Errorf("pod IP %s of %s is also reserved by %s", ip, node, other)
			}
		}
		checked++
	}
	// Each node's CNI configuration points its IPAM at the node's own
	// directory (the host's /var/lib/cni/networks may hold reservations of
	// clusters from before the fix: it is not looked at).
	for _, n := range nodes {
		confs, _ := filepath.Glob(filepath.Join(e.dataDir, "nodes", n, "cni", "net.d", "*.conflist"))
		if len(confs) != 1 {
			t.Errorf("node %s: %d CNI configurations", n, len(confs))
			continue
		}
		b, _ := os.ReadFile(confs[0])
		if want := `"dataDir":"` + filepath.Join(e.dataDir, "nodes", n, "kubelet", "ipam") + `"`; !strings.Contains(strings.ReplaceAll(string(b), " ", ""), want) {
			t.Errorf("node %s: CNI IPAM not in the node's dir (want %s):\n%s", n, want, b)
		}
	}
	if checked == 0 {
		t.Fatalf("no pod with an IP to check:\n%s", out)
	}
}

// testHostNetworkPod: a hostNetwork pod is on its node's network, as on a
// real node: it listens on the node's address (another node reaches it
// there) even though the lab's containerd runs outside the node's
// network namespace.
func testHostNetworkPod(t *testing.T, e *env, nodes []string) {
	e.apply(t, fmt.Sprintf(`
apiVersion: v1
kind: Pod
metadata: {name: hostnet, namespace: default}
spec:
  nodeName: %s
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
  - name: echo
    image: %s
    imagePullPolicy: Never
    env:
    - {name: POD_NAME, value: hostnet}
    - {name: HTTP_PORT, value: "0"}
    - {name: UDP_PORT, value: "0"}
    - {name: TCP_PORT, value: "19000"}
`, nodes[0], echoImage))
	t.Cleanup(func() {
		if t.Failed() {
			// What the kubelet made of the pod, what the container said and
			// what listens in the node's network namespace.
			pod, _ := e.kubectlErr("get", "pod", "hostnet", "-o", "jsonpath={.status}")
			logs, _ := e.kubectlErr("logs", "hostnet", "--all-containers", "--previous=false")
			ss, _ := e.nodeExec(nodes[0], "ss", "-Htlnp")
			t.Logf("pod status: %s\ncontainer log:\n%s\nlistening in %s:\n%s", pod, logs, nodes[0], ss)
		}
		e.kubectlErr("delete", "pod", "hostnet", "--wait=false")
	})
	e.kubectl(t, "wait", "--for=condition=Ready", "pod/hostnet", "--timeout=2m")
	addr := fmt.Sprintf("%s:19000", e.cfg.NodeAddr(1).Addr())
	eventually(t, time.Minute, "the hostNetwork pod answers on "+addr+" from "+nodes[1], func() error {
		out, err := e.nodeExec(nodes[1], e.echoBin(), "dial", "-n", "1", "tcp", addr)
		if err != nil {
			return fmt.Errorf("%v:\n%s", err, out)
		}
		if a := answering(out); len(a) != 1 || a[0] != "hostnet" {
			return fmt.Errorf("answered: %q", out)
		}
		return nil
	})
}
