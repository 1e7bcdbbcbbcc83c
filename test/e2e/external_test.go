package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/waggle-io/waggle/dataplane/l2announce"
	"github.com/waggle-io/waggle/lab"
)

// extApp is three echo pods pinned to nodes (ext-a and ext-b on the first,
// ext-c on the second; the short tolerations let a lost node's pods go
// quickly) behind two LoadBalancer Services: ext-cluster (all three,
// externalTrafficPolicy Cluster) and ext-local (the first node's two,
// Local).
func extApp(nodes []string) string {
	var b strings.Builder
	for _, p := range []struct{ name, node, local string }{
		{"ext-a", nodes[0], "yes"}, {"ext-b", nodes[0], "yes"}, {"ext-c", nodes[1], "no"},
	} {
		fmt.Fprintf(&b, `
apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: default, labels: {app: ext, local: "%s"}}
spec:
  nodeName: %s
  terminationGracePeriodSeconds: 1
  tolerations:
  - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 2}
  - {key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 2}
  containers:
  - name: echo
    image: %s
    imagePullPolicy: Never
    env:
    - name: POD_NAME
      valueFrom: {fieldRef: {fieldPath: metadata.name}}
    ports:
    - {name: tcp, containerPort: 9000}
    readinessProbe:
      tcpSocket: {port: 9000}
      periodSeconds: 1
---
`, p.name, p.local, p.node, echoImage)
	}
	b.WriteString(`
apiVersion: v1
kind: Service
metadata: {name: ext-cluster, namespace: default}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Cluster
  selector: {app: ext}
  ports:
  - {name: tcp, port: 80, targetPort: tcp, nodePort: 30081}
---
apiVersion: v1
kind: Service
metadata: {name: ext-local, namespace: default}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  selector: {app: ext, local: "yes"}
  ports:
  - {name: tcp, port: 80, targetPort: tcp, nodePort: 30082}
`)
	return b.String()
}

