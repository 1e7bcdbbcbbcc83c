package controllers

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"

	"github.com/waggle-io/waggle/internal/leaderelect"
)

func TestDeploymentRolloutUndoAndScaleThroughKubectl(t *testing.T) {
	c := newCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c.startKubelets(ctx, 3, nil)
	c.startManager("cm-0", nil)

	c.kubectlOK("create", "deployment", "web", "--image=nginx:1", "--replicas=3")
	out := c.kubectlOK("rollout", "status", "deployment/web", "--timeout=60s")
	if !strings.Contains(out, "successfully rolled out") {
		t.Fatalf("rollout status: %s", out)
	}

	c.kubectlOK("set", "image", "deployment/web", "nginx=nginx:2")
	c.kubectlOK("rollout", "status", "deployment/web", "--timeout=60s")
	hist := c.kubectlOK("rollout", "history", "deployment/web")
	if !strings.Contains(hist, "1 ") || !strings.Contains(hist, "2 ") {
		t.Fatalf("rollout history lacks revisions 1 and 2:\n%s", hist)
	}

	c.kubectlOK("rollout", "undo", "deployment/web")
	c.kubectlOK("rollout", "status", "deployment/web", "--timeout=60s")
	d, err := c.cs.AppsV1().Deployments("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if img := d.Spec.Template.Spec.Containers[0].Image; img != "nginx:1" {
		t.Fatalf("after undo the image is %s, want nginx:1", img)
	}
	eventually(t, 30*time.Second, func() error {
		rss, err := c.cs.AppsV1().ReplicaSets("default").List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return err
		}
		if len(rss.Items) != 2 {
			return fmt.Errorf("%d replica sets, want 2 (the old one was reused)", len(rss.Items))
		}
		for _, rs := range rss.Items {
			if rs.Spec.Template.Spec.Containers[0].Image == "nginx:1" {
				if rs.Annotations["deployment.kubernetes.io/revision"] != "3" || rs.Annotations["deployment.kubernetes.io/revision-history"] != "1" {
					return fmt.Errorf("rolled-back rs annotations %v", rs.Annotations)
				}
				if *rs.Spec.Replicas != 3 {
					return fmt.Errorf("rolled-back rs has %d replicas", *rs.Spec.Replicas)
				}
			} else if *rs.Spec.Replicas != 0 {
				return fmt.Errorf("old rs %s still has %d replicas", rs.Name, *rs.Spec.Replicas)
			}
		}
		return nil
	})

	// The controllers record what they did as Events, as on Kubernetes.
	eventually(t, 30*time.Second, func() error {
		evs, err := c.cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return err
		}
		reasons := map[string]bool{}
		for _, e := range evs.Items {
			reasons[e.InvolvedObject.Kind+"/"+e.Reason] = true
		}
		if !reasons["Deployment/ScalingReplicaSet"] || !reasons["ReplicaSet/SuccessfulCreate"] || !reasons["ReplicaSet/SuccessfulDelete"] {
			return fmt.Errorf("event reasons %v", reasons)
		}
		return nil
	})

	c.kubectlOK("scale", "deployment/web", "--replicas=5")
	c.kubectlOK("rollout", "status", "deployment/web", "--timeout=60s")
	eventually(t, 30*time.Second, func() error {
		d, err := c.cs.AppsV1().Deployments("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.AvailableReplicas != 5 || d.Status.UpdatedReplicas != 5 || d.Status.ObservedGeneration != d.Generation {
			return fmt.Errorf("status %+v", d.Status)
		}
		pods, err := c.cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{ResourceVersion: "0", LabelSelector: "app=web"})
		if err != nil {
			return err
		}
		if len(pods.Items) != 5 {
			return fmt.Errorf("%d pods", len(pods.Items))
		}
		return nil
	})

	// Pause: a template change makes no new ReplicaSet until resumed.
	c.kubectlOK("rollout", "pause", "deployment/web")
	c.kubectlOK("set", "image", "deployment/web", "nginx=nginx:3")
	// Marker: the controller has synced the new template (observedGeneration).
	eventually(t, 30*time.Second, func() error {
		d, err := c.cs.AppsV1().Deployments("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.ObservedGeneration < d.Generation {
			return fmt.Errorf("observedGeneration %d < generation %d", d.Status.ObservedGeneration, d.Generation)
		}
		return nil
	})
	rss, _ := c.cs.AppsV1().ReplicaSets("default").List(ctx, metav1.ListOptions{ResourceVersion: "0"})
	for _, rs := range rss.Items {
		if rs.Spec.Template.Spec.Containers[0].Image == "nginx:3" {
			t.Fatal("a paused deployment rolled out")
		}
	}
	c.kubectlOK("rollout", "resume", "deployment/web")
	c.kubectlOK("rollout", "status", "deployment/web", "--timeout=60s")
}

