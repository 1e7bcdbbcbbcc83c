package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/waggle-io/waggle/kubelet/images"
)

// dsProbe is the dual-stack scenario's application: an echo pod on each
// node behind a RequireDualStack NodePort Service, IPv6 first.
type dsProbe struct {
	ns, kubeconfig string
	clusterIP6     string
	nodePort       int32
	nodes6         []string // every node's IPv6 lab address
	echo           string   // waggle-echo on the host, run in the client's namespace
	dataDir        string
}

const dsProbeName = "ha-ds"

// startDualStackProbe creates the dual-stack application in ns and waits
// until it answers on both paths.
func startDualStackProbe(ctx context.Context, cs kubernetes.Interface, st *State, dataDir, kubeconfig, ns string) (*dsProbe, error) {
	if st.Config == nil || !st.Config.DualStack() {
		return nil, errors.New("the dual-stack scenario needs a lab made with --dual-stack")
	}
	p := &dsProbe{ns: ns, kubeconfig: kubeconfig, dataDir: dataDir,
		echo: filepath.Join(filepath.Dir(st.Config.Binary), "waggle-echo")}
	if _, err := os.Stat(p.echo); err != nil {
		return nil, fmt.Errorf("the client dials with waggle-echo beside the waggle binary (make images): %w", err)
	}
	for _, n := range st.Nodes {
		if n.Addr6 == "" {
			return nil, fmt.Errorf("node %s has no IPv6 lab address", n.Name)
		}
		p.nodes6 = append(p.nodes6, n.Addr6)
	}
	if err := waitFor(ctx, 45*time.Second, "the default ServiceAccount of "+ns, func() error {
		_, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err
	}); err != nil {
		return nil, err
	}
	labels := map[string]string{"app": dsProbeName}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: dsProbeName}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr.To(int32(len(st.Nodes))),
		Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			AutomountServiceAccountToken:  ptr.To(false),
			TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelHostname,
				WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: labels}}},
			Containers: []corev1.Container{{Name: "echo", Image: images.EchoImage, ImagePullPolicy: corev1.PullNever,
				Env:            []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
				Ports:          []corev1.ContainerPort{{Name: "tcp", ContainerPort: 9000}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("tcp")}}, PeriodSeconds: 1},
			}},
		}},
	}}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: dsProbeName}, Spec: corev1.ServiceSpec{
		Type:           corev1.ServiceTypeNodePort,
		IPFamilyPolicy: ptr.To(corev1.IPFamilyPolicyRequireDualStack),
		IPFamilies:     []corev1.IPFamily{corev1.IPv6Protocol, corev1.IPv4Protocol},
		Selector:       labels,
		Ports:          []corev1.ServicePort{{Name: "tcp", Port: 80, TargetPort: intstr.FromString("tcp")}},
	}}
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	s, err := cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	if len(s.Spec.ClusterIPs) != 2 || !strings.Contains(s.Spec.ClusterIPs[0], ":") || len(s.Spec.Ports) != 1 {
		return nil, fmt.Errorf("service %s: clusterIPs %v, want an IPv6 one first and an IPv4 one", dsProbeName, s.Spec.ClusterIPs)
	}
	p.clusterIP6, p.nodePort = s.Spec.ClusterIPs[0], s.Spec.Ports[0].NodePort
	err = waitFor(ctx, 3*time.Minute, "the dual-stack Service to answer from every backend", func() error {
		_, err := p.check(ctx, cs, "")
		return err
	})
	return p, err
}