// testExternalClient reaches NodePorts and LoadBalancer IPs from the lab's
// client namespace, a machine on the lab network that is no node: with
// externalTrafficPolicy Cluster and Local, then across the loss of the node
// that answers ARP for a LoadBalancer IP.
func testExternalClient(t *testing.T, e *env, nodes []string) {
	eventually(t, 3*time.Minute, "every node Ready", func() error {
		out := e.kubectl(t, "get", "nodes", "-o", "jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}")
		for _, n := range nodes {
			if !strings.Contains(out, n+" True") {
				return fmt.Errorf("%s not Ready:\n%s", n, out)
			}
		}
		return nil
	})
	e.apply(t, extApp(nodes))
	t.Cleanup(func() {
		e.kubectlErr("delete", "service/ext-cluster", "service/ext-local", "--wait=true", "--timeout=1m")
		e.kubectlErr("delete", "pod", "-l", "app=ext", "--wait=true", "--timeout=1m")
	})
	e.kubectl(t, "wait", "--for=condition=Ready", "pod", "-l", "app=ext", "--timeout=3m")
	lbIP := func(svc string) string {
		var ip string
		eventually(t, 30*time.Second, svc+" gets a LoadBalancer address", func() error {
			ip = strings.TrimSpace(e.kubectl(t, "get", "service", svc, "-o", "jsonpath={.status.loadBalancer.ingress[0].ip}"))
			if ip == "" {
				return fmt.Errorf("status.loadBalancer.ingress is empty")
			}
			return nil
		})
		return ip
	}
	clusterIP, localIP := lbIP("ext-cluster"), lbIP("ext-local")
	client := e.cfg.ClientAddr().Addr().String()
	nodeAddr := map[string]string{nodes[0]: e.cfg.NodeAddr(1).Addr().String(), nodes[1]: e.cfg.NodeAddr(2).Addr().String()}
	podNode := map[string]string{"ext-a": nodes[0], "ext-b": nodes[0], "ext-c": nodes[1]}
	t.Logf("client %s; ext-cluster %s, ext-local %s", client, clusterIP, localIP)

	// through wants every reply of a dial through node entry to come from
	// the pods in want, each with the source address the Service's policy
	// gives it: the client's for a pod on the entry node (DNAT only), the
	// entry node's for a pod on the other (SNAT).
	through := func(addr, entry string, want []string) error {
		out, err := e.clientExec(e.echoBin(), "dial", "-n", "30", "tcp", addr)
		if err != nil {
			return fmt.Errorf("%v:\n%s", err, out)
		}
		got := replies(out)
		var names []string
		for pod, srcs := range got {
			names = append(names, pod)
			wantSrc := client
			if podNode[pod] != entry {
				wantSrc = nodeAddr[entry]
			}
			for _, s := range srcs {
				if s != wantSrc {
					return fmt.Errorf("%s on %s saw the client as %s through %s, want %s:\n%s", pod, podNode[pod], s, entry, wantSrc, out)
				}
			}
		}
		sort.Strings(names)
		if strings.Join(names, ",") != strings.Join(want, ",") {
			return fmt.Errorf("answered by %v, want %v:\n%s", names, want, out)
		}
		return nil
	}

	t.Run("ClusterPolicy", func(t *testing.T) {
		all := []string{"ext-a", "ext-b", "ext-c"}
		for _, n := range nodes {
			addr := nodeAddr[n] + ":30081"
			eventually(t, 30*time.Second, "NodePort "+addr+" answers the client with all 3 pods", func() error {
				return through(addr, n, all)
			})
		}
		holder := e.l2Holder(t, clusterIP)
		t.Logf("%s is announced by %s", clusterIP, holder)
		eventually(t, 30*time.Second, "LoadBalancer "+clusterIP+" answers the client with all 3 pods", func() error {
			return through(clusterIP+":80", e.l2Holder(t, clusterIP), all)
		})
		e.checkNeighbour(t, clusterIP, e.l2Holder(t, clusterIP))
	})

	t.Run("LocalPolicy", func(t *testing.T) {
		local := []string{"ext-a", "ext-b"}
		addr := nodeAddr[nodes[0]] + ":30082"
		eventually(t, 30*time.Second, "NodePort "+addr+" answers the client from its 2 local pods with the client's address", func() error {
			return through(addr, nodes[0], local)
		})
		eventually(t, 30*time.Second, "LoadBalancer "+localIP+" is announced by "+nodes[0]+", the one node with local pods", func() error {
			if h := e.l2Holder(t, localIP); h != nodes[0] {
				return fmt.Errorf("holder %q", h)
			}
			return nil
		})
		eventually(t, 30*time.Second, "LoadBalancer "+localIP+" answers the client from the 2 local pods with the client's address", func() error {
			return through(localIP+":80", nodes[0], local)
		})
		e.checkNeighbour(t, localIP, nodes[0])

		hc := strings.TrimSpace(e.kubectl(t, "get", "service", "ext-local", "-o", "jsonpath={.spec.healthCheckNodePort}"))
		if hc == "" || hc == "0" {
			t.Fatalf("ext-local has no healthCheckNodePort")
		}
		for _, c := range []struct {
			node, code string
			count      int
		}{{nodes[0], "200", 2}, {nodes[1], "503", 0}} {
			url := fmt.Sprintf("http://%s:%s/healthz", nodeAddr[c.node], hc)
			eventually(t, 30*time.Second, url+" reports "+c.code, func() error {
				out, err := e.clientExec("curl", "-sS", "-m", "2", "-w", "\n%{http_code}", url)
				if err != nil {
					return fmt.Errorf("%v: %s", err, out)
				}
				out = strings.TrimSpace(out)
				nl := strings.LastIndex(out, "\n")
				if nl < 0 {
					return fmt.Errorf("no body: %q", out)
				}
				body, code := out[:nl], out[nl+1:]
				var st struct {
					LocalEndpoints *int `json:"localEndpoints"`
				}
				if err := json.Unmarshal([]byte(body), &st); err != nil || st.LocalEndpoints == nil {
					return fmt.Errorf("HTTP %s, body %q: %v", code, body, err)
				}
				if code != c.code || *st.LocalEndpoints != c.count {
					return fmt.Errorf("HTTP %s with localEndpoints %d, want %s with %d", code, *st.LocalEndpoints, c.code, c.count)
				}
				return nil
			})
		}

		// The first node answered above; the second has no local pod and
		// must not forward to the first node's (refused or dropped).
		other := nodeAddr[nodes[1]] + ":30082"
		out, err := e.clientExec(e.echoBin(), "dial", "-n", "5", "-timeout", "1s", "tcp", other)
		if err == nil || len(answering(out)) > 0 || !strings.Contains(out, ": 0 ok, 5 failed") {
			t.Errorf("NodePort %s of a Local Service answered the client without a local pod: %v\n%s", other, err, out)
		}
	})

	t.Run("LoadBalancerFailsOverOnANodeLoss", func(t *testing.T) { testLBFailover(t, e, nodes, clusterIP, podNode) })
}

