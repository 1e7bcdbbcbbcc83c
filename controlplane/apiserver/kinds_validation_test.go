package apiserver_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
)

// set changes one field of an object (path as in unstructured).
func set(v any, path ...string) func(*unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) {
		if err := unstructured.SetNestedField(u.Object, v, path...); err != nil {
			panic(err)
		}
	}
}

func del(path ...string) func(*unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) { unstructured.RemoveNestedField(u.Object, path...) }
}

// TestNewKindsRejectWhatUpstreamRejects: the common rejections of each new
// kind — required fields, ranges, enums, references, immutable fields —
// answer 422 Invalid naming upstream's field path, and store nothing (a
// refused create leaves no object; a refused update leaves the stored one
// at its resourceVersion).
func TestNewKindsRejectWhatUpstreamRejects(t *testing.T) {
	_, s := newClient(t)
	dc, err := dynamic.NewForConfig(s.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	fx := kindFixtures(t)
	cases := []struct {
		name    string
		fixture string
		// create: the fixture so changed is created; update: the fixture
		// is created, then updated so changed.
		create, update func(*unstructured.Unstructured)
		field          string
		detail         string // part of the cause's message, when worth pinning
	}{
		{name: "statefulset replicas below zero", fixture: "statefulsets", create: set(int64(-1), "spec", "replicas"), field: "spec.replicas"},
		{name: "statefulset selector is immutable", fixture: "statefulsets",
			update: set(map[string]any{"app": "sts1", "tier": "x"}, "spec", "selector", "matchLabels"), field: "spec.selector", detail: "field is immutable"},
		{name: "statefulset podManagementPolicy enum", fixture: "statefulsets", create: set("Sometimes", "spec", "podManagementPolicy"), field: "spec.podManagementPolicy"},
		{name: "job parallelism below zero", fixture: "jobs", create: set(int64(-1), "spec", "parallelism"), field: "spec.parallelism"},
		{name: "job completionMode enum", fixture: "jobs", create: set("Sometimes", "spec", "completionMode"), field: "spec.completionMode"},
		{name: "job selector is immutable", fixture: "jobs",
			update: set(map[string]any{"x": "y"}, "spec", "selector", "matchLabels"), field: "spec.selector", detail: "field is immutable"},
		{name: "job restartPolicy Always", fixture: "jobs", create: set("Always", "spec", "template", "spec", "restartPolicy"), field: "spec.template.spec.restartPolicy"},
		{name: "cronjob schedule", fixture: "cronjobs", create: set("every tuesday", "spec", "schedule"), field: "spec.schedule"},
		{name: "pvc accessModes required", fixture: "persistentvolumeclaims", create: del("spec", "accessModes"), field: "spec.accessModes"},
		{name: "pvc spec immutable after creation", fixture: "persistentvolumeclaims",
			update: set([]any{"ReadWriteMany"}, "spec", "accessModes"), field: "spec", detail: "spec is immutable after creation"},
		{name: "pv capacity required", fixture: "persistentvolumes", create: del("spec", "capacity"), field: "spec.capacity"},
		{name: "pv reclaim policy enum", fixture: "persistentvolumes", create: set("Shred", "spec", "persistentVolumeReclaimPolicy"), field: "spec.persistentVolumeReclaimPolicy"},
		{name: "rc selector must match template", fixture: "replicationcontrollers", create: set(map[string]any{"app": "other"}, "spec", "selector"), field: "spec.template.metadata.labels"},
		{name: "podtemplate needs containers", fixture: "podtemplates", create: del("template", "spec", "containers"), field: "template.spec.containers"},
		{name: "resourcequota negative", fixture: "resourcequotas", create: set("-1", "spec", "hard", "pods"), field: "spec.hard[pods]"},
		{name: "limitrange type enum", fixture: "limitranges", create: set([]any{map[string]any{"type": "Galaxy"}}, "spec", "limits"), field: "spec.limits[0].type"},
		{name: "hpa maxReplicas", fixture: "horizontalpodautoscalers", create: set(int64(0), "spec", "maxReplicas"), field: "spec.maxReplicas"},
		{name: "pdb minAvailable and maxUnavailable", fixture: "poddisruptionbudgets", create: set(int64(1), "spec", "maxUnavailable"), field: "spec"},
		{name: "role rule needs verbs", fixture: "roles", create: set([]any{map[string]any{"apiGroups": []any{""}, "resources": []any{"pods"}}}, "rules"), field: "rules[0].verbs"},
		{name: "rolebinding roleRef kind enum", fixture: "rolebindings", create: set("Group", "roleRef", "kind"), field: "roleRef.kind"},
		{name: "rolebinding roleRef is immutable", fixture: "rolebindings", update: set("other", "roleRef", "name"), field: "roleRef", detail: "field is immutable"},
		{name: "clusterrolebinding subject kind", fixture: "clusterrolebindings",
			create: set([]any{map[string]any{"kind": "Robot", "name": "r"}}, "subjects"), field: "subjects[0].kind"},
		{name: "networkpolicy port range", fixture: "networkpolicies",
			create: set([]any{map[string]any{"ports": []any{map[string]any{"port": int64(70000)}}}}, "spec", "ingress"), field: "spec.ingress[0].ports[0].port"},
		{name: "ingress pathType enum", fixture: "ingresses", create: set([]any{map[string]any{"host": "example.com", "http": map[string]any{"paths": []any{
			map[string]any{"path": "/", "pathType": "Fuzzy", "backend": map[string]any{"service": map[string]any{"name": "web", "port": map[string]any{"number": int64(80)}}}}}}}}, "spec", "rules"),
			field: "spec.rules[0].http.paths[0].pathType"},
		{name: "ingressclass controller required", fixture: "ingressclasses", create: del("spec", "controller"), field: "spec.controller"},
		{name: "ipaddress name is an IP", fixture: "ipaddresses", create: set("not-an-ip", "metadata", "name"), field: "metadata.name"},
		{name: "servicecidr cidr", fixture: "servicecidrs", create: set([]any{"10.0.0.0/33"}, "spec", "cidrs"), field: "spec.cidrs[0]"},
		{name: "storageclass provisioner required", fixture: "storageclasses", create: del("provisioner"), field: "provisioner"},
		{name: "storageclass parameters are immutable", fixture: "storageclasses", update: set(map[string]any{"a": "b"}, "parameters"), field: "parameters", detail: "field is immutable"},
		{name: "volumeattachment attacher required", fixture: "volumeattachments", create: del("spec", "attacher"), field: "spec.attacher"},
		{name: "csidriver name", fixture: "csidrivers", create: set("Not A Driver", "metadata", "name"), field: "metadata.name"},
		{name: "priorityclass system- prefix is reserved", fixture: "priorityclasses", create: set("system-mine", "metadata", "name"), field: "metadata.name"},
		{name: "priorityclass value is immutable", fixture: "priorityclasses", update: set(int64(2000), "value"), field: "value"},
		{name: "runtimeclass handler", fixture: "runtimeclasses", create: set("Not_A_Handler", "handler"), field: "handler"},
		{name: "runtimeclass handler is immutable", fixture: "runtimeclasses", update: set("kata", "handler"), field: "handler"},
		{name: "csr signerName required", fixture: "certificatesigningrequests", create: del("spec", "signerName"), field: "spec.signerName"},
		{name: "csr request must be a CSR", fixture: "certificatesigningrequests", create: set("bm90IGEgY3Ny", "spec", "request"), field: "spec.request"},
		{name: "events.k8s.io event needs reportingController", fixture: "events.k8s.io", create: del("reportingController"), field: "reportingController"},
		{name: "flowschema priority level required", fixture: "flowschemas", create: set("", "spec", "priorityLevelConfiguration", "name"), field: "spec.priorityLevelConfiguration.name"},
		{name: "deviceclass selector CEL", fixture: "deviceclasses",
			create: set([]any{map[string]any{"cel": map[string]any{"expression": "device.driver =="}}}, "spec", "selectors"), field: "spec.selectors[0].cel.expression"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			obj := fx[c.fixture].DeepCopy()
			r := resourceOf(t, obj)
			var ri dynamic.ResourceInterface = dc.Resource(r.GroupVersionResource)
			if r.Namespaced {
				ri = dc.Resource(r.GroupVersionResource).Namespace("default")
			}
			var before *unstructured.Unstructured
			if c.update != nil {
				if before, err = ri.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
					t.Fatalf("create the valid object: %v", err)
				}
				t.Cleanup(func() { ri.Delete(ctx, before.GetName(), metav1.DeleteOptions{}) })
				obj = before.DeepCopy()
				c.update(obj)
				_, err = ri.Update(ctx, obj, metav1.UpdateOptions{})
			} else {
				c.create(obj)
				_, err = ri.Create(ctx, obj, metav1.CreateOptions{})
			}
			var st apierrors.APIStatus
			if !errors.As(err, &st) || st.Status().Code != 422 || st.Status().Reason != metav1.StatusReasonInvalid {
				t.Fatalf("want 422 Invalid, got %v", err)
			}
			found := false
			for _, cause := range st.Status().Details.Causes {
				if cause.Field == c.field && strings.Contains(cause.Message, c.detail) {
					found = true
				}
			}
			if !found {
				t.Errorf("no cause at %s (containing %q): %+v", c.field, c.detail, st.Status().Details.Causes)
			}
			got, gerr := ri.Get(ctx, obj.GetName(), metav1.GetOptions{})
			switch {
			case before == nil && !apierrors.IsNotFound(gerr):
				t.Errorf("refused create stored an object: %v %v", got, gerr)
			case before != nil && (gerr != nil || got.GetResourceVersion() != before.GetResourceVersion()):
				t.Errorf("refused update changed the object: rv %s → %v (%v)", before.GetResourceVersion(), got, gerr)
			}
		})
	}
}