func TestRolloutStatusReportsProgressDeadlineExceeded(t *testing.T) {
	c := newCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	// Pods never become ready.
	c.startKubelets(ctx, 1, func(*corev1.Pod) bool { return false })
	c.startManager("cm-0", nil)
	c.kubectlOK("create", "deployment", "stuck", "--image=nginx:1", "--replicas=1")
	c.kubectlOK("patch", "deployment/stuck", "-p", `{"spec":{"progressDeadlineSeconds":2}}`)
	out, err := c.run("rollout", "status", "deployment/stuck", "--timeout=60s")
	if err == nil || !strings.Contains(out, "exceeded its progress deadline") {
		t.Fatalf("want kubectl to report the exceeded deadline, got err=%v:\n%s", err, out)
	}
}

func TestEndpointSlicesFollowPodReadiness(t *testing.T) {
	c := newCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	readyPods := map[string]bool{}
	var k *kubelets
	k = c.startKubelets(ctx, 2, func(p *corev1.Pod) bool { return readyPods[p.Name] })
	c.startManager("cm-0", nil)

	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: "default", Labels: map[string]string{"tier": "backend"}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "api"}, Ports: []corev1.ServicePort{
			{Name: "http", Port: 80, TargetPort: intstr.FromString("web")},
		}}}
	if _, err := c.cs.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i, port := range []int32{8080, 8080, 9090} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("api-%d", i), Namespace: "default", Labels: map[string]string{"app": "api"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x", Ports: []corev1.ContainerPort{{Name: "web", ContainerPort: port}}}}}}
		if _, err := c.cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	type epState struct{ ready, serving, terminating bool }
	state := func() (map[string]epState, map[string]int32, error) {
		l, err := c.cs.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{ResourceVersion: "0", LabelSelector: discoveryv1.LabelServiceName + "=api"})
		if err != nil {
			return nil, nil, err
		}
		eps, ports := map[string]epState{}, map[string]int32{}
		for _, s := range l.Items {
			if s.Labels[discoveryv1.LabelManagedBy] != "endpointslice-controller.k8s.io" || s.Labels["tier"] != "backend" {
				return nil, nil, fmt.Errorf("slice %s labels %v", s.Name, s.Labels)
			}
			for _, e := range s.Endpoints {
				if e.NodeName == nil || e.Zone == nil {
					return nil, nil, fmt.Errorf("endpoint %v lacks nodeName/zone", e.Addresses)
				}
				eps[e.TargetRef.Name] = epState{*e.Conditions.Ready, *e.Conditions.Serving, *e.Conditions.Terminating}
				for _, p := range s.Ports {
					ports[e.TargetRef.Name] = *p.Port
				}
			}
		}
		return eps, ports, nil
	}
	eventually(t, 30*time.Second, func() error {
		eps, ports, err := state()
		if err != nil {
			return err
		}
		if len(eps) != 3 || eps["api-0"].ready {
			return fmt.Errorf("endpoints %v", eps)
		}
		// The named targetPort is resolved per pod.
		if ports["api-0"] != 8080 || ports["api-2"] != 9090 {
			return fmt.Errorf("ports %v", ports)
		}
		return nil
	})

	k.mu.Lock()
	readyPods["api-0"], readyPods["api-1"] = true, true
	k.mu.Unlock()
	for _, n := range []string{"api-0", "api-1"} {
		// Touch the pods so the simulated kubelet re-evaluates readiness.
		p, _ := c.cs.CoreV1().Pods("default").Get(ctx, n, metav1.GetOptions{})
		k.handle(ctx, p)
	}
	eventually(t, 30*time.Second, func() error {
		eps, _, err := state()
		if err != nil {
			return err
		}
		if !eps["api-0"].ready || !eps["api-1"].ready || eps["api-2"].ready {
			return fmt.Errorf("endpoints %v", eps)
		}
		ep, err := c.cs.CoreV1().Endpoints("default").Get(ctx, "api", metav1.GetOptions{})
		if err != nil {
			return err
		}
		ready, notReady := 0, 0
		for _, s := range ep.Subsets {
			ready += len(s.Addresses)
			notReady += len(s.NotReadyAddresses)
		}
		if ready != 2 || notReady != 1 {
			return fmt.Errorf("legacy endpoints: %d ready, %d not ready", ready, notReady)
		}
		return nil
	})

	// A terminating pod stays in the slice, not ready, still serving; the
	// simulated kubelet does not finalize it while this test holds it.
	k.setReady(func(p *corev1.Pod) bool { return readyPods[p.Name] })
	p, _ := c.cs.CoreV1().Pods("default").Get(ctx, "api-1", metav1.GetOptions{})
	fin := p.DeepCopy()
	fin.Finalizers = append(fin.Finalizers, "test.waggle.io/hold")
	if _, err := c.cs.CoreV1().Pods("default").Update(ctx, fin, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.cs.CoreV1().Pods("default").Delete(ctx, "api-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		eps, _, err := state()
		if err != nil {
			return err
		}
		if e := eps["api-1"]; !e.terminating || e.ready || !e.serving {
			return fmt.Errorf("terminating endpoint %+v", e)
		}
		return nil
	})
	p, _ = c.cs.CoreV1().Pods("default").Get(ctx, "api-1", metav1.GetOptions{})
	p.Finalizers = nil
	_, _ = c.cs.CoreV1().Pods("default").Update(ctx, p, metav1.UpdateOptions{})
	eventually(t, 30*time.Second, func() error {
		eps, _, err := state()
		if err != nil {
			return err
		}
		if _, ok := eps["api-1"]; ok || len(eps) != 2 {
			return fmt.Errorf("endpoints %v", eps)
		}
		return nil
	})

	// A selector change moves the endpoints to the newly selected pods.
	s, _ := c.cs.CoreV1().Services("default").Get(ctx, "api", metav1.GetOptions{})
	s.Spec.Selector = map[string]string{"app": "api", "pick": "me"}
	if _, err := c.cs.CoreV1().Services("default").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	p, _ = c.cs.CoreV1().Pods("default").Get(ctx, "api-2", metav1.GetOptions{})
	p.Labels["pick"] = "me"
	if _, err := c.cs.CoreV1().Pods("default").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		eps, _, err := state()
		if err != nil {
			return err
		}
		if _, ok := eps["api-2"]; !ok || len(eps) != 1 {
			return fmt.Errorf("endpoints %v", eps)
		}
		return nil
	})

	// Deleting the Service takes its slices and Endpoints with it.
	if err := c.cs.CoreV1().Services("default").Delete(ctx, "api", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		l, err := c.cs.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{ResourceVersion: "0", LabelSelector: discoveryv1.LabelServiceName + "=api"})
		if err != nil {
			return err
		}
		if len(l.Items) != 0 {
			return fmt.Errorf("%d slices left", len(l.Items))
		}
		if _, err := c.cs.CoreV1().Endpoints("default").Get(ctx, "api", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("endpoints still there (err %v)", err)
		}
		return nil
	})
}

