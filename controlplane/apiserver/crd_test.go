package apiserver_test

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// widgetCRD is a namespaced CRD with a schema (an int-or-string, a
// defaulted field, a list map), a CEL rule, the status and scale
// subresources, a printer column and a short name.
func widgetCRD(group string) *apiextensionsv1.CustomResourceDefinition {
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "widgets." + group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: group,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "widgets", Singular: "widget", Kind: "Widget", ShortNames: []string{"wd"}, Categories: []string{"all"}},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Subresources: &apiextensionsv1.CustomResourceSubresources{
					Status: &apiextensionsv1.CustomResourceSubresourceStatus{},
					Scale:  &apiextensionsv1.CustomResourceSubresourceScale{SpecReplicasPath: ".spec.replicas", StatusReplicasPath: ".status.replicas"},
				},
				AdditionalPrinterColumns: []apiextensionsv1.CustomResourceColumnDefinition{{Name: "Replicas", Type: "integer", JSONPath: ".spec.replicas"}},
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"spec": {
							Type:         "object",
							XValidations: apiextensionsv1.ValidationRules{{Rule: "self.replicas <= self.maxReplicas", Message: "replicas must not exceed maxReplicas"}},
							Properties: map[string]apiextensionsv1.JSONSchemaProps{
								"replicas":    {Type: "integer", Minimum: ptr(0.0)},
								"maxReplicas": {Type: "integer", Default: &apiextensionsv1.JSON{Raw: []byte("10")}},
								"port":        {XIntOrString: true, AnyOf: []apiextensionsv1.JSONSchemaProps{{Type: "integer"}, {Type: "string"}}},
								"color":       {Type: "string", Enum: []apiextensionsv1.JSON{{Raw: []byte(`"red"`)}, {Raw: []byte(`"blue"`)}}},
								"free":        {Type: "object", XPreserveUnknownFields: ptr(true)},
							},
						},
						"status": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{"replicas": {Type: "integer"}}},
					},
				}},
			}},
		},
	}
}

func crdClients(t testing.TB, rc *rest.Config) (apiextensionsclient.Interface, dynamic.Interface) {
	t.Helper()
	ac, err := apiextensionsclient.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := dynamic.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	return ac, dc
}

func waitEstablished(t testing.TB, ac apiextensionsclient.Interface, name string) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	var out *apiextensionsv1.CustomResourceDefinition
	testutil.Eventually(t, 30*time.Second, func() error {
		c, err := ac.ApiextensionsV1().CustomResourceDefinitions().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range c.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				out = c
				return nil
			}
		}
		return fmt.Errorf("not established: %+v", c.Status.Conditions)
	})
	return out
}

func widget(name string, spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "example.waggle.io/v1", "kind": "Widget",
		"metadata": map[string]any{"name": name}, "spec": spec,
	}}
}

