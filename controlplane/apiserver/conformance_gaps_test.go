package apiserver_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// invalidAt reports whether err is a 422 naming field.
func invalidAt(err error, field string) bool {
	if !apierrors.IsInvalid(err) {
		return false
	}
	for _, c := range err.(apierrors.APIStatus).Status().Details.Causes {
		if c.Field == field {
			return true
		}
	}
	return false
}

// TestDeviationsTheConformanceSuiteFound: the smaller behaviours upstream's
// e2e specs check, each with upstream's answer and nothing stored when
// refused.
func TestDeviationsTheConformanceSuiteFound(t *testing.T) {
	cs, _ := newClient(t)
	ctx := context.Background()
	yes := true

	t.Run("immutable ConfigMaps and Secrets", func(t *testing.T) {
		cms := cs.CoreV1().ConfigMaps("default")
		cm, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "frozen"}, Data: map[string]string{"a": "1"}, Immutable: &yes}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cm.Data["a"] = "2"
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); !invalidAt(err, "data") {
			t.Errorf("data change of an immutable ConfigMap: %v", err)
		}
		if _, err := cms.Patch(ctx, "frozen", types.MergePatchType, []byte(`{"immutable":false}`), metav1.PatchOptions{}); !invalidAt(err, "immutable") {
			t.Errorf("unfreezing: %v", err)
		}
		// Metadata still changes; deletion works.
		if _, err := cms.Patch(ctx, "frozen", types.MergePatchType, []byte(`{"metadata":{"labels":{"l":"v"}}}`), metav1.PatchOptions{}); err != nil {
			t.Errorf("label on an immutable ConfigMap: %v", err)
		}
		if got, _ := cms.Get(ctx, "frozen", metav1.GetOptions{}); got.Data["a"] != "1" {
			t.Errorf("stored data changed: %v", got.Data)
		}
		secrets := cs.CoreV1().Secrets("default")
		if _, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "frozen"}, Data: map[string][]byte{"a": []byte("1")}, Immutable: &yes}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := secrets.Patch(ctx, "frozen", types.MergePatchType, []byte(`{"data":{"a":"Mg=="}}`), metav1.PatchOptions{}); !invalidAt(err, "data") {
			t.Errorf("data change of an immutable Secret: %v", err)
		}
		if _, err := secrets.Patch(ctx, "frozen", types.MergePatchType, []byte(`{"type":"kubernetes.io/tls"}`), metav1.PatchOptions{}); !invalidAt(err, "type") {
			t.Errorf("type change of a Secret: %v", err)
		}
		if err := cms.Delete(ctx, "frozen", metav1.DeleteOptions{}); err != nil {
			t.Errorf("delete of an immutable ConfigMap: %v", err)
		}
	})

	t.Run("invalid sysctls are rejected", func(t *testing.T) {
		for name, sysctls := range map[string][]corev1.Sysctl{
			"spec.securityContext.sysctls[0].name": {{Name: "foo-", Value: "bar"}},
			"spec.securityContext.sysctls[1].name": {{Name: "kernel.shm_rmid_forced", Value: "1"}, {Name: "bar..", Value: "42"}},
		} {
			p := pod("sysctl", nil)
			p.Spec.SecurityContext = &corev1.PodSecurityContext{Sysctls: sysctls}
			if _, err := cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); !invalidAt(err, name) {
				t.Errorf("%v: %v", sysctls, err)
			}
		}
		p := pod("sysctl", nil)
		p.Spec.SecurityContext = &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: "kernel.shm_rmid_forced", Value: "1"}, {Name: "net/ipv4/ip_local_port_range", Value: "1024 65535"}}}
		if _, err := cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Errorf("valid sysctls: %v", err)
		}
	})

	t.Run("services have deletecollection", func(t *testing.T) {
		svcs := cs.CoreV1().Services("default")
		for _, n := range []string{"dc1", "dc2"} {
			if _, err := svcs.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"set": "dc"}},
				Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		// client-go's typed client skips the verb; the e2e suite uses this.
		if err := cs.CoreV1().RESTClient().Delete().Namespace("default").Resource("services").Param("labelSelector", "set=dc").Do(ctx).Error(); err != nil {
			t.Fatal(err)
		}
		l, err := svcs.List(ctx, metav1.ListOptions{LabelSelector: "set=dc"})
		if err != nil || len(l.Items) != 0 {
			t.Fatalf("after deletecollection: %v %v", l, err)
		}
		if _, err := svcs.Get(ctx, "kubernetes", metav1.GetOptions{}); err != nil {
			t.Fatalf("deletecollection went beyond its selector: %v", err)
		}
	})

	t.Run("status patches keep metadata changes", func(t *testing.T) {
		ns, err := cs.CoreV1().Namespaces().Patch(ctx, "default", types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"status-patched":"yes"}},"status":{"conditions":[{"type":"StatusUpdate","status":"True"}]}}`), metav1.PatchOptions{}, "status")
		if err != nil || ns.Annotations["status-patched"] != "yes" || len(ns.Status.Conditions) != 1 {
			t.Errorf("namespace status patch: %v %v %v", err, ns.Annotations, ns.Status.Conditions)
		}
		svc, err := cs.CoreV1().Services("default").Patch(ctx, "kubernetes", types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"status-patched":"yes"}},"spec":{"type":"NodePort"}}`), metav1.PatchOptions{}, "status")
		if err != nil || svc.Annotations["status-patched"] != "yes" || svc.Spec.Type != corev1.ServiceTypeClusterIP {
			t.Errorf("service status patch: %v %v %v", err, svc.Annotations, svc.Spec.Type)
		}
	})
	t.Run("pod generation: tolerations replaced, graceful delete", func(t *testing.T) {
		// The Pod Generation specs: an update that replaces the tolerations
		// is admitted (DefaultTolerationSeconds adds its two back, so the
		// old ones are kept) and bumps the generation; a graceful delete is
		// 200 with the pod, not 202, and bumps it again.
		pods := cs.CoreV1().Pods("default")
		p, err := pods.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "gen", Generation: 100},
			Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}, metav1.CreateOptions{})
		if err != nil || p.Generation != 1 || len(p.Spec.Tolerations) != 2 {
			t.Fatalf("create: %v generation %d tolerations %v", err, p.Generation, p.Spec.Tolerations)
		}
		p.Spec.Tolerations = []corev1.Toleration{{Key: "foo", Operator: corev1.TolerationOpEqual, Value: "bar", Effect: corev1.TaintEffectNoSchedule}}
		p, err = pods.Update(ctx, p, metav1.UpdateOptions{})
		if err != nil || p.Generation != 2 || len(p.Spec.Tolerations) != 3 {
			t.Fatalf("replacing tolerations: %v %+v", err, p)
		}
		var code int
		var last corev1.Pod
		err = cs.CoreV1().RESTClient().Delete().AbsPath("/api/v1/namespaces/default/pods/gen").Param("gracePeriodSeconds", "60").Do(ctx).StatusCode(&code).Into(&last)
		if err != nil || code != 200 || last.DeletionTimestamp == nil || last.Generation != 3 {
			t.Errorf("graceful delete: %v %d deletionTimestamp %v generation %d", err, code, last.DeletionTimestamp, last.Generation)
		}
	})
	t.Run("the default ServiceCIDR", func(t *testing.T) {
		// kube-apiserver keeps ServiceCIDR "kubernetes" for its Service range, Ready.
		sc, err := cs.NetworkingV1().ServiceCIDRs().Get(ctx, "kubernetes", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(sc.Spec.CIDRs) != 1 || sc.Spec.CIDRs[0] != "10.96.0.0/12" || !meta.IsStatusConditionTrue(sc.Status.Conditions, networkingv1.ServiceCIDRConditionReady) {
			t.Errorf("default ServiceCIDR: %+v %+v", sc.Spec, sc.Status)
		}
	})
	t.Run("events.k8s.io field selectors", func(t *testing.T) {
		// Upstream's field labels of events.k8s.io/v1 (regarding.*,
		// reportingController) over the store core/v1 events share.
		now := metav1.NowMicro()
		ev := &eventsv1.Event{ObjectMeta: metav1.ObjectMeta{Name: "selected"}, EventTime: now, Reason: "Test", Action: "Do", Type: "Normal",
			ReportingController: "test-controller", ReportingInstance: "i", Regarding: corev1.ObjectReference{Kind: "Pod", Name: "p", Namespace: "default"}}
		if _, err := cs.EventsV1().Events("default").Create(ctx, ev, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		other := ev.DeepCopy()
		other.Name, other.ReportingController = "other", "someone-else"
		if _, err := cs.EventsV1().Events("default").Create(ctx, other, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, sel := range []string{"reportingController=test-controller", "regarding.kind=Pod,reportingController=test-controller", "metadata.name=selected"} {
			l, err := cs.EventsV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: sel})
			if err != nil || len(l.Items) != 1 || l.Items[0].Name != "selected" {
				t.Errorf("events.k8s.io list by %s: %v %v", sel, err, l)
			}
		}
		for _, sel := range []string{"reportingComponent=test-controller", "source=test-controller"} {
			// source is source.component, else reportingController (upstream's fallback).
			l, err := cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: sel})
			if err != nil || len(l.Items) != 1 {
				t.Errorf("core list by %s: %v %v", sel, err, l)
			}
		}
		if _, err := cs.EventsV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Pod"}); !apierrors.IsBadRequest(err) {
			t.Errorf("a core field label on events.k8s.io: %v, want 400", err)
		}
	})
}