// check dials the Service's IPv6 ClusterIP from one echo pod (kubectl exec,
// through the pod's node's eBPF socket load balancer) and its NodePort on
// every node's IPv6 address from the lab's client, and wants every Ready
// backend pod to answer on each path, one of them named want when it is
// set (a pod created since). It returns the pod it dialed from.
func (p *dsProbe) check(ctx context.Context, cs kubernetes.Interface, want string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	l, err := cs.CoreV1().Pods(p.ns).List(cctx, metav1.ListOptions{LabelSelector: "app=" + dsProbeName})
	if err != nil {
		return "", err
	}
	var ready []string
	for _, pod := range l.Items {
		if pod.DeletionTimestamp == nil && slices.ContainsFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool {
			return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
		}) {
			ready = append(ready, pod.Name)
		}
	}
	slices.Sort(ready)
	if len(ready) < 2 || want != "" && !slices.Contains(ready, want) {
		return "", fmt.Errorf("ready backends %v (want two or more, with %q)", ready, want)
	}
	from := ready[0]
	if from == want {
		from = ready[1]
	}
	n := 8 * len(ready)
	out, err := exec.CommandContext(ctx, "kubectl", "--kubeconfig", p.kubeconfig, "--request-timeout=20s", "-n", p.ns, "exec", from, "--",
		"/waggle-echo", "dial", "-n", fmt.Sprint(n), "-timeout", "1s", "tcp", fmt.Sprintf("[%s]:80", p.clusterIP6)).CombinedOutput()
	if err := answeredBy(out, err, ready); err != nil {
		return from, fmt.Errorf("IPv6 ClusterIP [%s]:80 from pod %s: %w", p.clusterIP6, from, err)
	}
	for _, a := range p.nodes6 {
		var b bytes.Buffer
		err := Exec(ctx, p.dataDir, "client", []string{p.echo, "dial", "-n", fmt.Sprint(n), "-timeout", "1s", "tcp", fmt.Sprintf("[%s]:%d", a, p.nodePort)}, nil, &b, &b)
		if err := answeredBy(b.Bytes(), err, ready); err != nil {
			return from, fmt.Errorf("NodePort [%s]:%d from the client: %w", a, p.nodePort, err)
		}
	}
	return from, nil
}

// answeredBy checks a waggle-echo dial's output: every attempt answered,
// by each of pods.
func answeredBy(out []byte, err error, pods []string) error {
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	seen := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		if name, ok := strings.CutPrefix(l, "pod="); ok {
			name, _, _ = strings.Cut(name, " ")
			seen[name] = true
		}
	}
	for _, p := range pods {
		if !seen[p] {
			return fmt.Errorf("backend %s did not answer (answered: %v)", p, seen)
		}
	}
	return nil
}

// measureDualStack runs after the server's kill: the Service still answers
// on both IPv6 paths with the backends it had (the dataplane does not need
// the lost server), and then a backend replaced through the surviving
// control plane (deleted, recreated by the ReplicaSet controller, bound,
// started, its IPv6 endpoint written and programmed by every node's proxy)
// answers on both.
func measureDualStack(ctx context.Context, cs kubernetes.Interface, p *dsProbe, fault time.Time, res *HAResult) error {
	from, err := p.check(ctx, cs, "")
	if err != nil {
		return fmt.Errorf("right after the kill: %w", err)
	}
	res.DualStackKept = time.Since(fault)
	// Replace a backend other than the one dialing.
	l, err := cs.CoreV1().Pods(p.ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + dsProbeName})
	if err != nil {
		return err
	}
	old := map[string]bool{}
	victim := ""
	for _, pod := range l.Items {
		old[pod.Name] = true
		if pod.Name != from {
			victim = pod.Name
		}
	}
	if err := retryWrite(ctx, func(ctx context.Context) error {
		err := cs.CoreV1().Pods(p.ns).Delete(ctx, victim, metav1.DeleteOptions{})
		if apierrors.IsNotFound(err) {
			return nil // an earlier attempt was applied, its answer lost
		}
		return err
	}); err != nil {
		return fmt.Errorf("delete backend %s: %w", victim, err)
	}
	return waitFor(ctx, 2*time.Minute, "a replacement backend to answer on the IPv6 ClusterIP and NodePort", func() error {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		l, err := cs.CoreV1().Pods(p.ns).List(cctx, metav1.ListOptions{LabelSelector: "app=" + dsProbeName})
		if err != nil {
			return err
		}
		for _, pod := range l.Items {
			if !old[pod.Name] {
				if _, err := p.check(ctx, cs, pod.Name); err != nil {
					return err
				}
				res.DualStackReplaced, res.DualStackNewBackend = time.Since(fault), pod.Name
				return nil
			}
		}
		return errors.New("no replacement pod yet")
	})
}