func TestCustomResourceDefinitionLifecycle(t *testing.T) {
	rc, _, stop := apiservertest.StartTestServer(t)
	defer stop()
	ctx := context.Background()
	ac, dc := crdClients(t, rc)

	created, err := ac.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, widgetCRD("example.waggle.io"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if created.Spec.Conversion == nil || created.Spec.Conversion.Strategy != apiextensionsv1.NoneConverter {
		t.Errorf("conversion not defaulted to None: %+v", created.Spec.Conversion)
	}
	if got := created.Status.StoredVersions; len(got) != 1 || got[0] != "v1" {
		t.Errorf("storedVersions = %v, want [v1]", got)
	}
	c := waitEstablished(t, ac, created.Name)
	if c.Status.AcceptedNames.Plural != "widgets" {
		t.Errorf("acceptedNames = %+v", c.Status.AcceptedNames)
	}

	// Discovery lists it.
	disc := discovery.NewDiscoveryClientForConfigOrDie(rc)
	testutil.Eventually(t, 30*time.Second, func() error {
		rl, err := disc.ServerResourcesForGroupVersion("example.waggle.io/v1")
		if err != nil {
			return err
		}
		for _, r := range rl.APIResources {
			if r.Name == "widgets" && r.Kind == "Widget" && r.Namespaced && len(r.ShortNames) == 1 {
				return nil
			}
		}
		return fmt.Errorf("widgets not in %+v", rl.APIResources)
	})

	gvr := schema.GroupVersionResource{Group: "example.waggle.io", Version: "v1", Resource: "widgets"}
	ws := dc.Resource(gvr).Namespace("default")
	w, err := ws.Create(ctx, widget("w1", map[string]any{"replicas": int64(3), "port": "http", "unknown": "x", "free": map[string]any{"a": "b"}}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	spec := w.Object["spec"].(map[string]any)
	if _, kept := spec["unknown"]; kept {
		t.Errorf("unknown field not pruned: %v", spec)
	}
	if spec["maxReplicas"] != int64(10) {
		t.Errorf("default not applied: %v", spec)
	}
	if spec["free"].(map[string]any)["a"] != "b" {
		t.Errorf("preserved field lost: %v", spec)
	}
	if w.GetGeneration() != 1 {
		t.Errorf("generation = %d, want 1", w.GetGeneration())
	}

	// A CEL rule violation: 422 with the rule's message, nothing stored.
	_, err = ws.Create(ctx, widget("w2", map[string]any{"replicas": int64(30)}), metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "replicas must not exceed maxReplicas") {
		t.Fatalf("CEL violation: %v", err)
	}
	// A schema violation: 422 with the field path.
	_, err = ws.Create(ctx, widget("w2", map[string]any{"replicas": int64(1), "color": "green"}), metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), `spec.color: Unsupported value: "green"`) {
		t.Fatalf("schema violation: %v", err)
	}
	if _, err := ws.Get(ctx, "w2", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("w2 stored after invalid creates: %v", err)
	}
	// Strict field validation names the unknown field.
	_, err = ws.Create(ctx, widget("w3", map[string]any{"replicas": int64(1), "bogus": true}), metav1.CreateOptions{FieldValidation: "Strict"})
	if !apierrors.IsBadRequest(err) || !strings.Contains(err.Error(), `strict decoding error: unknown field "spec.bogus"`) {
		t.Fatalf("strict: %v", err)
	}

	// Status is written only through /status; metadata.generation moves
	// on spec changes only.
	w.Object["status"] = map[string]any{"replicas": int64(2)}
	w, err = ws.UpdateStatus(ctx, w, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if w.GetGeneration() != 1 {
		t.Errorf("status write bumped generation to %d", w.GetGeneration())
	}
	w, err = ws.Patch(ctx, "w1", types.MergePatchType, []byte(`{"spec":{"replicas":4},"status":{"replicas":9}}`), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if w.GetGeneration() != 2 || w.Object["status"].(map[string]any)["replicas"] != int64(2) {
		t.Errorf("after spec patch: generation %d, status %v", w.GetGeneration(), w.Object["status"])
	}
	// Server-side apply.
	applied := widget("w1", map[string]any{"replicas": int64(5)})
	w, err = ws.Apply(ctx, "w1", applied, metav1.ApplyOptions{FieldManager: "tester", Force: true})
	if err != nil {
		t.Fatal(err)
	}
	if w.Object["spec"].(map[string]any)["replicas"] != int64(5) {
		t.Errorf("apply: %v", w.Object["spec"])
	}

	// Deleting the CRD deletes its instances, then the CRD.
	if err := ac.ApiextensionsV1().CustomResourceDefinitions().Delete(ctx, created.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 45*time.Second, func() error {
		_, err := ac.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, created.Name, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("CRD still there: %v", err)
		}
		return nil
	})
	testutil.Eventually(t, 30*time.Second, func() error {
		_, err := ws.List(ctx, metav1.ListOptions{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("widgets still served: %v", err)
		}
		return nil
	})
}

func TestCustomResourceDefinitionNonStructuralSchema(t *testing.T) {
	rc, _, stop := apiservertest.StartTestServer(t)
	defer stop()
	ac, _ := crdClients(t, rc)
	bad := widgetCRD("bad.waggle.io")
	bad.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"] = apiextensionsv1.JSONSchemaProps{
		Type:       "object",
		Properties: map[string]apiextensionsv1.JSONSchemaProps{"x": {}},
	}
	_, err := ac.ApiextensionsV1().CustomResourceDefinitions().Create(context.Background(), bad, metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.validation.openAPIV3Schema.properties[spec].properties[x].type: Required value: must not be empty for specified object fields") {
		t.Fatalf("non-structural schema: %v", err)
	}
	if _, err := ac.ApiextensionsV1().CustomResourceDefinitions().Get(context.Background(), bad.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("stored: %v", err)
	}
}

// TestCustomResourceProtocol: a cluster-scoped CRD's resources through the
// built-in protocol: dryRun stores nothing, labels and paging select,
// watch delivers, fieldValidation Warn warns, a Table comes from the
// printer columns, OpenAPI v3 has the schema, protobuf-preferring clients
// get JSON.
func TestCustomResourceProtocol(t *testing.T) {
	rc, _, stop := apiservertest.StartTestServer(t)
	defer stop()
	ctx := context.Background()
	ac, dc := crdClients(t, rc)
	c := widgetCRD("cluster.waggle.io")
	c.Spec.Scope = apiextensionsv1.ClusterScoped
	if _, err := ac.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitEstablished(t, ac, c.Name)
	gvr := schema.GroupVersionResource{Group: "cluster.waggle.io", Version: "v1", Resource: "widgets"}
	ws := dc.Resource(gvr)
	mk := func(name string, labels map[string]string) *unstructured.Unstructured {
		u := widget(name, map[string]any{"replicas": int64(1)})
		u.SetAPIVersion("cluster.waggle.io/v1")
		u.SetLabels(labels)
		return u
	}
	if _, err := ws.Create(ctx, mk("dry", nil), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ws.Get(ctx, "dry", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("dryRun stored: %v", err)
	}
	w, err := ws.Watch(ctx, metav1.ListOptions{LabelSelector: "tier=a"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for i := 0; i < 5; i++ {
		tier := "a"
		if i%2 == 1 {
			tier = "b"
		}
		if _, err := ws.Create(ctx, mk(fmt.Sprintf("w%d", i), map[string]string{"tier": tier}), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for seen := 0; seen < 3; {
		select {
		case e := <-w.ResultChan():
			if u, ok := e.Object.(*unstructured.Unstructured); !ok || u.GetLabels()["tier"] != "a" {
				t.Fatalf("watch event %v %T", e.Type, e.Object)
			}
			seen++
		case <-time.After(30 * time.Second):
			t.Fatal("watch: no events")
		}
	}
	l, err := ws.List(ctx, metav1.ListOptions{LabelSelector: "tier=b"})
	if err != nil || len(l.Items) != 2 {
		t.Fatalf("label selector: %v %d", err, len(l.Items))
	}
	page, err := ws.List(ctx, metav1.ListOptions{Limit: 2})
	if err != nil || len(page.Items) != 2 || page.GetContinue() == "" {
		t.Fatalf("first page: %v %d %q", err, len(page.Items), page.GetContinue())
	}
	rest2, err := ws.List(ctx, metav1.ListOptions{Limit: 10, Continue: page.GetContinue()})
	if err != nil || len(rest2.Items) != 3 {
		t.Fatalf("second page: %v %d", err, len(rest2.Items))
	}
	if _, err := ws.List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=w1"}); err != nil {
		t.Fatalf("field selector: %v", err)
	}
	// deletecollection with a selector removes exactly the matching ones
	// (the CustomResourceFieldSelectors conformance spec cleans up so).
	if err := ws.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "tier=b"}); err != nil {
		t.Fatalf("deletecollection: %v", err)
	}
	left, err := ws.List(ctx, metav1.ListOptions{})
	if err != nil || len(left.Items) != 3 {
		t.Fatalf("after deletecollection: %v, want 3 items", err)
	}
	for _, it := range left.Items {
		if it.GetLabels()["tier"] == "b" {
			t.Fatalf("deletecollection left %s", it.GetName())
		}
	}

	// fieldValidation Warn (the default): the unknown field is named in a
	// warning and pruned.
	resp, body := rawRequest(t, rc, "POST", "/apis/cluster.waggle.io/v1/widgets", `{"apiVersion":"cluster.waggle.io/v1","kind":"Widget","metadata":{"name":"warned"},"spec":{"replicas":1,"extra":1}}`, nil)
	if resp.StatusCode != 201 || !strings.Contains(resp.Header.Get("Warning"), `unknown field \"spec.extra\"`) {
		t.Errorf("Warn: %d %q %s", resp.StatusCode, resp.Header.Get("Warning"), body)
	}
	// Tables from the printer columns.
	resp, body = rawRequest(t, rc, "GET", "/apis/cluster.waggle.io/v1/widgets", "", map[string]string{"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
	if resp.StatusCode != 200 || !strings.Contains(body, `"name":"Replicas"`) || !strings.Contains(body, `"kind":"Table"`) {
		t.Errorf("table: %d %s", resp.StatusCode, body)
	}
	// Protobuf-preferring clients get JSON; protobuf only is a 406.
	resp, _ = rawRequest(t, rc, "GET", "/apis/cluster.waggle.io/v1/widgets/w0", "", map[string]string{"Accept": "application/vnd.kubernetes.protobuf, application/json"})
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Errorf("protobuf, json: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	resp, _ = rawRequest(t, rc, "GET", "/apis/cluster.waggle.io/v1/widgets/w0", "", map[string]string{"Accept": "application/vnd.kubernetes.protobuf"})
	if resp.StatusCode != 406 {
		t.Errorf("protobuf only: %d, want 406", resp.StatusCode)
	}
	// OpenAPI v3 carries the CRD's schema.
	testutil.Eventually(t, 30*time.Second, func() error {
		resp, body := rawRequest(t, rc, "GET", "/openapi/v3/apis/cluster.waggle.io/v1", "", nil)
		if resp.StatusCode != 200 || !strings.Contains(body, "io.waggle.cluster.v1.Widget") || !strings.Contains(body, "maxReplicas") {
			return fmt.Errorf("openapi v3: %d %.300s", resp.StatusCode, body)
		}
		return nil
	})
	resp, body = rawRequest(t, rc, "GET", "/openapi/v2", "", nil)
	if resp.StatusCode != 200 || !strings.Contains(body, "io.waggle.cluster.v1.Widget") {
		t.Errorf("openapi v2 lacks the CRD: %d", resp.StatusCode)
	}
}

func rawRequest(t *testing.T, rc *rest.Config, method, path, body string, header map[string]string) (*http.Response, string) {
	t.Helper()
	hc, err := rest.HTTPClientFor(rc)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(method, rc.Host+path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// TestCustomResourceConversionWebhook: a CRD with two versions converted
// by a webhook (reached by URL, its certificate checked against caBundle):
// objects are stored in the storage version and read in any served one,
// as the webhook converts them.
func TestCustomResourceConversionWebhook(t *testing.T) {
	hook := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var review apiextensionsv1.ConversionReview
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
			http.Error(w, "bad review", http.StatusBadRequest)
			return
		}
		resp := &apiextensionsv1.ConversionResponse{UID: review.Request.UID, Result: metav1.Status{Status: metav1.StatusSuccess}}
		for _, raw := range review.Request.Objects {
			u := &unstructured.Unstructured{}
			if err := u.UnmarshalJSON(raw.Raw); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			spec, _ := u.Object["spec"].(map[string]any)
			if spec == nil {
				spec = map[string]any{}
			}
			switch review.Request.DesiredAPIVersion {
			case "hook.waggle.io/v2":
				if v, ok := spec["name"]; ok {
					spec["fullName"] = v
					delete(spec, "name")
				}
			case "hook.waggle.io/v1":
				if v, ok := spec["fullName"]; ok {
					spec["name"] = v
					delete(spec, "fullName")
				}
			}
			u.Object["spec"] = spec
			u.SetAPIVersion(review.Request.DesiredAPIVersion)
			b, _ := u.MarshalJSON()
			resp.ConvertedObjects = append(resp.ConvertedObjects, runtime.RawExtension{Raw: b})
		}
		review.Response, review.Request = resp, nil
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(&review)
	}))
	defer hook.Close()
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: hook.Certificate().Raw})

	rc, _, stop := apiservertest.StartTestServer(t)
	defer stop()
	ctx := context.Background()
	ac, dc := crdClients(t, rc)
	schemaOf := func(field string) *apiextensionsv1.CustomResourceValidation {
		return &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
			"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{field: {Type: "string"}}},
		}}}
	}
	url := hook.URL + "/convert"
	c := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "hooks.hook.waggle.io"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "hook.waggle.io", Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "hooks", Singular: "hook", Kind: "Hook"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{
				{Name: "v1", Served: true, Storage: true, Schema: schemaOf("name")},
				{Name: "v2", Served: true, Schema: schemaOf("fullName")},
			},
			Conversion: &apiextensionsv1.CustomResourceConversion{Strategy: apiextensionsv1.WebhookConverter, Webhook: &apiextensionsv1.WebhookConversion{
				ClientConfig:             &apiextensionsv1.WebhookClientConfig{URL: &url, CABundle: caPEM},
				ConversionReviewVersions: []string{"v1"},
			}},
		},
	}
	if _, err := ac.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitEstablished(t, ac, c.Name)
	v1 := dc.Resource(schema.GroupVersionResource{Group: "hook.waggle.io", Version: "v1", Resource: "hooks"}).Namespace("default")
	v2 := dc.Resource(schema.GroupVersionResource{Group: "hook.waggle.io", Version: "v2", Resource: "hooks"}).Namespace("default")
	obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "hook.waggle.io/v1", "kind": "Hook",
		"metadata": map[string]any{"name": "a"}, "spec": map[string]any{"name": "alpha"}}}
	if _, err := v1.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := v2.Get(ctx, "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetAPIVersion() != "hook.waggle.io/v2" || got.Object["spec"].(map[string]any)["fullName"] != "alpha" {
		t.Errorf("read as v2: %v", got.Object)
	}
	obj2 := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "hook.waggle.io/v2", "kind": "Hook",
		"metadata": map[string]any{"name": "b"}, "spec": map[string]any{"fullName": "beta"}}}
	if _, err := v2.Create(ctx, obj2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err = v1.Get(ctx, "b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Object["spec"].(map[string]any)["name"] != "beta" {
		t.Errorf("v2 object read as v1: %v", got.Object)
	}
	l, err := v2.List(ctx, metav1.ListOptions{})
	if err != nil || len(l.Items) != 2 {
		t.Fatalf("list as v2: %v %d", err, len(l.Items))
	}
	for _, it := range l.Items {
		if it.GetAPIVersion() != "hook.waggle.io/v2" || it.Object["spec"].(map[string]any)["fullName"] == nil {
			t.Errorf("list item not converted: %v", it.Object)
		}
	}
}