func TestEndpointSlicesHoldAtMost100Endpoints(t *testing.T) {
	c := newCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c.startKubelets(ctx, 3, nil)
	c.startManager("cm-0", nil)
	c.kubectlOK("create", "deployment", "many", "--image=x", "--replicas=150", "--port=8080")
	c.kubectlOK("expose", "deployment/many", "--port=80", "--target-port=8080")
	eventually(t, 90*time.Second, func() error {
		l, err := c.cs.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{ResourceVersion: "0", LabelSelector: discoveryv1.LabelServiceName + "=many"})
		if err != nil {
			return err
		}
		total, ready := 0, 0
		for _, s := range l.Items {
			if len(s.Endpoints) > 100 {
				return fmt.Errorf("slice %s has %d endpoints", s.Name, len(s.Endpoints))
			}
			for _, e := range s.Endpoints {
				total++
				if *e.Conditions.Ready {
					ready++
				}
			}
		}
		if len(l.Items) != 2 || total != 150 || ready != 150 {
			return fmt.Errorf("%d slices, %d endpoints, %d ready", len(l.Items), total, ready)
		}
		return nil
	})
}

func TestCascadingDeletion(t *testing.T) {
	c := newCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c.startKubelets(ctx, 2, nil)
	c.startManager("cm-0", nil)

	count := func(app string) (rs, pods int, orphans int) {
		rl, _ := c.cs.AppsV1().ReplicaSets("default").List(ctx, metav1.ListOptions{ResourceVersion: "0", LabelSelector: "app=" + app})
		pl, _ := c.cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{ResourceVersion: "0", LabelSelector: "app=" + app})
		for _, r := range rl.Items {
			if len(r.OwnerReferences) == 0 {
				orphans++
			}
		}
		return len(rl.Items), len(pl.Items), orphans
	}
	for _, tc := range []struct {
		cascade                string
		wantRS, wantPods, orph int
	}{
		{"background", 0, 0, 0},
		{"foreground", 0, 0, 0},
		{"orphan", 1, 2, 1},
	} {
		t.Run(tc.cascade, func(t *testing.T) {
			app := "gc-" + tc.cascade
			c.kubectlOK("create", "deployment", app, "--image=x", "--replicas=2")
			c.kubectlOK("rollout", "status", "deployment/"+app, "--timeout=60s")
			c.kubectlOK("delete", "deployment", app, "--cascade="+tc.cascade, "--wait=true", "--timeout=60s")
			eventually(t, 60*time.Second, func() error {
				if _, err := c.cs.AppsV1().Deployments("default").Get(ctx, app, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					return fmt.Errorf("deployment still there (err %v)", err)
				}
				rs, pods, orph := count(app)
				if rs != tc.wantRS || pods != tc.wantPods || orph != tc.orph {
					return fmt.Errorf("%d replica sets (%d orphans), %d pods", rs, orph, pods)
				}
				return nil
			})
		})
	}
}

