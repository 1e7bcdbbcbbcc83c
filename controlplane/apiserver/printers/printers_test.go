package printers

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/utils/ptr"

	"sigs.k8s.io/randfill"

	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

var now = time.Date(2026, 1, 2, 12, 0, 0, 0, time.UTC)

func ago(d time.Duration) metav1.Time { return metav1.NewTime(now.Add(-d)) }

func om(name string, d time.Duration) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: "default", CreationTimestamp: ago(d), ResourceVersion: "42", Labels: map[string]string{"app": "web"}}
}

// render prints a table the way kubectl does: upper-case headers, columns
// of priority 0 unless wide.
func render(t *metav1.Table, wide bool) string {
	var buf bytes.Buffer
	w := tabwriter.NewWriter(&buf, 0, 8, 3, ' ', 0)
	var show []int
	var head []string
	for i, c := range t.ColumnDefinitions {
		if c.Priority == 0 || wide {
			show = append(show, i)
			head = append(head, strings.ToUpper(c.Name))
		}
	}
	fmt.Fprintln(w, strings.Join(head, "\t"))
	for _, r := range t.Rows {
		var cells []string
		for _, i := range show {
			cells = append(cells, fmt.Sprint(r.Cells[i]))
		}
		fmt.Fprintln(w, strings.Join(cells, "\t"))
	}
	w.Flush()
	return buf.String()
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs from golden:\n--- got\n%s--- want\n%s", name, got, want)
	}
}

func running(name string, restarts int32) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: name, Ready: true, RestartCount: restarts, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: ago(time.Hour)}}}
}