// testLBFailover cuts the lab link of the node that announces ip (a node
// loss: it no longer answers ARP nor renews its Lease) and measures how long
// the client goes without an answer from ip: the other node takes the
// Lease once it expires and announces the IP with a gratuitous ARP. The
// link comes back at the end and the node is Ready again.
func testLBFailover(t *testing.T, e *env, nodes []string, ip string, podNode map[string]string) {
	st, err := lab.LoadState(e.dataDir)
	if err != nil {
		t.Fatal(err)
	}
	dead := e.l2Holder(t, ip)
	var veth, survivor string
	for _, n := range st.Nodes {
		if n.Name == dead {
			veth = n.HostVeth
		}
	}
	for _, n := range nodes {
		if n != dead {
			survivor = n
		}
	}
	if veth == "" || survivor == "" {
		t.Fatalf("lease holder %q of %s is not one of the lab's nodes %v", dead, ip, nodes)
	}
	addr := ip + ":80"
	// Answered before the loss.
	eventually(t, 30*time.Second, addr+" answers the client", func() error {
		out, err := e.clientExec(e.echoBin(), "dial", "-n", "5", "tcp", addr)
		if err != nil {
			return fmt.Errorf("%v:\n%s", err, out)
		}
		return nil
	})

	t.Logf("node loss: %s (announcing %s) loses its lab link %s", dead, ip, veth)
	run(t, "ip", "link", "set", veth, "down")
	lost := time.Now()
	t.Cleanup(func() {
		run(t, "ip", "link", "set", veth, "up")
		eventually(t, 3*time.Minute, dead+" Ready again after its link came back", func() error {
			st := strings.TrimSpace(e.kubectl(t, "get", "node", dead, "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}"))
			if st != "True" {
				return fmt.Errorf("Ready=%s", st)
			}
			return nil
		})
	})

	var first, leased, every time.Duration
	eventually(t, 2*time.Minute, addr+" answers the client again", func() error {
		out, err := e.clientExec(e.echoBin(), "dial", "-n", "1", "-timeout", "500ms", "tcp", addr)
		if err != nil || len(answering(out)) == 0 {
			return fmt.Errorf("%v:\n%s", err, out)
		}
		first = time.Since(lost)
		return nil
	})
	eventually(t, time.Minute, "the Lease of "+ip+" moves to "+survivor, func() error {
		if h := e.l2Holder(t, ip); h != survivor {
			return fmt.Errorf("holder %q", h)
		}
		leased = time.Since(lost)
		return nil
	})
	e.checkNeighbour(t, ip, survivor)
	// Once the lost node's pods are out of the endpoints, every connect
	// succeeds, and only the survivor's pods answer.
	eventually(t, 2*time.Minute, "every connect to "+addr+" succeeds from the survivor's pods", func() error {
		out, err := e.clientExec(e.echoBin(), "dial", "-n", "20", "-timeout", "1s", "tcp", addr)
		if err != nil {
			return fmt.Errorf("%v:\n%s", err, out)
		}
		for _, p := range answering(out) {
			if podNode[p] != survivor {
				return fmt.Errorf("%s on the lost node %s answered:\n%s", p, dead, out)
			}
		}
		every = time.Since(lost)
		return nil
	})
	t.Logf("failover of %s from %s to %s after the node loss: first answer %v, Lease moved by %v, every connect answered %v",
		ip, dead, survivor, first.Round(time.Millisecond), leased.Round(time.Millisecond), every.Round(time.Millisecond))
}