func TestForegroundDeletionWaitsForBlockingDependents(t *testing.T) {
	c := newCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c.startManager("cm-0", func(cfg *Config) { cfg.Controllers = []string{"garbagecollector"} })
	owner, err := c.cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	yes := true
	dep := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "dep", Finalizers: []string{"test.waggle.io/hold"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "owner", UID: owner.UID, BlockOwnerDeletion: &yes}}}}
	if _, err := c.cs.CoreV1().ConfigMaps("default").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	fg := metav1.DeletePropagationForeground
	if err := c.cs.CoreV1().ConfigMaps("default").Delete(ctx, "owner", metav1.DeleteOptions{PropagationPolicy: &fg}); err != nil {
		t.Fatal(err)
	}
	// The dependent is being deleted but held by its finalizer: the owner
	// must wait, with the foregroundDeletion finalizer.
	eventually(t, 30*time.Second, func() error {
		d, err := c.cs.CoreV1().ConfigMaps("default").Get(ctx, "dep", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.DeletionTimestamp == nil {
			return errNotYet
		}
		return nil
	})
	// Marker: a second foreground deletion, whose dependent holds nothing,
	// completes; the collector has acted on the first owner by then.
	owner2, err := c.cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner2"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dep2 := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "dep2",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "owner2", UID: owner2.UID, BlockOwnerDeletion: &yes}}}}
	if _, err := c.cs.CoreV1().ConfigMaps("default").Create(ctx, dep2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.cs.CoreV1().ConfigMaps("default").Delete(ctx, "owner2", metav1.DeleteOptions{PropagationPolicy: &fg}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		if _, err := c.cs.CoreV1().ConfigMaps("default").Get(ctx, "owner2", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("owner2 still there (err %v)", err)
		}
		return nil
	})
	o, err := c.cs.CoreV1().ConfigMaps("default").Get(ctx, "owner", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("owner went before its blocking dependent: %v", err)
	}
	if len(o.Finalizers) == 0 || o.Finalizers[0] != metav1.FinalizerDeleteDependents {
		t.Fatalf("owner finalizers %v", o.Finalizers)
	}
	d, _ := c.cs.CoreV1().ConfigMaps("default").Get(ctx, "dep", metav1.GetOptions{})
	d.Finalizers = nil
	if _, err := c.cs.CoreV1().ConfigMaps("default").Update(ctx, d, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		_, err := c.cs.CoreV1().ConfigMaps("default").Get(ctx, "owner", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("owner still there (err %v)", err)
	})
}