func fixtures() map[string]runtime.Object {
	twoContainers := corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "nginx:1.27"}, {Name: "side", Image: "busybox"}}}
	return map[string]runtime.Object{
		"apiservices": &apiregistrationv1.APIServiceList{Items: []apiregistrationv1.APIService{
			{ObjectMeta: om("v1.apps", 3*time.Hour), Spec: apiregistrationv1.APIServiceSpec{Group: "apps", Version: "v1"},
				Status: apiregistrationv1.APIServiceStatus{Conditions: []apiregistrationv1.APIServiceCondition{{Type: apiregistrationv1.Available, Status: apiregistrationv1.ConditionTrue, Reason: "Local"}}}},
			{ObjectMeta: om("v1beta1.metrics.k8s.io", 5*time.Minute), Spec: apiregistrationv1.APIServiceSpec{Group: "metrics.k8s.io", Version: "v1beta1",
				Service: &apiregistrationv1.ServiceReference{Namespace: "kube-system", Name: "metrics-server"}},
				Status: apiregistrationv1.APIServiceStatus{Conditions: []apiregistrationv1.APIServiceCondition{{Type: apiregistrationv1.Available, Status: apiregistrationv1.ConditionFalse, Reason: "MissingEndpoints"}}}},
			{ObjectMeta: om("v1alpha1.wardle.example.com", 5*time.Second), Spec: apiregistrationv1.APIServiceSpec{Group: "wardle.example.com", Version: "v1alpha1",
				Service: &apiregistrationv1.ServiceReference{Namespace: "sample", Name: "api"}}},
		}},
		"pods": &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "100"}, Items: []corev1.Pod{
			{ObjectMeta: om("web-running", 3*time.Hour), Spec: corev1.PodSpec{NodeName: "node-1", Containers: twoContainers.Containers,
				ReadinessGates: []corev1.PodReadinessGate{{ConditionType: "example.com/lb"}}},
				Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.0.5", PodIPs: []corev1.PodIP{{IP: "10.244.0.5"}},
					Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}, {Type: "example.com/lb", Status: corev1.ConditionTrue}},
					ContainerStatuses: []corev1.ContainerStatus{running("web", 0), running("side", 0)}}},
			{ObjectMeta: om("web-pending", 5*time.Second), Spec: twoContainers, Status: corev1.PodStatus{Phase: corev1.PodPending}},
			{ObjectMeta: om("web-creating", 40*time.Second), Spec: corev1.PodSpec{NodeName: "node-2", Containers: twoContainers.Containers},
				Status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{
					{Name: "web", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}},
					{Name: "side", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}}}},
			{ObjectMeta: om("web-crashing", 26*time.Hour), Spec: corev1.PodSpec{NodeName: "node-1", Containers: twoContainers.Containers[:1]},
				Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "10.244.0.9"}}, ContainerStatuses: []corev1.ContainerStatus{
					{Name: "web", RestartCount: 7, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
						LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, FinishedAt: ago(90 * time.Second)}}}}}},
			{ObjectMeta: om("job-done", 2*time.Hour), Spec: corev1.PodSpec{NodeName: "node-1", Containers: twoContainers.Containers[:1]},
				Status: corev1.PodStatus{Phase: corev1.PodSucceeded, ContainerStatuses: []corev1.ContainerStatus{
					{Name: "web", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed"}}}}}},
			func() corev1.Pod {
				p := corev1.Pod{ObjectMeta: om("web-terminating", 10*time.Minute), Spec: corev1.PodSpec{NodeName: "node-1", Containers: twoContainers.Containers[:1]},
					Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{running("web", 0)}}}
				p.DeletionTimestamp = ptr.To(ago(time.Second))
				return p
			}(),
			{ObjectMeta: om("web-init", time.Minute), Spec: corev1.PodSpec{InitContainers: []corev1.Container{{Name: "init"}}, Containers: twoContainers.Containers[:1]},
				Status: corev1.PodStatus{Phase: corev1.PodPending, InitContainerStatuses: []corev1.ContainerStatus{
					{Name: "init", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}},
		}},
		"services": &corev1.ServiceList{Items: []corev1.Service{
			{ObjectMeta: om("kubernetes", 48*time.Hour), Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.1", ClusterIPs: []string{"10.96.0.1"},
				Ports: []corev1.ServicePort{{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP}}}},
			{ObjectMeta: om("web", time.Hour), Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, ClusterIPs: []string{"10.96.12.7"},
				Selector: map[string]string{"app": "web", "tier": "front"},
				Ports:    []corev1.ServicePort{{Port: 80, NodePort: 30080, Protocol: corev1.ProtocolTCP}, {Port: 53, Protocol: corev1.ProtocolUDP}}}},
			{ObjectMeta: om("lb", time.Hour), Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ClusterIPs: []string{"10.96.3.3"},
				Ports: []corev1.ServicePort{{Port: 80, NodePort: 31000, Protocol: corev1.ProtocolTCP}}},
				Status: corev1.ServiceStatus{LoadBalancer: corev1.LoadBalancerStatus{Ingress: []corev1.LoadBalancerIngress{{IP: "192.0.2.10"}}}}},
			{ObjectMeta: om("lb-pending", time.Hour), Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ClusterIPs: []string{"10.96.3.4"}}},
			{ObjectMeta: om("headless", time.Hour), Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "None", ClusterIPs: []string{"None"}}},
			{ObjectMeta: om("ext", time.Hour), Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "example.com"}},
		}},
		"deployments": &appsv1.DeploymentList{Items: []appsv1.Deployment{
			{ObjectMeta: om("web", 2*time.Hour), Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](3),
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}, Template: corev1.PodTemplateSpec{Spec: twoContainers}},
				Status: appsv1.DeploymentStatus{ReadyReplicas: 2, UpdatedReplicas: 3, AvailableReplicas: 2}},
		}},
		"replicasets": &appsv1.ReplicaSetList{Items: []appsv1.ReplicaSet{
			{ObjectMeta: om("web-5d4f8b", 2*time.Hour), Spec: appsv1.ReplicaSetSpec{Replicas: ptr.To[int32](3),
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web", "pod-template-hash": "5d4f8b"}}, Template: corev1.PodTemplateSpec{Spec: twoContainers}},
				Status: appsv1.ReplicaSetStatus{Replicas: 3, ReadyReplicas: 1}},
		}},
		"daemonsets": &appsv1.DaemonSetList{Items: []appsv1.DaemonSet{
			{ObjectMeta: om("proxy", 24*time.Hour), Spec: appsv1.DaemonSetSpec{
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "proxy"}},
				Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{NodeSelector: map[string]string{"kubernetes.io/os": "linux"}, Containers: twoContainers.Containers[:1]}}},
				Status: appsv1.DaemonSetStatus{DesiredNumberScheduled: 3, CurrentNumberScheduled: 3, NumberReady: 2, UpdatedNumberScheduled: 3, NumberAvailable: 2}},
		}},
		"nodes": &corev1.NodeList{Items: []corev1.Node{
			{ObjectMeta: metav1.ObjectMeta{Name: "node-1", CreationTimestamp: ago(72 * time.Hour), Labels: map[string]string{"node-role.kubernetes.io/control-plane": ""}},
				Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
					Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.1.10"}, {Type: corev1.NodeHostName, Address: "node-1"}},
					NodeInfo:  corev1.NodeSystemInfo{KubeletVersion: "v1.32.3-waggle", OSImage: "Debian GNU/Linux 12 (bookworm)", KernelVersion: "6.1.0-18-amd64", ContainerRuntimeVersion: "containerd://1.6.20"}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "node-2", CreationTimestamp: ago(3 * time.Minute)}, Spec: corev1.NodeSpec{Unschedulable: true},
				Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse}}}},
		}},
		"namespaces": &corev1.NamespaceList{Items: []corev1.Namespace{
			{ObjectMeta: metav1.ObjectMeta{Name: "default", CreationTimestamp: ago(72 * time.Hour)}, Status: corev1.NamespaceStatus{Phase: corev1.NamespaceActive}},
			{ObjectMeta: metav1.ObjectMeta{Name: "old", CreationTimestamp: ago(time.Hour)}, Status: corev1.NamespaceStatus{Phase: corev1.NamespaceTerminating}},
		}},
		"endpoints": &corev1.EndpointsList{Items: []corev1.Endpoints{
			{ObjectMeta: om("web", time.Hour), Subsets: []corev1.EndpointSubset{{
				Addresses: []corev1.EndpointAddress{{IP: "10.244.0.5"}, {IP: "10.244.0.6"}, {IP: "10.244.1.2"}, {IP: "10.244.1.3"}},
				Ports:     []corev1.EndpointPort{{Port: 8080}}}}},
			{ObjectMeta: om("empty", time.Hour)},
		}},
		"endpointslices": &discoveryv1.EndpointSliceList{Items: []discoveryv1.EndpointSlice{
			{ObjectMeta: om("web-abcde", time.Hour), AddressType: discoveryv1.AddressTypeIPv4,
				Ports:     []discoveryv1.EndpointPort{{Port: ptr.To[int32](8080)}},
				Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.0.5"}}, {Addresses: []string{"10.244.0.6"}}}},
			{ObjectMeta: om("empty-xyz", time.Hour), AddressType: discoveryv1.AddressTypeIPv6},
		}},
		"events": &corev1.EventList{Items: []corev1.Event{
			{ObjectMeta: om("web-running.17a", time.Hour), InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: "web-running", FieldPath: "spec.containers{web}"},
				Reason: "Pulled", Message: "Container image \"nginx:1.27\" already present on machine ", Type: corev1.EventTypeNormal,
				Source: corev1.EventSource{Component: "kubelet", Host: "node-1"}, FirstTimestamp: ago(time.Hour), LastTimestamp: ago(2 * time.Minute), Count: 4},
			{ObjectMeta: om("node-2.17b", time.Hour), InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: "node-2"}, Reason: "NodeNotReady",
				Message: "Node node-2 status is now: NodeNotReady", Type: corev1.EventTypeWarning, ReportingController: "node-controller",
				EventTime: metav1.NewMicroTime(now.Add(-30 * time.Second))},
		}},
		"configmaps": &corev1.ConfigMapList{Items: []corev1.ConfigMap{
			{ObjectMeta: om("settings", time.Hour), Data: map[string]string{"a": "1", "b": "2"}, BinaryData: map[string][]byte{"c": {1}}},
		}},
		"secrets": &corev1.SecretList{Items: []corev1.Secret{
			{ObjectMeta: om("token", time.Hour), Type: corev1.SecretTypeOpaque, Data: map[string][]byte{"password": []byte("x")}},
			{ObjectMeta: om("tls", time.Hour), Type: corev1.SecretTypeTLS, Data: map[string][]byte{"tls.crt": nil, "tls.key": nil}},
		}},
		"serviceaccounts": &corev1.ServiceAccountList{Items: []corev1.ServiceAccount{
			{ObjectMeta: om("default", 72*time.Hour)},
		}},
		"componentstatuses": &corev1.ComponentStatusList{Items: []corev1.ComponentStatus{
			{ObjectMeta: metav1.ObjectMeta{Name: "etcd-0"}, Conditions: []corev1.ComponentCondition{{Type: corev1.ComponentHealthy, Status: corev1.ConditionTrue, Message: "ok"}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "scheduler"}, Conditions: []corev1.ComponentCondition{{Type: corev1.ComponentHealthy, Status: corev1.ConditionFalse,
				Error: "Get \"https://127.0.0.1:10259/healthz\": connection refused"}}},
		}},
		"bindings": &corev1.Binding{ObjectMeta: om("web", time.Minute), Target: corev1.ObjectReference{Kind: "Node", Name: "node-1"}},
		"leases": &coordinationv1.LeaseList{Items: []coordinationv1.Lease{
			{ObjectMeta: om("node-1", time.Hour), Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("node-1")}},
			{ObjectMeta: om("unheld", time.Hour)},
		}},
	}
}

