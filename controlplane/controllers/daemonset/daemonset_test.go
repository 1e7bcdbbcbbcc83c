package daemonset

import (
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrltest"
	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrlutil"
)

func node(name string, labels map[string]string, taints ...corev1.Taint) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: corev1.NodeSpec{Taints: taints}}
}

func daemonSet() *appsv1.DaemonSet {
	return &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "agent", Namespace: "default", UID: "ds-uid", Generation: 1},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "agent"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "agent"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "a", Image: "agent:1"}}}},
			UpdateStrategy: appsv1.DaemonSetUpdateStrategy{Type: appsv1.RollingUpdateDaemonSetStrategyType},
		},
	}
}

func TestNodeEligibility(t *testing.T) {
	tests := []struct {
		name             string
		node             *corev1.Node
		mod              func(*appsv1.DaemonSet)
		run, keepRunning bool
	}{
		{"plain node", node("n", nil), nil, true, true},
		{"nodeSelector matches", node("n", map[string]string{"disk": "ssd"}), func(d *appsv1.DaemonSet) {
			d.Spec.Template.Spec.NodeSelector = map[string]string{"disk": "ssd"}
		}, true, true},
		{"nodeSelector does not match", node("n", nil), func(d *appsv1.DaemonSet) {
			d.Spec.Template.Spec.NodeSelector = map[string]string{"disk": "ssd"}
		}, false, false},
		{"required affinity excludes", node("n", map[string]string{"zone": "a"}), func(d *appsv1.DaemonSet) {
			d.Spec.Template.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
					MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"a"}}}}}}}}
		}, false, false},
		{"NoSchedule taint: no new pod, existing stays", node("n", nil, corev1.Taint{Key: "k", Effect: corev1.TaintEffectNoSchedule}), nil, false, true},
		{"NoExecute taint evicts", node("n", nil, corev1.Taint{Key: "k", Effect: corev1.TaintEffectNoExecute}), nil, false, false},
		{"tolerated taint", node("n", nil, corev1.Taint{Key: "k", Effect: corev1.TaintEffectNoExecute}), func(d *appsv1.DaemonSet) {
			d.Spec.Template.Spec.Tolerations = []corev1.Toleration{{Key: "k", Operator: corev1.TolerationOpExists}}
		}, true, true},
		{"cordoned and not-ready nodes are tolerated by default", node("n", nil,
			corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule},
			corev1.Taint{Key: corev1.TaintNodeNotReady, Effect: corev1.TaintEffectNoExecute}), nil, true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ds := daemonSet()
			if tc.mod != nil {
				tc.mod(ds)
			}
			run, keep := NodeShouldRun(tc.node, ds)
			if run != tc.run || keep != tc.keepRunning {
				t.Fatalf("shouldRun=%v shouldContinue=%v, want %v %v", run, keep, tc.run, tc.keepRunning)
			}
		})
	}
}

func TestPinToNodeReplacesRequiredTermsAndKeepsPreferred(t *testing.T) {
	a := &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}}}},
		PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 1}},
	}}
	a = PinToNode(a, "node-7")
	terms := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || len(terms[0].MatchExpressions) != 0 || terms[0].MatchFields[0].Key != "metadata.name" ||
		terms[0].MatchFields[0].Values[0] != "node-7" || len(a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 {
		t.Fatalf("affinity %+v", a.NodeAffinity)
	}
	if n := TargetNode(&corev1.Pod{Spec: corev1.PodSpec{Affinity: a}}); n != "node-7" {
		t.Fatalf("TargetNode = %q", n)
	}
	if n := TargetNode(&corev1.Pod{Spec: corev1.PodSpec{NodeName: "bound", Affinity: a}}); n != "bound" {
		t.Fatalf("TargetNode of a bound pod = %q", n)
	}
}

func daemonPod(ds *appsv1.DaemonSet, nodeName, hash string, ready bool) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "agent-" + nodeName, Namespace: "default", UID: types.UID("pod-" + nodeName),
		Labels:          map[string]string{"app": "agent", appsv1.DefaultDaemonSetUniqueLabelKey: hash},
		OwnerReferences: []metav1.OwnerReference{ctrlutil.NewControllerRef(ds, "apps/v1", "DaemonSet")}},
		Spec: corev1.PodSpec{NodeName: nodeName}}
	if ready {
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	}
	return p
}