func TestDaemonSetRunsOnePodPerEligibleNodeAndRollsOut(t *testing.T) {
	c := newCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c.startKubelets(ctx, 3, nil)
	// node-2 is tainted NoSchedule; the daemon set does not tolerate it.
	n, _ := c.cs.CoreV1().Nodes().Get(ctx, "node-2", metav1.GetOptions{})
	n.Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: "db", Effect: corev1.TaintEffectNoSchedule}}
	if _, err := c.cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.startManager("cm-0", nil)
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "agent", Namespace: "default"},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "agent"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "agent"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "a", Image: "agent:1"}}}},
		}}
	if _, err := c.cs.AppsV1().DaemonSets("default").Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.kubectlOK("rollout", "status", "daemonset/agent", "--timeout=60s")
	nodesOf := func() (map[string]string, error) {
		l, err := c.cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{ResourceVersion: "0", LabelSelector: "app=agent"})
		if err != nil {
			return nil, err
		}
		m := map[string]string{}
		for _, p := range l.Items {
			if p.DeletionTimestamp != nil {
				continue
			}
			if _, dup := m[p.Spec.NodeName]; dup {
				return nil, fmt.Errorf("two pods on %s", p.Spec.NodeName)
			}
			if targetNode(&p) != p.Spec.NodeName {
				return nil, fmt.Errorf("pod %s pinned to %q but on %q", p.Name, targetNode(&p), p.Spec.NodeName)
			}
			m[p.Spec.NodeName] = p.Spec.Containers[0].Image
		}
		return m, nil
	}
	m, err := nodesOf()
	if err != nil || len(m) != 2 || m["node-2"] != "" {
		t.Fatalf("daemon pods on %v (err %v), want node-0 and node-1", m, err)
	}
	c.kubectlOK("set", "image", "daemonset/agent", "a=agent:2")
	c.kubectlOK("rollout", "status", "daemonset/agent", "--timeout=60s")
	eventually(t, 30*time.Second, func() error {
		m, err := nodesOf()
		if err != nil {
			return err
		}
		if len(m) != 2 || m["node-0"] != "agent:2" || m["node-1"] != "agent:2" {
			return fmt.Errorf("images by node %v", m)
		}
		return nil
	})
	got, _ := c.cs.AppsV1().DaemonSets("default").Get(ctx, "agent", metav1.GetOptions{})
	if s := got.Status; s.DesiredNumberScheduled != 2 || s.UpdatedNumberScheduled != 2 || s.NumberAvailable != 2 || s.NumberMisscheduled != 0 {
		t.Fatalf("status %+v", s)
	}

	// With maxSurge the new pod starts beside the old one first.
	c.kubectlOK("patch", "daemonset/agent", "-p", `{"spec":{"updateStrategy":{"rollingUpdate":{"maxSurge":1,"maxUnavailable":0}}}}`)
	c.kubectlOK("set", "image", "daemonset/agent", "a=agent:3")
	c.kubectlOK("rollout", "status", "daemonset/agent", "--timeout=60s")
	eventually(t, 30*time.Second, func() error {
		m, err := nodesOf()
		if err != nil {
			return err
		}
		if len(m) != 2 || m["node-0"] != "agent:3" || m["node-1"] != "agent:3" {
			return fmt.Errorf("images by node %v", m)
		}
		return nil
	})

	// A node that joins gets its daemon pod; one that leaves loses it.
	if _, err := c.cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-new"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		m, err := nodesOf()
		if err != nil {
			return err
		}
		if len(m) != 3 || m["node-new"] != "agent:3" {
			return fmt.Errorf("images by node %v", m)
		}
		return nil
	})
	if err := c.cs.CoreV1().Nodes().Delete(ctx, "node-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		m, err := nodesOf()
		if err != nil {
			return err
		}
		if _, ok := m["node-0"]; ok || len(m) != 2 {
			return fmt.Errorf("images by node %v", m)
		}
		return nil
	})
}