func TestGoldenTables(t *testing.T) {
	for name, list := range fixtures() {
		t.Run(name, func(t *testing.T) {
			tbl, err := Table(list, Options{Now: now})
			if err != nil {
				t.Fatal(err)
			}
			golden(t, name, render(tbl, false)+"--- wide\n"+render(tbl, true))
		})
	}
}

func TestEveryCatalogResourceHasAPrinter(t *testing.T) {
	fx := fixtures()
	for _, r := range catalog.All() {
		if r.Virtual {
			continue // never listed, never printed
		}
		_, own := registry[fmtType(r.New())]
		_, up := upstreamPrinter(r.New())
		if !own && !up && !nameAndAgeOnly[r.Resource] {
			t.Errorf("%s has no printer", r.Resource)
		}
		if _, ok := fx[r.Resource]; own && !ok {
			t.Errorf("%s has no golden fixture", r.Resource)
		}
		if !slices.Contains(r.Verbs, "list") {
			continue // never listed (bindings): no empty list to print
		}
		// An empty list still carries its resource's columns.
		tbl, err := Table(r.NewList(), Options{Now: now})
		if err != nil {
			t.Fatal(err)
		}
		if len(tbl.ColumnDefinitions) < 2 || tbl.ColumnDefinitions[0].Name == "Created At" || len(tbl.Rows) != 0 {
			t.Errorf("%s empty list: %+v", r.Resource, tbl)
		}
		for _, c := range tbl.ColumnDefinitions {
			if c.Description == "" && own {
				t.Errorf("%s column %s has no description", r.Resource, c.Name)
			}
		}
	}
}