// clientExec runs a command in the lab's client namespace (waggle lab exec).
func (e *env) clientExec(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, e.bin, append([]string{"lab", "exec", "--data-dir", e.dataDir, "client", "--"}, args...)...).CombinedOutput()
	return string(out), err
}

// clientReaches dials addr 30 times from the lab's client namespace and
// wants exactly backends distinct pods to answer.
func (e *env) clientReaches(addr string, backends int) error {
	out, err := e.clientExec(e.echoBin(), "dial", "-n", "30", "tcp", addr)
	if err != nil {
		return fmt.Errorf("%v:\n%s", err, out)
	}
	if b := answering(out); len(b) != backends {
		return fmt.Errorf("%d distinct backends answered:\n%s", len(b), out)
	}
	return nil
}

// l2Holder is the node holding the L2 announcement Lease of ip ("" if none).
func (e *env) l2Holder(t *testing.T, ip string) string {
	t.Helper()
	a, err := netip.ParseAddr(ip)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := e.kubectlErr("get", "lease", "-n", "kube-system", l2announce.LeaseName(a), "-o", "jsonpath={.spec.holderIdentity}")
	if strings.Contains(out, "NotFound") {
		return ""
	}
	return strings.TrimSpace(out)
}

var lladdr = regexp.MustCompile(`lladdr ([0-9a-f:]{17})`)

// checkNeighbour wants the client's neighbour entry for ip to be node's
// lab interface: the node answered the client's ARP request (or announced
// the IP).
func (e *env) checkNeighbour(t *testing.T, ip, node string) {
	t.Helper()
	link, err := e.nodeExec(node, "ip", "-o", "link", "show", "eth0")
	if err != nil {
		t.Fatalf("eth0 of %s: %v\n%s", node, err, link)
	}
	mac := regexp.MustCompile(`link/ether ([0-9a-f:]{17})`).FindStringSubmatch(link)
	eventually(t, 10*time.Second, "the client's neighbour entry of "+ip+" is "+node+"'s", func() error {
		out, err := e.clientExec("ip", "neigh", "show", ip)
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		got := lladdr.FindStringSubmatch(out)
		if mac == nil || got == nil || got[1] != mac[1] {
			return fmt.Errorf("neighbour %q, %s's eth0 %q", strings.TrimSpace(out), node, link)
		}
		return nil
	})
}

// replies maps each answering pod to the client addresses it reported
// ("pod=NAME client=ADDR:PORT" lines of waggle-echo dial).
func replies(out string) map[string][]string {
	got := map[string][]string{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(strings.TrimSpace(l))
		if len(f) < 2 || !strings.HasPrefix(f[0], "pod=") || !strings.HasPrefix(f[1], "client=") {
			continue
		}
		src := strings.TrimPrefix(f[1], "client=")
		if ap, err := netip.ParseAddrPort(src); err == nil {
			src = ap.Addr().String()
		}
		pod := strings.TrimPrefix(f[0], "pod=")
		got[pod] = append(got[pod], src)
	}
	return got
}