func TestLeaderFailoverHandsOverTheControllers(t *testing.T) {
	c := newCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c.startKubelets(ctx, 1, nil)
	port := freePort(t)
	a := c.startManager("cm-a", func(cfg *Config) {
		cfg.SecureServing.BindAddress, cfg.SecureServing.SecurePort = "127.0.0.1", port
		cfg.LeaderElection = fastLease("cm-a")
	})
	holder := func() string {
		l, err := c.cs.CoordinationV1().Leases("kube-system").Get(ctx, "kube-controller-manager", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	eventually(t, 30*time.Second, func() error {
		if h := holder(); h != "cm-a" {
			return fmt.Errorf("holder %q", h)
		}
		return nil
	})
	// The leader serves health and queue metrics over HTTPS (a
	// self-signed certificate), /metrics to the admin's client
	// certificate (system:masters).
	hc := adminHTTPSClient(t, c.rc)
	eventually(t, 45*time.Second, func() error {
		resp, err := hc.Get(fmt.Sprintf("https://127.0.0.1:%d/metrics", port))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if !strings.Contains(string(body), `workqueue_depth{name="deployment"}`) || !strings.Contains(string(body), `workqueue_work_duration_seconds_bucket{name="replicaset"`) {
			return fmt.Errorf("metrics lack the work queue series")
		}
		for _, p := range []string{"/healthz", "/readyz"} {
			r, err := hc.Get(fmt.Sprintf("https://127.0.0.1:%d%s", port, p))
			if err != nil {
				return err
			}
			r.Body.Close()
			if r.StatusCode != 200 {
				return fmt.Errorf("%s: %d", p, r.StatusCode)
			}
		}
		return nil
	})
	c.startManager("cm-b", func(cfg *Config) { cfg.LeaderElection = fastLease("cm-b") })
	c.kubectlOK("create", "deployment", "one", "--image=x", "--replicas=1")
	c.kubectlOK("rollout", "status", "deployment/one", "--timeout=60s")
	rsA, err := c.cs.AppsV1().ReplicaSets("default").List(ctx, metav1.ListOptions{ResourceVersion: "0", LabelSelector: "app=one"})
	if err != nil || len(rsA.Items) != 1 {
		t.Fatalf("replica sets: %v", err)
	}
	staleRV := rsA.Items[0].ResourceVersion
	if h := holder(); h != "cm-a" {
		t.Fatalf("holder changed to %q while cm-a was alive", h)
	}

	// Partition the leader: its renewals fail, so within the lease
	// duration the other instance takes over, and the old leader stops
	// its controllers once its renew deadline passes.
	cutAt := time.Now()
	a.cut.cut.Store(true)
	eventually(t, 30*time.Second, func() error {
		if h := holder(); h != "cm-b" {
			return fmt.Errorf("holder %q", h)
		}
		return nil
	})
	t.Logf("handover %v after the leader was cut off (lease duration %v)", time.Since(cutAt).Round(100*time.Millisecond), fastLease("").LeaseDuration)
	select {
	case err := <-a.done:
		if !errors.Is(err, leaderelect.ErrLeadershipLost) {
			t.Fatalf("the cut-off leader returned %v, want ErrLeadershipLost", err)
		}
		a.done <- err
	case <-time.After(30 * time.Second):
		t.Fatal("the cut-off leader kept running")
	}
	c.kubectlOK("scale", "deployment/one", "--replicas=3")
	c.kubectlOK("rollout", "status", "deployment/one", "--timeout=60s")

	// A write based on what the old leader last saw fails on its
	// resourceVersion instead of overwriting the new leader's work.
	rs, err := c.cs.AppsV1().ReplicaSets("default").List(ctx, metav1.ListOptions{ResourceVersion: "0", LabelSelector: "app=one"})
	if err != nil || len(rs.Items) != 1 {
		t.Fatalf("replica sets: %v", err)
	}
	stale := rs.Items[0].DeepCopy()
	stale.ResourceVersion = staleRV
	one := int32(1)
	stale.Spec.Replicas = &one
	if _, err := c.cs.AppsV1().ReplicaSets("default").Update(ctx, stale, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Fatalf("stale write: got %v, want a conflict", err)
	}
}

func TestKilledLeaderProcessIsReplacedWithinTheLeaseDuration(t *testing.T) {
	c := newCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c.startKubelets(ctx, 1, nil)
	holder := func() string {
		l, err := c.cs.CoordinationV1().Leases("kube-system").Get(ctx, "kube-controller-manager", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	child := c.startChild("cm-process")
	eventually(t, 30*time.Second, func() error {
		if h := holder(); h != "cm-process" {
			return fmt.Errorf("holder %q", h)
		}
		return nil
	})
	c.startManager("cm-b", func(cfg *Config) { cfg.LeaderElection = fastLease("cm-b") })
	c.kubectlOK("create", "deployment", "k", "--image=x", "--replicas=1")
	c.kubectlOK("rollout", "status", "deployment/k", "--timeout=60s")

	// SIGKILL: no release of the lease, no goodbye.
	killedAt := time.Now()
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		if h := holder(); h != "cm-b" {
			return fmt.Errorf("holder %q", h)
		}
		return nil
	})
	t.Logf("handover %v after SIGKILL of the leader (lease duration %v)", time.Since(killedAt).Round(100*time.Millisecond), fastLease("").LeaseDuration)
	c.kubectlOK("scale", "deployment/k", "--replicas=2")
	c.kubectlOK("rollout", "status", "deployment/k", "--timeout=60s")
}

func TestReplicaSetAdoptsOrphansAndReleasesRelabelledPods(t *testing.T) {
	c := newCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c.startKubelets(ctx, 1, nil)
	c.startManager("cm-0", nil)
	orphan := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "orphan", Namespace: "default", Labels: map[string]string{"app": "rs"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
	if _, err := c.cs.CoreV1().Pods("default").Create(ctx, orphan, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	two := int32(2)
	rs := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "rs", Namespace: "default"},
		Spec: appsv1.ReplicaSetSpec{Replicas: &two, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "rs"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "rs"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}}}
	created, err := c.cs.AppsV1().ReplicaSets("default").Create(ctx, rs, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	owned := func() (map[string]bool, error) {
		l, err := c.cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return nil, err
		}
		m := map[string]bool{}
		for _, p := range l.Items {
			if ref := metav1.GetControllerOf(&p); ref != nil && ref.UID == created.UID && p.DeletionTimestamp == nil {
				m[p.Name] = true
			}
		}
		return m, nil
	}
	eventually(t, 30*time.Second, func() error {
		m, err := owned()
		if err != nil {
			return err
		}
		if len(m) != 2 || !m["orphan"] {
			return fmt.Errorf("owned pods %v, want the adopted orphan and one new pod", m)
		}
		got, _ := c.cs.AppsV1().ReplicaSets("default").Get(ctx, "rs", metav1.GetOptions{})
		if got.Status.ReadyReplicas != 2 || got.Status.ObservedGeneration != got.Generation {
			return fmt.Errorf("status %+v", got.Status)
		}
		return nil
	})
	// Relabel the adopted pod: it is released (its ownerReference removed)
	// and replaced.
	p, _ := c.cs.CoreV1().Pods("default").Get(ctx, "orphan", metav1.GetOptions{})
	p.Labels = map[string]string{"app": "debug"}
	if _, err := c.cs.CoreV1().Pods("default").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		m, err := owned()
		if err != nil {
			return err
		}
		if len(m) != 2 || m["orphan"] {
			return fmt.Errorf("owned pods %v", m)
		}
		p, err := c.cs.CoreV1().Pods("default").Get(ctx, "orphan", metav1.GetOptions{})
		if err != nil || len(p.OwnerReferences) != 0 {
			return fmt.Errorf("released pod: err %v, owners %v", err, p.OwnerReferences)
		}
		return nil
	})
}