func TestPodStatusLikeKubectl(t *testing.T) {
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	waiting := func(r string) corev1.ContainerState {
		return corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: r}}
	}
	terminated := func(reason string, code, signal int32) corev1.ContainerState {
		return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: reason, ExitCode: code, Signal: signal}}
	}
	always := corev1.ContainerRestartPolicyAlways
	cases := []struct {
		name       string
		pod        corev1.Pod
		wantReady  string
		wantStatus string
	}{
		{"no status is the phase", corev1.Pod{Spec: corev1.PodSpec{Containers: make([]corev1.Container, 1)}, Status: corev1.PodStatus{Phase: corev1.PodPending}}, "0/1", "Pending"},
		{"container creating", corev1.Pod{Spec: corev1.PodSpec{Containers: make([]corev1.Container, 1)}, Status: corev1.PodStatus{Phase: corev1.PodPending,
			ContainerStatuses: []corev1.ContainerStatus{{State: waiting("ContainerCreating")}}}}, "0/1", "ContainerCreating"},
		{"running ready", corev1.Pod{Spec: corev1.PodSpec{Containers: make([]corev1.Container, 1)}, Status: corev1.PodStatus{Phase: corev1.PodRunning,
			ContainerStatuses: []corev1.ContainerStatus{{Ready: true, State: running}}}}, "1/1", "Running"},
		{"running not ready", corev1.Pod{Spec: corev1.PodSpec{Containers: make([]corev1.Container, 1)}, Status: corev1.PodStatus{Phase: corev1.PodRunning,
			ContainerStatuses: []corev1.ContainerStatus{{State: running}}}}, "0/1", "Running"},
		{"crash loop", corev1.Pod{Spec: corev1.PodSpec{Containers: make([]corev1.Container, 1)}, Status: corev1.PodStatus{Phase: corev1.PodRunning,
			ContainerStatuses: []corev1.ContainerStatus{{State: waiting("CrashLoopBackOff")}}}}, "0/1", "CrashLoopBackOff"},
		{"completed", corev1.Pod{Spec: corev1.PodSpec{Containers: make([]corev1.Container, 1)}, Status: corev1.PodStatus{Phase: corev1.PodSucceeded,
			ContainerStatuses: []corev1.ContainerStatus{{State: terminated("Completed", 0, 0)}}}}, "0/1", "Completed"},
		{"error", corev1.Pod{Spec: corev1.PodSpec{Containers: make([]corev1.Container, 1)}, Status: corev1.PodStatus{Phase: corev1.PodFailed,
			ContainerStatuses: []corev1.ContainerStatus{{State: terminated("Error", 1, 0)}}}}, "0/1", "Error"},
		{"exit code without reason", corev1.Pod{Spec: corev1.PodSpec{Containers: make([]corev1.Container, 1)}, Status: corev1.PodStatus{Phase: corev1.PodFailed,
			ContainerStatuses: []corev1.ContainerStatus{{State: terminated("", 3, 0)}}}}, "0/1", "ExitCode:3"},
		{"signal without reason", corev1.Pod{Spec: corev1.PodSpec{Containers: make([]corev1.Container, 1)}, Status: corev1.PodStatus{Phase: corev1.PodFailed,
			ContainerStatuses: []corev1.ContainerStatus{{State: terminated("", 137, 9)}}}}, "0/1", "Signal:9"},
		{"one completed one running, ready", corev1.Pod{Spec: corev1.PodSpec{Containers: make([]corev1.Container, 2)}, Status: corev1.PodStatus{Phase: corev1.PodRunning,
			Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
			ContainerStatuses: []corev1.ContainerStatus{{State: terminated("Completed", 0, 0)}, {Ready: true, State: running}}}}, "1/2", "Running"},
		{"one completed one running, not ready", corev1.Pod{Spec: corev1.PodSpec{Containers: make([]corev1.Container, 2)}, Status: corev1.PodStatus{Phase: corev1.PodRunning,
			ContainerStatuses: []corev1.ContainerStatus{{State: terminated("Completed", 0, 0)}, {Ready: true, State: running}}}}, "1/2", "NotReady"},
		{"init running", corev1.Pod{Spec: corev1.PodSpec{InitContainers: make([]corev1.Container, 2), Containers: make([]corev1.Container, 1)}, Status: corev1.PodStatus{Phase: corev1.PodPending,
			InitContainerStatuses: []corev1.ContainerStatus{{State: terminated("Completed", 0, 0)}, {State: running}}}}, "0/1", "Init:1/2"},
		{"init failed", corev1.Pod{Spec: corev1.PodSpec{InitContainers: make([]corev1.Container, 1), Containers: make([]corev1.Container, 1)}, Status: corev1.PodStatus{Phase: corev1.PodPending,
			InitContainerStatuses: []corev1.ContainerStatus{{State: terminated("Error", 1, 0)}}}}, "0/1", "Init:Error"},
		{"init crash loop", corev1.Pod{Spec: corev1.PodSpec{InitContainers: make([]corev1.Container, 1), Containers: make([]corev1.Container, 1)}, Status: corev1.PodStatus{Phase: corev1.PodPending,
			InitContainerStatuses: []corev1.ContainerStatus{{State: waiting("CrashLoopBackOff")}}}}, "0/1", "Init:CrashLoopBackOff"},
		{"sidecar counts as a container", corev1.Pod{Spec: corev1.PodSpec{InitContainers: []corev1.Container{{Name: "sc", RestartPolicy: &always}}, Containers: []corev1.Container{{Name: "c"}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodInitialized, Status: corev1.ConditionTrue}},
				InitContainerStatuses: []corev1.ContainerStatus{{Name: "sc", Ready: true, Started: ptr.To(true), State: running}},
				ContainerStatuses:     []corev1.ContainerStatus{{Name: "c", Ready: true, State: running}}}}, "2/2", "Running"},
		{"scheduling gated", corev1.Pod{Spec: corev1.PodSpec{Containers: make([]corev1.Container, 1)}, Status: corev1.PodStatus{Phase: corev1.PodPending,
			Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonSchedulingGated}}}}, "0/1", "SchedulingGated"},
		{"evicted keeps reason", corev1.Pod{Spec: corev1.PodSpec{Containers: make([]corev1.Container, 1)}, Status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted"}}, "0/1", "Evicted"},
		{"terminating", corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: ptr.To(ago(0))}, Spec: corev1.PodSpec{Containers: make([]corev1.Container, 1)},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Ready: true, State: running}}}}, "1/1", "Terminating"},
		{"deleted but already terminal", corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: ptr.To(ago(0))}, Spec: corev1.PodSpec{Containers: make([]corev1.Container, 1)},
			Status: corev1.PodStatus{Phase: corev1.PodSucceeded, ContainerStatuses: []corev1.ContainerStatus{{State: terminated("Completed", 0, 0)}}}}, "0/1", "Completed"},
		{"node lost", corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: ptr.To(ago(0))}, Spec: corev1.PodSpec{Containers: make([]corev1.Container, 1)},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, Reason: "NodeLost"}}, "0/1", "Unknown"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cells, _ := podRow(&tc.pod, now)
			if cells[1] != tc.wantReady || cells[2] != tc.wantStatus {
				t.Errorf("READY %v STATUS %v, want %s %s", cells[1], cells[2], tc.wantReady, tc.wantStatus)
			}
		})
	}
}