func TestRollingUpdateNeverExceedsMaxUnavailable(t *testing.T) {
	tests := []struct {
		name           string
		maxUnavailable intstr.IntOrString
		notReady       int // old pods not ready
		want           int
	}{
		{"one at a time", intstr.FromInt32(1), 0, 1},
		{"two at a time", intstr.FromInt32(2), 0, 2},
		{"percent rounds up", intstr.FromString("30%"), 0, 2},
		{"unavailable old pods go first and count", intstr.FromInt32(1), 2, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ds := daemonSet()
			ds.Spec.UpdateStrategy.RollingUpdate = &appsv1.RollingUpdateDaemonSet{MaxUnavailable: &tc.maxUnavailable}
			var nodes []*corev1.Node
			byNode := map[string][]*corev1.Pod{}
			for i := 0; i < 5; i++ {
				n := fmt.Sprintf("n%d", i)
				nodes = append(nodes, node(n, nil))
				byNode[n] = []*corev1.Pod{daemonPod(ds, n, "old", i >= tc.notReady)}
			}
			c := &Controller{now: time.Now}
			victims, err := c.rollingUpdateVictims(ds, nodes, byNode, Hash(ds), 5)
			if err != nil || len(victims) != tc.want {
				t.Fatalf("%d victims (err %v), want %d", len(victims), err, tc.want)
			}
		})
	}
}

func TestCreatesOnePinnedPodPerEligibleNodeAndReportsStatus(t *testing.T) {
	ds := daemonSet()
	objs := []runtime.Object{ds, node("a", nil), node("b", nil), node("tainted", nil, corev1.Taint{Key: "x", Effect: corev1.TaintEffectNoSchedule})}
	cs := ctrltest.NewClient(objs...)
	f := informers.NewSharedInformerFactory(cs, 0)
	c := New(cs, f, ctrltest.Log(t), Options{})
	ctx := ctrltest.Start(t, cs, f)
	go c.Run(ctx, 1)
	ctrltest.Eventually(t, 5*time.Second, func() error {
		pods, _ := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if len(pods.Items) != 2 {
			return fmt.Errorf("%d pods", len(pods.Items))
		}
		seen := map[string]bool{}
		for _, p := range pods.Items {
			n := TargetNode(&p)
			if p.Spec.NodeName != "" || seen[n] || n == "tainted" || p.Labels[appsv1.DefaultDaemonSetUniqueLabelKey] != Hash(ds) {
				return fmt.Errorf("pod %s for %q (nodeName %q, labels %v)", p.Name, n, p.Spec.NodeName, p.Labels)
			}
			seen[n] = true
		}
		got, _ := cs.AppsV1().DaemonSets("default").Get(ctx, "agent", metav1.GetOptions{})
		if s := got.Status; s.DesiredNumberScheduled != 2 || s.CurrentNumberScheduled != 2 || s.UpdatedNumberScheduled != 2 || s.NumberReady != 0 || s.NumberUnavailable != 2 || s.ObservedGeneration != 1 {
			return fmt.Errorf("status %+v", s)
		}
		return nil
	})
}

func TestSurgeStartsTheNewPodBesideTheOldAndDeletesTheOldOnceAvailable(t *testing.T) {
	ds := daemonSet()
	zero, one := intstr.FromInt32(0), intstr.FromInt32(1)
	ds.Spec.UpdateStrategy.RollingUpdate = &appsv1.RollingUpdateDaemonSet{MaxSurge: &one, MaxUnavailable: &zero}
	hash := Hash(ds)
	nodes := []*corev1.Node{node("n0", nil), node("n1", nil), node("n2", nil)}
	c := &Controller{now: time.Now}

	// All old and available: one node surges.
	byNode := map[string][]*corev1.Pod{}
	for _, n := range nodes {
		byNode[n.Name] = []*corev1.Pod{daemonPod(ds, n.Name, "old", true)}
	}
	create, del, err := c.surgeUpdate(ds, nodes, byNode, hash, 3)
	if err != nil || len(create) != 1 || len(del) != 0 {
		t.Fatalf("create %v delete %d err %v; want one surge pod, no deletion", create, len(del), err)
	}
	// n0 surging with a new pod not yet available: nothing more (budget 1).
	newPod := daemonPod(ds, "n0", hash, false)
	newPod.Name = "agent-n0-new"
	byNode["n0"] = append(byNode["n0"], newPod)
	if create, del, _ := c.surgeUpdate(ds, nodes, byNode, hash, 3); len(create) != 0 || len(del) != 0 {
		t.Fatalf("create %v delete %d while the surge pod is not available", create, len(del))
	}
	// It became available: its old pod goes.
	byNode["n0"][1] = daemonPod(ds, "n0", hash, true)
	if _, del, _ := c.surgeUpdate(ds, nodes, byNode, hash, 3); len(del) != 1 || del[0].Labels[appsv1.DefaultDaemonSetUniqueLabelKey] != "old" {
		t.Fatalf("deleted %v, want n0's old pod", del)
	}
	// An unavailable old pod is replaced at once, beyond the surge budget.
	byNode["n2"] = []*corev1.Pod{daemonPod(ds, "n2", "old", false)}
	if create, _, _ := c.surgeUpdate(ds, nodes, byNode, hash, 3); len(create) != 1 || create[0] != "n2" {
		t.Fatalf("create %v, want n2 at once", create)
	}
}
