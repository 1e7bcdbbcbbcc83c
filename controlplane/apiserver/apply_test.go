package apiserver_test

import (
	"context"
	"net/http"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	appsv1ac "k8s.io/client-go/applyconfigurations/apps/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// managers returns "manager/operation/subresource" of each managedFields
// entry, in order.
func managers(m metav1.Object) []string {
	var out []string
	for _, e := range m.GetManagedFields() {
		s := e.Manager + "/" + string(e.Operation)
		if e.Subresource != "" {
			s += "/" + e.Subresource
		}
		out = append(out, s)
	}
	return out
}

func owns(m metav1.Object, manager, field string) bool {
	for _, e := range m.GetManagedFields() {
		if e.Manager == manager && e.FieldsV1 != nil && strings.Contains(string(e.FieldsV1.Raw), field) {
			return true
		}
	}
	return false
}

// TestServerSideApply drives server-side apply through client-go's typed
// Apply configurations against the real server: create by apply, field
// ownership, conflicts (409 with the managers and fields in the causes),
// force, shared ownership, removal of fields a manager stops applying, and
// managedFields kept by every other kind of write.
func TestServerSideApply(t *testing.T) {
	cs, srv := newClient(t)
	ctx := context.Background()
	cms := cs.CoreV1().ConfigMaps("default")

	t.Run("apply creates, owns, conflicts and forces", func(t *testing.T) {
		cm, err := cms.Apply(ctx, corev1ac.ConfigMap("ssa", "default").WithData(map[string]string{"a": "1", "b": "2"}),
			metav1.ApplyOptions{FieldManager: "alice"})
		if err != nil {
			t.Fatal(err)
		}
		if cm.UID == "" || cm.Data["a"] != "1" || !owns(cm, "alice", `"f:a"`) || strings.Join(managers(cm), ",") != "alice/Apply" {
			t.Fatalf("applied object: %+v managers %v", cm, managers(cm))
		}
		// Same config again: no write.
		again, err := cms.Apply(ctx, corev1ac.ConfigMap("ssa", "default").WithData(map[string]string{"a": "1", "b": "2"}),
			metav1.ApplyOptions{FieldManager: "alice"})
		if err != nil || again.ResourceVersion != cm.ResourceVersion {
			t.Fatalf("no-op apply: rv %s -> %s, %v", cm.ResourceVersion, again.ResourceVersion, err)
		}
		// bob sets a to another value: a conflict naming alice and .data.a.
		_, err = cms.Apply(ctx, corev1ac.ConfigMap("ssa", "default").WithData(map[string]string{"a": "9"}), metav1.ApplyOptions{FieldManager: "bob"})
		if !apierrors.IsConflict(err) {
			t.Fatalf("conflicting apply: want 409, got %v", err)
		}
		st := err.(apierrors.APIStatus).Status()
		if !strings.Contains(st.Message, `conflict with "alice"`) || st.Details == nil || len(st.Details.Causes) != 1 ||
			st.Details.Causes[0].Field != ".data.a" || st.Details.Causes[0].Type != metav1.CauseTypeFieldManagerConflict {
			t.Fatalf("conflict status: %+v", st)
		}
		if got, _ := cms.Get(ctx, "ssa", metav1.GetOptions{}); got.Data["a"] != "1" {
			t.Fatalf("conflicting apply changed the object: %v", got.Data)
		}
		// bob applies the same value: shared ownership, no conflict.
		if _, err := cms.Apply(ctx, corev1ac.ConfigMap("ssa", "default").WithData(map[string]string{"b": "2"}), metav1.ApplyOptions{FieldManager: "bob"}); err != nil {
			t.Fatal(err)
		}
		// Forced: bob takes a over.
		forced, err := cms.Apply(ctx, corev1ac.ConfigMap("ssa", "default").WithData(map[string]string{"a": "9", "b": "2"}),
			metav1.ApplyOptions{FieldManager: "bob", Force: true})
		if err != nil || forced.Data["a"] != "9" || owns(forced, "alice", `"f:a"`) || !owns(forced, "bob", `"f:a"`) || !owns(forced, "alice", `"f:b"`) {
			t.Fatalf("forced apply: %v %v %s", err, forced.Data, forced.ManagedFields)
		}
		// alice stops applying b; bob still owns it, so it stays. Then bob
		// stops too: b goes.
		if _, err := cms.Apply(ctx, corev1ac.ConfigMap("ssa", "default").WithData(map[string]string{}), metav1.ApplyOptions{FieldManager: "alice"}); err != nil {
			t.Fatal(err)
		}
		got, _ := cms.Get(ctx, "ssa", metav1.GetOptions{})
		if got.Data["b"] != "2" {
			t.Fatalf("a field another manager owns was removed: %v", got.Data)
		}
		if _, err := cms.Apply(ctx, corev1ac.ConfigMap("ssa", "default").WithData(map[string]string{"a": "9"}), metav1.ApplyOptions{FieldManager: "bob"}); err != nil {
			t.Fatal(err)
		}
		if got, _ := cms.Get(ctx, "ssa", metav1.GetOptions{}); got.Data["b"] != "" || got.Data["a"] != "9" {
			t.Fatalf("unowned field kept: %v", got.Data)
		}
	})

	t.Run("every write keeps managedFields", func(t *testing.T) {
		cm, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "writes"}, Data: map[string]string{"a": "1"}},
			metav1.CreateOptions{FieldManager: "creator"})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(managers(cm), ",") != "creator/Update" || !owns(cm, "creator", `"f:a"`) {
			t.Fatalf("after create: %v %s", managers(cm), cm.ManagedFields)
		}
		cm.Data["u"] = "1"
		if cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{FieldManager: "updater"}); err != nil {
			t.Fatal(err)
		}
		for i, p := range []struct {
			pt   types.PatchType
			body string
		}{
			{types.MergePatchType, `{"data":{"m":"1"}}`},
			{types.StrategicMergePatchType, `{"data":{"s":"1"}}`},
			{types.JSONPatchType, `[{"op":"add","path":"/data/j","value":"1"}]`},
		} {
			if cm, err = cms.Patch(ctx, "writes", p.pt, []byte(p.body), metav1.PatchOptions{FieldManager: "patcher" + string(rune('0'+i))}); err != nil {
				t.Fatal(err)
			}
		}
		// The library orders entries by time, then name.
		got := managers(cm)
		sort.Strings(got)
		want := "creator/Update,patcher0/Update,patcher1/Update,patcher2/Update,updater/Update"
		if strings.Join(got, ",") != want || !owns(cm, "updater", `"f:u"`) || !owns(cm, "patcher2", `"f:j"`) {
			t.Fatalf("managers %v, want %s\n%s", managers(cm), want, cm.ManagedFields)
		}
		// Without fieldManager the manager is the User-Agent's prefix.
		uaCfg := rest.CopyConfig(srv.Config)
		uaCfg.UserAgent = "my-controller/v1.2 (linux)"
		cs2 := kubernetes.NewForConfigOrDie(uaCfg)
		cm2, err := cs2.CoreV1().ConfigMaps("default").Patch(ctx, "writes", types.MergePatchType, []byte(`{"data":{"ua":"1"}}`), metav1.PatchOptions{})
		if err != nil || !owns(cm2, "my-controller", `"f:ua"`) {
			t.Fatalf("user-agent manager: %v %v", err, managers(cm2))
		}
		// Resetting managedFields with an empty list clears them.
		cm3, err := cms.Patch(ctx, "writes", types.MergePatchType, []byte(`{"metadata":{"managedFields":[{}]}}`), metav1.PatchOptions{})
		if err != nil || len(cm3.ManagedFields) != 0 {
			t.Fatalf("reset: %v %v", err, managers(cm3))
		}
	})

	t.Run("subresources record their own entries", func(t *testing.T) {
		dep := deployment("ssa-dep")
		d, err := cs.AppsV1().Deployments("default").Apply(ctx, appsv1ac.Deployment("ssa-dep", "default").
			WithSpec(appsv1ac.DeploymentSpec().WithReplicas(2).
				WithSelector(metav1ac.LabelSelector().WithMatchLabels(dep.Spec.Selector.MatchLabels)).
				WithTemplate(corev1ac.PodTemplateSpec().WithLabels(dep.Spec.Template.Labels).
					WithSpec(corev1ac.PodSpec().WithContainers(corev1ac.Container().WithName("c").WithImage("nginx:1.27"))))),
			metav1.ApplyOptions{FieldManager: "deployer"})
		if err != nil {
			t.Fatal(err)
		}
		// Defaults are applied to an applied object, and not owned.
		if d.Spec.Template.Spec.Containers[0].ImagePullPolicy != corev1.PullIfNotPresent || owns(d, "deployer", "imagePullPolicy") {
			t.Fatalf("apply defaults: %+v %s", d.Spec.Template.Spec.Containers[0], d.ManagedFields)
		}
		// Status through /status: an entry with subresource status; spec
		// in the body is ignored and not owned.
		d.Status.ObservedGeneration = d.Generation
		d.Spec.Replicas = ptr(int32(7))
		if d, err = cs.AppsV1().Deployments("default").UpdateStatus(ctx, d, metav1.UpdateOptions{FieldManager: "controller"}); err != nil {
			t.Fatal(err)
		}
		if *d.Spec.Replicas != 2 || owns(d, "controller", "f:spec") || !strings.Contains(strings.Join(managers(d), ","), "controller/Update/status") {
			t.Fatalf("status update: replicas %d, %v %s", *d.Spec.Replicas, managers(d), d.ManagedFields)
		}
		// Scale: an entry with subresource scale owning spec.replicas, which
		// makes the apply manager's replicas a conflict.
		sc, err := cs.AppsV1().Deployments("default").GetScale(ctx, "ssa-dep", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sc.Spec.Replicas = 4
		if _, err := cs.AppsV1().Deployments("default").UpdateScale(ctx, "ssa-dep", sc, metav1.UpdateOptions{FieldManager: "hpa"}); err != nil {
			t.Fatal(err)
		}
		d, _ = cs.AppsV1().Deployments("default").Get(ctx, "ssa-dep", metav1.GetOptions{})
		if !strings.Contains(strings.Join(managers(d), ","), "hpa/Update/scale") || !owns(d, "hpa", "f:replicas") || owns(d, "deployer", "f:replicas") {
			t.Fatalf("scale: %v %s", managers(d), d.ManagedFields)
		}
		// Apply of status through the status subresource.
		st, err := cs.AppsV1().Deployments("default").ApplyStatus(ctx, appsv1ac.Deployment("ssa-dep", "default").
			WithStatus(appsv1ac.DeploymentStatus().WithReadyReplicas(1)), metav1.ApplyOptions{FieldManager: "status-applier"})
		if err != nil || st.Status.ReadyReplicas != 1 || !strings.Contains(strings.Join(managers(st), ","), "status-applier/Apply/status") {
			t.Fatalf("apply status: %v %v", err, managers(st))
		}
	})

	t.Run("bad apply requests", func(t *testing.T) {
		raw := newRaw(t, srv.Config)
		path := "/api/v1/namespaces/default/configmaps/bad"
		for _, c := range []struct {
			name, query, body string
			code              int
		}{
			{"no fieldManager", "", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"bad"}}`, 422},
			{"force on a merge patch is refused", "?fieldManager=x&force=true", "", 422},
			{"undecodable", "?fieldManager=x", "{a: [", 400},
			{"wrong kind", "?fieldManager=x", `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"bad"}}`, 400},
			{"name differs from the URL", "?fieldManager=x", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"other"}}`, 400},
			{"managedFields in the body", "?fieldManager=x", `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"bad","managedFields":[{"manager":"m","operation":"Apply"}]}}`, 400},
		} {
			ct := "application/apply-patch+yaml"
			if c.name == "force on a merge patch is refused" {
				ct, c.body = "application/merge-patch+json", `{"data":{"a":"1"}}`
			}
			code, st, _ := raw.do(http.MethodPatch, path+c.query, ct, strings.NewReader(c.body), -1)
			if code != c.code {
				t.Errorf("%s: code %d (%+v), want %d", c.name, code, st, c.code)
			}
		}
		if _, err := cms.Get(ctx, "bad", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("a refused apply stored the object: %v", err)
		}
		// dryRun apply stores nothing.
		if _, err := cms.Apply(ctx, corev1ac.ConfigMap("bad", "default"), metav1.ApplyOptions{FieldManager: "x", DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Fatal(err)
		}
		if _, err := cms.Get(ctx, "bad", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("a dry-run apply stored the object: %v", err)
		}
	})
}
