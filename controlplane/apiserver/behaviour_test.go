package apiserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver"
	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

func ptr[T any](v T) *T { return &v }

func deployment(name string) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "img:1"}}},
			},
		},
	}
}

// shared starts one server for the behaviour tests of a test function.
func shared(t *testing.T) (*kubernetes.Clientset, *apiservertest.Server) {
	t.Helper()
	testutil.Privileged(t)
	s := apiservertest.Start(t, apiservertest.Options{Configure: func(c *apiserver.Config) { c.RepairInterval = 300 * time.Millisecond }})
	return kubernetes.NewForConfigOrDie(s.Config), s
}

func TestAPIBehaviour(t *testing.T) {
	cs, srv := shared(t)
	ctx := context.Background()
	pods := cs.CoreV1().Pods("default")

	t.Run("patch types merge as kube-apiserver does", func(t *testing.T) {
		p := pod("patched", map[string]string{"a": "1"})
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "d", Image: "busybox:1"})
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// Strategic merge: containers merge by name.
		got, err := pods.Patch(ctx, "patched", types.StrategicMergePatchType, []byte(`{"spec":{"containers":[{"name":"d","image":"busybox:2"}]}}`), metav1.PatchOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Spec.Containers) != 2 || got.Spec.Containers[1].Image != "busybox:2" || got.Spec.Containers[0].Image != "busybox:1.36" {
			t.Fatalf("strategic merge: %+v", got.Spec.Containers)
		}
		got, err = pods.Patch(ctx, "patched", types.MergePatchType, []byte(`{"metadata":{"labels":{"a":null,"b":"2"}}}`), metav1.PatchOptions{})
		if err != nil || got.Labels["b"] != "2" || got.Labels["a"] != "" {
			t.Fatalf("merge patch: %v %v", got.Labels, err)
		}
		got, err = pods.Patch(ctx, "patched", types.JSONPatchType, []byte(`[{"op":"add","path":"/metadata/annotations","value":{"x":"y"}}]`), metav1.PatchOptions{})
		if err != nil || got.Annotations["x"] != "y" {
			t.Fatalf("json patch: %v %v", got.Annotations, err)
		}
		_, err = pods.Patch(ctx, "patched", types.MergePatchType, []byte(`{"metadata":{"resourceVersion":"1","labels":{"c":"3"}}}`), metav1.PatchOptions{})
		if !apierrors.IsConflict(err) {
			t.Fatalf("patch with stale resourceVersion: want Conflict, got %v", err)
		}
		// Status patch (as the kubelet sends it) changes status only.
		got, err = pods.Patch(ctx, "patched", types.StrategicMergePatchType,
			[]byte(`{"status":{"phase":"Running","podIP":"10.0.0.5","conditions":[{"type":"Ready","status":"True"}]},"spec":{"activeDeadlineSeconds":5}}`),
			metav1.PatchOptions{}, "status")
		if err != nil || got.Status.Phase != corev1.PodRunning || got.Status.PodIP != "10.0.0.5" || got.Spec.ActiveDeadlineSeconds != nil {
			t.Fatalf("status patch: %+v %v", got.Status, err)
		}
	})

	t.Run("status and spec are written through their own endpoints", func(t *testing.T) {
		d, err := cs.AppsV1().Deployments("default").Create(ctx, deployment("gen"), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if d.Generation != 1 || *d.Spec.Replicas != 1 || d.Spec.Strategy.RollingUpdate.MaxSurge.String() != "25%" || *d.Spec.RevisionHistoryLimit != 10 {
			t.Fatalf("deployment defaults: gen %d %+v", d.Generation, d.Spec)
		}
		d.Status.Replicas = 7
		d.Labels = map[string]string{"x": "y"}
		d, err = cs.AppsV1().Deployments("default").Update(ctx, d, metav1.UpdateOptions{})
		if err != nil || d.Status.Replicas != 0 || d.Generation != 1 {
			t.Fatalf("main update must ignore status and not bump generation on labels: %+v gen %d %v", d.Status, d.Generation, err)
		}
		d.Spec.Replicas = ptr(int32(3))
		if d, err = cs.AppsV1().Deployments("default").Update(ctx, d, metav1.UpdateOptions{}); err != nil || d.Generation != 2 {
			t.Fatalf("spec change must bump generation: %d %v", d.Generation, err)
		}
		d.Status.Replicas = 3
		d.Status.ObservedGeneration = 2
		d.Spec.Replicas = ptr(int32(9))
		if d, err = cs.AppsV1().Deployments("default").UpdateStatus(ctx, d, metav1.UpdateOptions{}); err != nil || d.Status.Replicas != 3 || *d.Spec.Replicas != 3 {
			t.Fatalf("status update must change status only: %+v %v", d, err)
		}
		sc, err := cs.AppsV1().Deployments("default").GetScale(ctx, "gen", metav1.GetOptions{})
		if err != nil || sc.Spec.Replicas != 3 || sc.Status.Replicas != 3 || sc.Status.Selector != "app=gen" {
			t.Fatalf("get scale: %+v %v", sc, err)
		}
		sc.Spec.Replicas = 5
		if _, err := cs.AppsV1().Deployments("default").UpdateScale(ctx, "gen", sc, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if d, _ = cs.AppsV1().Deployments("default").Get(ctx, "gen", metav1.GetOptions{}); *d.Spec.Replicas != 5 {
			t.Fatalf("scale update: replicas %d", *d.Spec.Replicas)
		}
	})

	t.Run("finalizers and propagation mark instead of removing", func(t *testing.T) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "held", Finalizers: []string{"example.com/hold"}}}
		cms := cs.CoreV1().ConfigMaps("default")
		if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := cms.Delete(ctx, "held", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		got, err := cms.Get(ctx, "held", metav1.GetOptions{})
		if err != nil || got.DeletionTimestamp == nil {
			t.Fatalf("object with finalizers must be marked: %v %v", got, err)
		}
		got.Finalizers = nil
		if _, err := cms.Update(ctx, got, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cms.Get(ctx, "held", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("removing the last finalizer must delete: %v", err)
		}
		for policy, fin := range map[metav1.DeletionPropagation]string{metav1.DeletePropagationForeground: "foregroundDeletion", metav1.DeletePropagationOrphan: "orphan"} {
			name := "prop-" + string(policy)
			name = "prop-" + map[metav1.DeletionPropagation]string{metav1.DeletePropagationForeground: "fg", metav1.DeletePropagationOrphan: "orphan"}[policy]
			if _, err := cs.AppsV1().Deployments("default").Create(ctx, deployment(name), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := cs.AppsV1().Deployments("default").Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &policy}); err != nil {
				t.Fatal(err)
			}
			d, err := cs.AppsV1().Deployments("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil || d.DeletionTimestamp == nil || len(d.Finalizers) != 1 || d.Finalizers[0] != fin {
				t.Fatalf("%s: %+v %v", policy, d.ObjectMeta, err)
			}
		}
	})

	t.Run("pods on a node are deleted gracefully, binding assigns once", func(t *testing.T) {
		if _, err := pods.Create(ctx, pod("bound", nil), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: "bound"}, Target: corev1.ObjectReference{Kind: "Node", Name: "node-1"}}
		if err := pods.Bind(ctx, b, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := pods.Bind(ctx, b, metav1.CreateOptions{}); !apierrors.IsConflict(err) {
			t.Fatalf("second binding: want Conflict, got %v", err)
		}
		p, _ := pods.Get(ctx, "bound", metav1.GetOptions{})
		if p.Spec.NodeName != "node-1" {
			t.Fatalf("nodeName = %q", p.Spec.NodeName)
		}
		if err := pods.Delete(ctx, "bound", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		p, err := pods.Get(ctx, "bound", metav1.GetOptions{})
		if err != nil || p.DeletionTimestamp == nil || *p.DeletionGracePeriodSeconds != 30 {
			t.Fatalf("graceful deletion: %+v %v", p, err)
		}
		if err := pods.Delete(ctx, "bound", metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}); err != nil {
			t.Fatal(err)
		}
		if _, err := pods.Get(ctx, "bound", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("grace 0 must remove: %v", err)
		}
		// Eviction deletes through pods/eviction (protobuf body from client-go).
		if _, err := pods.Create(ctx, pod("evicted", nil), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := pods.EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: "evicted"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := pods.Get(ctx, "evicted", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("evicted pod: %v", err)
		}
	})

	t.Run("namespace deletion waits for the finalize subresource", func(t *testing.T) {
		nss := cs.CoreV1().Namespaces()
		if _, err := nss.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "tmp"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := nss.Delete(ctx, "tmp", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		ns, err := nss.Get(ctx, "tmp", metav1.GetOptions{})
		if err != nil || ns.Status.Phase != corev1.NamespaceTerminating {
			t.Fatalf("namespace must be Terminating: %+v %v", ns, err)
		}
		ns.Spec.Finalizers = nil
		if _, err := nss.Finalize(ctx, ns, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := nss.Get(ctx, "tmp", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("finalized namespace must be gone: %v", err)
		}
	})

	t.Run("services get unique cluster IPs and node ports, released on delete", func(t *testing.T) {
		svcs := cs.CoreV1().Services("default")
		mk := func(name, ip string, typ corev1.ServiceType, nodePort int32) (*corev1.Service, error) {
			return svcs.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: corev1.ServiceSpec{Type: typ, ClusterIP: ip, Ports: []corev1.ServicePort{{Port: 80, NodePort: nodePort}}}}, metav1.CreateOptions{})
		}
		seen := map[string]bool{}
		for i := 0; i < 20; i++ {
			s, err := mk(fmt.Sprintf("s%d", i), "", corev1.ServiceTypeNodePort, 0)
			if err != nil {
				t.Fatal(err)
			}
			if seen[s.Spec.ClusterIP] || seen[strconv.Itoa(int(s.Spec.Ports[0].NodePort))] {
				t.Fatalf("duplicate allocation: %s %d", s.Spec.ClusterIP, s.Spec.Ports[0].NodePort)
			}
			seen[s.Spec.ClusterIP], seen[strconv.Itoa(int(s.Spec.Ports[0].NodePort))] = true, true
			if s.Spec.Ports[0].TargetPort.IntValue() != 80 || s.Spec.SessionAffinity != corev1.ServiceAffinityNone {
				t.Fatalf("service defaults: %+v", s.Spec)
			}
		}
		if _, err := mk("fixed", "10.96.0.200", corev1.ServiceTypeNodePort, 30100); err != nil {
			t.Fatal(err)
		}
		if _, err := mk("clash-ip", "10.96.0.200", corev1.ServiceTypeClusterIP, 0); !apierrors.IsInvalid(err) {
			t.Fatalf("taken IP: want Invalid, got %v", err)
		}
		if _, err := mk("clash-port", "", corev1.ServiceTypeNodePort, 30100); !apierrors.IsInvalid(err) {
			t.Fatalf("taken node port: want Invalid, got %v", err)
		}
		if _, err := mk("outside", "192.168.0.1", corev1.ServiceTypeClusterIP, 0); !apierrors.IsInvalid(err) {
			t.Fatalf("IP outside the range: want Invalid, got %v", err)
		}
		if err := svcs.Delete(ctx, "fixed", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := mk("again", "10.96.0.200", corev1.ServiceTypeNodePort, 30100); err != nil {
			t.Fatalf("released IP and port must be reusable: %v", err)
		}
		// NodePort → ClusterIP releases the port; → ExternalName the IP.
		again, _ := svcs.Get(ctx, "again", metav1.GetOptions{})
		again.Spec.Type = corev1.ServiceTypeClusterIP
		again.Spec.Ports[0].NodePort = 0
		if again, err := svcs.Update(ctx, again, metav1.UpdateOptions{}); err != nil || again.Spec.Ports[0].NodePort != 0 {
			t.Fatalf("to ClusterIP: %+v %v", again, err)
		}
		if _, err := mk("port-reuse", "", corev1.ServiceTypeNodePort, 30100); err != nil {
			t.Fatalf("node port released by a type change must be reusable: %v", err)
		}
		again, _ = svcs.Get(ctx, "again", metav1.GetOptions{})
		again.Spec.Type = corev1.ServiceTypeExternalName
		again.Spec.ExternalName = "example.com"
		again.Spec.ClusterIP = ""
		if again, err := svcs.Update(ctx, again, metav1.UpdateOptions{}); err != nil || again.Spec.ClusterIP != "" {
			t.Fatalf("to ExternalName: %+v %v", again, err)
		}
		if _, err := mk("ip-reuse", "10.96.0.200", corev1.ServiceTypeClusterIP, 0); err != nil {
			t.Fatalf("IP released by a type change must be reusable: %v", err)
		}
		// NodePort → ExternalName as a client does it (upstream's e2e jig):
		// only type and externalName change; the cluster IP, node ports and
		// externalTrafficPolicy the old type needed are wiped and released.
		np, err := mk("np-to-en", "", corev1.ServiceTypeNodePort, 30111)
		if err != nil {
			t.Fatal(err)
		}
		np.Spec.Type = corev1.ServiceTypeExternalName
		np.Spec.ExternalName = "example.com"
		en, err := svcs.Update(ctx, np, metav1.UpdateOptions{})
		if err != nil || en.Spec.ClusterIP != "" || len(en.Spec.ClusterIPs) != 0 || en.Spec.Ports[0].NodePort != 0 || en.Spec.ExternalTrafficPolicy != "" {
			t.Fatalf("NodePort to ExternalName: %v %+v", err, en)
		}
		if _, err := mk("np-reuse", "", corev1.ServiceTypeNodePort, 30111); err != nil {
			t.Fatalf("node port released by NodePort to ExternalName must be reusable: %v", err)
		}
		// A node port the client sets itself on an ExternalName Service is
		// its own, and refused.
		en, _ = svcs.Get(ctx, "np-to-en", metav1.GetOptions{})
		en.Spec.Ports[0].NodePort = 30112
		if _, err := svcs.Update(ctx, en, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
			t.Fatalf("node port on an ExternalName Service: %v, want Invalid", err)
		}
	})

	t.Run("a Local LoadBalancer gets a health check node port, kept on update and released", func(t *testing.T) {
		svcs := cs.CoreV1().Services("default")
		lb := func(name string, etp corev1.ServiceExternalTrafficPolicy, hc int32) (*corev1.Service, error) {
			return svcs.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: etp, HealthCheckNodePort: hc,
					Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{})
		}
		local, err := lb("lb-local", corev1.ServiceExternalTrafficPolicyLocal, 0)
		if err != nil {
			t.Fatal(err)
		}
		hc := local.Spec.HealthCheckNodePort
		if hc < 30000 || hc > 32767 || hc == local.Spec.Ports[0].NodePort {
			t.Fatalf("healthCheckNodePort %d (node port %d): want one of its own from the node port range", hc, local.Spec.Ports[0].NodePort)
		}
		if cl, err := lb("lb-cluster", corev1.ServiceExternalTrafficPolicyCluster, 0); err != nil || cl.Spec.HealthCheckNodePort != 0 {
			t.Fatalf("Cluster policy: %v, healthCheckNodePort %d, want none", err, cl.Spec.HealthCheckNodePort)
		}
		if _, err := lb("lb-clash", corev1.ServiceExternalTrafficPolicyLocal, hc); !apierrors.IsInvalid(err) {
			t.Fatalf("a taken healthCheckNodePort: %v, want Invalid", err)
		}
		// An update that leaves it out (kubectl replace) keeps it.
		local.Spec.HealthCheckNodePort = 0
		if local, err = svcs.Update(ctx, local, metav1.UpdateOptions{}); err != nil || local.Spec.HealthCheckNodePort != hc {
			t.Fatalf("update without it: %v, healthCheckNodePort %d, want %d", err, local.Spec.HealthCheckNodePort, hc)
		}
		// Local → Cluster drops and releases it.
		local.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
		if local, err = svcs.Update(ctx, local, metav1.UpdateOptions{}); err != nil || local.Spec.HealthCheckNodePort != 0 {
			t.Fatalf("to Cluster: %v, healthCheckNodePort %d, want 0", err, local.Spec.HealthCheckNodePort)
		}
		if s, err := lb("lb-reuse", corev1.ServiceExternalTrafficPolicyLocal, hc); err != nil || s.Spec.HealthCheckNodePort != hc {
			t.Fatalf("released healthCheckNodePort %d must be reusable: %v", hc, err)
		}
		if err := svcs.Delete(ctx, "lb-reuse", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := lb("lb-after-delete", corev1.ServiceExternalTrafficPolicyLocal, hc); err != nil {
			t.Fatalf("healthCheckNodePort released by delete must be reusable: %v", err)
		}
	})

	t.Run("repair loop reclaims leaks and restores missing allocations", func(t *testing.T) {
		st := srv.Store()
		if _, err := st.Create(ctx, "/registry/ranges/serviceips/10.96.0.77", []byte("default/ghost")); err != nil {
			t.Fatal(err)
		}
		s, err := cs.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "victim"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		kv, _, err := st.Get(ctx, "/registry/ranges/serviceips/"+s.Spec.ClusterIP)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := st.OptimisticDelete(ctx, kv.Key, kv.ModRevision); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			_, _, leak := st.Get(ctx, "/registry/ranges/serviceips/10.96.0.77")
			_, _, missing := st.Get(ctx, "/registry/ranges/serviceips/"+s.Spec.ClusterIP)
			if leak != nil && missing == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("repair did not converge: leak still held=%v, missing restored=%v", leak == nil, missing == nil)
			}
			time.Sleep(100 * time.Millisecond) // poll interval of the repair check (bounded by the deadline)
		}
	})

	t.Run("field selectors, limit and continue", func(t *testing.T) {
		ns := "paging"
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 25; i++ {
			p := pod(fmt.Sprintf("p%02d", i), map[string]string{"even": strconv.FormatBool(i%2 == 0)})
			if i < 5 {
				p.Spec.NodeName = "n1"
			}
			if _, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		l, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=n1"})
		if err != nil || len(l.Items) != 5 {
			t.Fatalf("spec.nodeName: %d %v", len(l.Items), err)
		}
		l, err = cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{FieldSelector: "status.phase!=Running,metadata.name!=p00", LabelSelector: "even in (true)"})
		if err != nil || len(l.Items) != 12 {
			t.Fatalf("status.phase!= and labels: %d %v", len(l.Items), err)
		}
		seen := map[string]int{}
		opts := metav1.ListOptions{Limit: 10, LabelSelector: "even"}
		pages := 0
		for {
			l, err := cs.CoreV1().Pods(ns).List(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			pages++
			for _, p := range l.Items {
				seen[p.Name]++
			}
			if l.Continue == "" {
				break
			}
			opts.Continue = l.Continue
		}
		if len(seen) != 25 || pages != 3 {
			t.Fatalf("paging: %d pods over %d pages", len(seen), pages)
		}
		for k, v := range seen {
			if v != 1 {
				t.Fatalf("%s listed %d times", k, v)
			}
		}
		if err := cs.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "even=true"}); err != nil {
			t.Fatal(err)
		}
		// Pods on a node (p00, p02, p04) are only marked: graceful deletion.
		l, _ = cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		live, marked := 0, 0
		for _, p := range l.Items {
			if p.DeletionTimestamp != nil {
				marked++
			} else {
				live++
			}
		}
		if live != 12 || marked != 3 {
			t.Fatalf("deletecollection left %d live and %d marked pods, want 12 and 3", live, marked)
		}
	})

	t.Run("generateName, dryRun and leases", func(t *testing.T) {
		p := pod("", nil)
		p.GenerateName = "gen-"
		got, err := pods.Create(ctx, p, metav1.CreateOptions{})
		if err != nil || len(got.Name) != len("gen-")+5 {
			t.Fatalf("generateName: %q %v", got.Name, err)
		}
		got.Labels = map[string]string{"dry": "run"}
		if _, err := pods.Update(ctx, got, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Fatal(err)
		}
		if now, _ := pods.Get(ctx, got.Name, metav1.GetOptions{}); now.Labels["dry"] != "" || now.ResourceVersion != got.ResourceVersion {
			t.Fatal("dryRun update was written")
		}
		leases := cs.CoordinationV1().Leases("kube-node-lease")
		// PUT of a missing Lease creates it (as kube-apiserver); a missing
		// ConfigMap is NotFound.
		put, err := leases.Update(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "by-put"}}, metav1.UpdateOptions{})
		if err != nil || put.UID == "" {
			t.Fatalf("create-on-update: %+v %v", put, err)
		}
		if _, err := cs.CoreV1().ConfigMaps("default").Update(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "nope"}}, metav1.UpdateOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("update of a missing configmap: %v", err)
		}
		l, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "node-1"},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr("node-1"), LeaseDurationSeconds: ptr(int32(40))}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
			if l, err = leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("watch resumes, bookmarks, and 410 for a compacted resourceVersion", func(t *testing.T) {
		cms := cs.CoreV1().ConfigMaps("default")
		first, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "w-0"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for i := 1; i <= 3; i++ {
			if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("w-%d", i)}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		w, err := cms.Watch(ctx, metav1.ListOptions{ResourceVersion: first.ResourceVersion, AllowWatchBookmarks: true})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		bookmark := false
		timeout := time.After(15 * time.Second)
		for len(names) < 3 || !bookmark {
			select {
			case e := <-w.ResultChan():
				switch e.Type {
				case watch.Added:
					names = append(names, e.Object.(*corev1.ConfigMap).Name)
				case watch.Bookmark:
					if e.Object.(*corev1.ConfigMap).ResourceVersion == "" {
						t.Fatal("bookmark without resourceVersion")
					}
					bookmark = true
				}
			case <-timeout:
				t.Fatalf("resumed watch saw %v, bookmark %v", names, bookmark)
			}
		}
		w.Stop()
		if fmt.Sprint(names) != "[w-1 w-2 w-3]" {
			t.Fatalf("resume after %s: %v", first.ResourceVersion, names)
		}
		rev, _ := srv.Store().Revision(ctx)
		if err := srv.Store().Compact(ctx, rev); err != nil {
			t.Fatal(err)
		}
		// Restart so the cache window starts after the compaction.
		srv.Stop()
		srv = apiservertest.Start(t, apiservertest.Options{DataDir: srv.DataDir, Addr: srv.Addr().String()})
		w, err = cms.Watch(ctx, metav1.ListOptions{ResourceVersion: first.ResourceVersion})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		select {
		case e := <-w.ResultChan():
			st, ok := e.Object.(*metav1.Status)
			if e.Type != watch.Error || !ok || st.Code != 410 || st.Reason != metav1.StatusReasonExpired {
				b, _ := json.Marshal(e.Object)
				t.Fatalf("want ERROR 410 Expired, got %s %s", e.Type, b)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no event for a compacted resourceVersion")
		}
	})
}