func TestIncludeObjectPolicies(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: om("p", time.Minute), Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}}}
	cases := []struct {
		policy   metav1.IncludeObjectPolicy
		wantKind string
	}{
		{"", "PartialObjectMetadata"},
		{metav1.IncludeMetadata, "PartialObjectMetadata"},
		{metav1.IncludeObject, "Pod"},
		{metav1.IncludeNone, ""},
	}
	for _, tc := range cases {
		t.Run(string(tc.policy), func(t *testing.T) {
			tbl, err := Table(pod, Options{IncludeObject: tc.policy, Now: now})
			if err != nil {
				t.Fatal(err)
			}
			// Through JSON, as the server sends it.
			data, err := json.Marshal(tbl)
			if err != nil {
				t.Fatal(err)
			}
			var back struct {
				Kind string
				Rows []struct {
					Object map[string]any `json:"object"`
				}
			}
			if err := json.Unmarshal(data, &back); err != nil {
				t.Fatal(err)
			}
			obj := back.Rows[0].Object
			if tc.wantKind == "" {
				if obj != nil {
					t.Errorf("row object = %v, want none", obj)
				}
				return
			}
			if obj["kind"] != tc.wantKind || obj["metadata"].(map[string]any)["name"] != "p" {
				t.Errorf("row object = %v", obj)
			}
			if tc.wantKind == "Pod" && obj["apiVersion"] != "v1" {
				t.Errorf("full object lacks apiVersion: %v", obj)
			}
			if tc.wantKind == "PartialObjectMetadata" && (obj["apiVersion"] != "meta.k8s.io/v1" || obj["spec"] != nil) {
				t.Errorf("metadata object = %v", obj)
			}
		})
	}
	if _, err := Table(pod, Options{IncludeObject: "Everything"}); err == nil {
		t.Error("bad includeObject accepted")
	}
	if _, err := Table(nil, Options{}); err == nil {
		t.Error("nil object accepted")
	}
}