// A ring of blocking ownerReferences (a → b → c → a, as upstream's "should
// not be blocked by dependency circle") deleted in the foreground: each
// member would wait for the next forever unless the collector breaks the
// ring by unblocking one member's references.
func TestForegroundDeletionOfAnOwnershipCycle(t *testing.T) {
	c := newCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c.startManager("cm-0", func(cfg *Config) { cfg.Controllers = []string{"garbagecollector"} })
	cms := c.cs.CoreV1().ConfigMaps("default")
	names := []string{"ring-1", "ring-2", "ring-3"}
	uids := map[string]types.UID{}
	for _, n := range names {
		cm, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		uids[n] = cm.UID
	}
	// ring-1 is owned by ring-3, ring-2 by ring-1, ring-3 by ring-2.
	for i, n := range names {
		owner := names[(i+2)%3]
		patch := fmt.Sprintf(`{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":%q,"uid":%q,"controller":true,"blockOwnerDeletion":true}]}}`, owner, uids[owner])
		if _, err := cms.Patch(ctx, n, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	fg := metav1.DeletePropagationForeground
	if err := cms.Delete(ctx, "ring-1", metav1.DeleteOptions{PropagationPolicy: &fg, Preconditions: &metav1.Preconditions{UID: uidPtr(uids["ring-1"])}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() error {
		l, err := cms.List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		var left []string
		for _, cm := range l.Items {
			if strings.HasPrefix(cm.Name, "ring-") {
				left = append(left, fmt.Sprintf("%s (finalizers %v)", cm.Name, cm.Finalizers))
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("still there: %v", left)
		}
		return nil
	})
}

// adminHTTPSClient presents rc's client certificate and accepts any
// serving certificate, as a Prometheus scrape of a self-signed component
// port does.
func adminHTTPSClient(t *testing.T, rc *rest.Config) *http.Client {
	t.Helper()
	cert, err := tls.X509KeyPair(rc.CertData, rc.KeyData)
	if err != nil {
		t.Fatalf("admin client certificate: %v", err)
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{ //nolint:gosec // self-signed test port
		InsecureSkipVerify: true, Certificates: []tls.Certificate{cert}}}}
}