func TestNoHeadersAndListMetadata(t *testing.T) {
	list := &corev1.ConfigMapList{ListMeta: metav1.ListMeta{ResourceVersion: "77", Continue: "tok"}, Items: []corev1.ConfigMap{{ObjectMeta: om("a", time.Minute)}}}
	tbl, err := Table(list, Options{NoHeaders: true, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if tbl.ColumnDefinitions != nil || tbl.ResourceVersion != "77" || tbl.Continue != "tok" || tbl.Kind != "Table" || tbl.APIVersion != "meta.k8s.io/v1" {
		t.Errorf("table = %+v", tbl)
	}
	one, err := Table(&list.Items[0], Options{Now: now})
	if err != nil || one.ResourceVersion != "42" || len(one.Rows) != 1 {
		t.Errorf("single object table = %+v, %v", one, err)
	}
}

func TestUnknownTypesGetNameAndCreatedAt(t *testing.T) {
	// kube-apiserver has no printer for LimitRanges either.
	obj := &corev1.LimitRange{ObjectMeta: metav1.ObjectMeta{Name: "tpl", CreationTimestamp: ago(time.Hour)}}
	tbl, err := Table(obj, Options{Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if tbl.ColumnDefinitions[1].Name != "Created At" || tbl.Rows[0].Cells[0] != "tpl" || tbl.Rows[0].Cells[1] != "2026-01-02T11:00:00Z" {
		t.Errorf("table = %+v", tbl)
	}
}

func fmtType(o runtime.Object) reflect.Type { return reflect.TypeOf(o) }

// nameAndAgeOnly are the resources kube-apiserver prints as NAME and
// CREATED AT too (it has no printer for them).
var nameAndAgeOnly = map[string]bool{"limitranges": true, "roles": true, "clusterroles": true, "customresourcedefinitions": true}

// BenchmarkTable10000Pods: kubectl get pods on 10,000 pods, rows carrying
// PartialObjectMetadata (kubectl's default).
func BenchmarkTable10000Pods(b *testing.B) {
	list := &corev1.PodList{}
	base := fixtures()["pods"].(*corev1.PodList).Items[0]
	for i := 0; i < 10000; i++ {
		p := base.DeepCopy()
		p.Name = fmt.Sprintf("pod-%05d", i)
		list.Items = append(list.Items, *p)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := Table(list, Options{Now: now}); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzTable fills objects of every catalog type with random content (nil
// pointers, empty and odd statuses) and renders them: no panic, one row
// with one cell per column.
func FuzzTable(f *testing.F) {
	f.Add([]byte("seed"), uint8(0))
	f.Add([]byte{0xff, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07}, uint8(5))
	resources := catalog.All()
	f.Fuzz(func(t *testing.T, data []byte, which uint8) {
		r := resources[int(which)%len(resources)]
		obj := r.New()
		randfill.NewFromGoFuzz(data).NilChance(0.3).NumElements(0, 3).Funcs(
			// Raw JSON and quantities get valid values, as stored objects have.
			func(f *metav1.FieldsV1, c randfill.Continue) { f.Raw = []byte(`{"f:a":{}}`) },
			func(q *resource.Quantity, c randfill.Continue) {
				*q = *resource.NewMilliQuantity(c.Int63n(1e9), resource.DecimalSI)
			},
			// An IntOrString is an int or a string, never a third type.
			func(v *intstr.IntOrString, c randfill.Continue) {
				if c.Bool() {
					*v = intstr.FromInt32(c.Int31())
				} else {
					*v = intstr.FromString(c.String(0))
				}
			},
		).Fill(obj)
		tbl, err := Table(obj, Options{Now: now, IncludeObject: metav1.IncludeObject})
		if err != nil {
			t.Fatalf("%s: %v", r.Resource, err)
		}
		if len(tbl.Rows) != 1 || len(tbl.Rows[0].Cells) != len(tbl.ColumnDefinitions) {
			t.Fatalf("%s: %d rows, %d cells for %d columns", r.Resource, len(tbl.Rows), len(tbl.Rows[0].Cells), len(tbl.ColumnDefinitions))
		}
	})
}

// TestHorizontalPodAutoscalerColumnsAreUpstreams: `kubectl get hpa` shows
// kube-apiserver's columns (REFERENCE, TARGETS as "cpu: 80%/50%", MINPODS,
// MAXPODS, REPLICAS, AGE) for autoscaling/v2 and v1 objects alike.
func TestHorizontalPodAutoscalerColumnsAreUpstreams(t *testing.T) {
	v2 := &autoscalingv2.HorizontalPodAutoscalerList{Items: []autoscalingv2.HorizontalPodAutoscaler{
		{ObjectMeta: om("web", time.Hour), Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "web"},
			MinReplicas:    ptr.To[int32](1), MaxReplicas: 5,
			Metrics: []autoscalingv2.MetricSpec{{Type: autoscalingv2.ResourceMetricSourceType, Resource: &autoscalingv2.ResourceMetricSource{
				Name: corev1.ResourceCPU, Target: autoscalingv2.MetricTarget{Type: autoscalingv2.UtilizationMetricType, AverageUtilization: ptr.To[int32](50)}}}}},
			Status: autoscalingv2.HorizontalPodAutoscalerStatus{CurrentReplicas: 3, DesiredReplicas: 5,
				CurrentMetrics: []autoscalingv2.MetricStatus{{Type: autoscalingv2.ResourceMetricSourceType, Resource: &autoscalingv2.ResourceMetricStatus{
					Name: corev1.ResourceCPU, Current: autoscalingv2.MetricValueStatus{AverageUtilization: ptr.To[int32](80)}}}}}},
		{ObjectMeta: om("fresh", time.Second), Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "api"},
			MaxReplicas:    3,
			Metrics: []autoscalingv2.MetricSpec{{Type: autoscalingv2.ResourceMetricSourceType, Resource: &autoscalingv2.ResourceMetricSource{
				Name: corev1.ResourceMemory, Target: autoscalingv2.MetricTarget{Type: autoscalingv2.UtilizationMetricType, AverageUtilization: ptr.To[int32](70)}}}}}},
	}}
	v1 := &autoscalingv1.HorizontalPodAutoscalerList{Items: []autoscalingv1.HorizontalPodAutoscaler{
		{ObjectMeta: om("web", time.Hour), Spec: autoscalingv1.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv1.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "web"},
			MinReplicas:    ptr.To[int32](1), MaxReplicas: 5, TargetCPUUtilizationPercentage: ptr.To[int32](50)},
			Status: autoscalingv1.HorizontalPodAutoscalerStatus{CurrentReplicas: 3, DesiredReplicas: 5, CurrentCPUUtilizationPercentage: ptr.To[int32](80)}},
	}}
	for _, tc := range []struct {
		name string
		list runtime.Object
		want [][]any
	}{
		{"v2", v2, [][]any{{"web", "Deployment/web", "cpu: 80%/50%", int64(1), int64(5), int64(3)}, {"fresh", "Deployment/api", "memory: <unknown>/70%", "<unset>", int64(3), int64(0)}}},
		{"v1", v1, [][]any{{"web", "Deployment/web", "cpu: 80%/50%", int64(1), int64(5), int64(3)}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tbl, err := Table(tc.list, Options{Now: now})
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, c := range tbl.ColumnDefinitions {
				names = append(names, c.Name)
			}
			if want := []string{"Name", "Reference", "Targets", "MinPods", "MaxPods", "Replicas", "Age"}; !slices.Equal(names, want) {
				t.Fatalf("columns %v, want %v", names, want)
			}
			if len(tbl.Rows) != len(tc.want) {
				t.Fatalf("%d rows, want %d", len(tbl.Rows), len(tc.want))
			}
			for i, w := range tc.want {
				got := tbl.Rows[i].Cells[:len(w)]
				if fmt.Sprint(got) != fmt.Sprint(w) {
					t.Errorf("row %d: %v, want %v", i, got, w)
				}
			}
		})
	}
}
