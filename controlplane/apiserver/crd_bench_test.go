package apiserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"sort"
	"testing"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver"
	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
)

// benchCRD has a 30-field spec (strings, integers, booleans, an enum, a
// pattern) and two CEL rules.
func benchCRD() *apiextensionsv1.CustomResourceDefinition {
	c := widgetCRD("bench.waggle.io")
	props := map[string]apiextensionsv1.JSONSchemaProps{}
	for i := 0; i < 30; i++ {
		var p apiextensionsv1.JSONSchemaProps
		switch i % 3 {
		case 0:
			p = apiextensionsv1.JSONSchemaProps{Type: "string", MaxLength: ptr(int64(64)), Pattern: "^[a-z0-9-]*$"}
		case 1:
			p = apiextensionsv1.JSONSchemaProps{Type: "integer", Minimum: ptr(0.0), Maximum: ptr(1e6)}
		case 2:
			p = apiextensionsv1.JSONSchemaProps{Type: "boolean"}
		}
		props[fmt.Sprintf("f%02d", i)] = p
	}
	props["replicas"] = apiextensionsv1.JSONSchemaProps{Type: "integer"}
	props["maxReplicas"] = apiextensionsv1.JSONSchemaProps{Type: "integer"}
	spec := apiextensionsv1.JSONSchemaProps{Type: "object", Properties: props, XValidations: apiextensionsv1.ValidationRules{
		{Rule: "self.replicas <= self.maxReplicas", Message: "replicas must not exceed maxReplicas"},
		{Rule: "self.f00.startsWith('w') && self.f01 < 1000000", Message: "f00 starts with w"},
	}}
	c.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"] = spec
	c.Spec.Versions[0].Subresources = nil
	c.Spec.Versions[0].AdditionalPrinterColumns = nil
	return c
}

func benchWidget(name string) *unstructured.Unstructured {
	spec := map[string]any{"replicas": int64(3), "maxReplicas": int64(5)}
	for i := 0; i < 30; i++ {
		switch i % 3 {
		case 0:
			spec[fmt.Sprintf("f%02d", i)] = "widget-value-" + fmt.Sprint(i)
		case 1:
			spec[fmt.Sprintf("f%02d", i)] = int64(1000 + i)
		case 2:
			spec[fmt.Sprintf("f%02d", i)] = i%2 == 0
		}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "bench.waggle.io/v1", "kind": "Widget", "metadata": map[string]any{"name": name}, "spec": spec,
	}}
}

func benchConfigMap(name string) *corev1.ConfigMap {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{}}
	for i := 0; i < 30; i++ {
		cm.Data[fmt.Sprintf("f%02d", i)] = "widget-value-" + fmt.Sprint(i)
	}
	return cm
}

// BenchmarkCustomResourceCreates: creates/s of a custom resource whose
// schema has 30 fields and two CEL rules (decoded, pruned, defaulted,
// validated by the OpenAPI validator and CEL, managedFields tracked) beside
// ConfigMaps with 30 keys, on one server (embedded etcd with fsync),
// alternating rounds. The user's wait is the create call returning.
//
//	go test -run '^$' -bench CustomResourceCreates -benchtime 1x ./controlplane/apiserver/
func BenchmarkCustomResourceCreates(b *testing.B) {
	for i := 0; i < b.N; i++ {
		runCustomResourceCreates(b)
	}
}

func runCustomResourceCreates(b *testing.B) {
	const workers, perRound, rounds = 8, 400, 4
	loadBefore := loadavg()
	srv := apiservertest.Start(b, apiservertest.Options{Configure: func(c *apiserver.Config) { c.EtcdUnsafeNoFsync = false }})
	ctx := context.Background()
	cs := kubernetes.NewForConfigOrDie(srv.Config)
	ac, dc := crdClients(b, srv.Config)
	if _, err := ac.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, benchCRD(), metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	gvr := schema.GroupVersionResource{Group: "bench.waggle.io", Version: "v1", Resource: "widgets"}
	waitEstablished(b, ac, "widgets.bench.waggle.io")
	if _, err := dc.Resource(gvr).Namespace("default").Create(ctx, benchWidget("warmup"), metav1.CreateOptions{}); err != nil {
		b.Fatalf("custom resource: %v", err)
	}
	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, benchConfigMap("warmup"), metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	run := func(op func(i int) error) (float64, []time.Duration, int64) {
		took, lats, errs, _ := concurrently(workers, perRound, op)
		return float64(perRound) / took.Seconds(), lats, errs
	}
	var crRates, cmRates []float64
	var crLat, cmLat []time.Duration
	var crErrs, cmErrs int64
	for r := 0; r < rounds; r++ {
		rate, lats, errs := run(func(i int) error {
			_, err := dc.Resource(gvr).Namespace("default").Create(ctx, benchWidget(fmt.Sprintf("w-%d-%04d", r, i)), metav1.CreateOptions{})
			return err
		})
		crRates, crLat, crErrs = append(crRates, rate), append(crLat, lats...), crErrs+errs
		rate, lats, errs = run(func(i int) error {
			_, err := cs.CoreV1().ConfigMaps("default").Create(ctx, benchConfigMap(fmt.Sprintf("c-%d-%04d", r, i)), metav1.CreateOptions{})
			return err
		})
		cmRates, cmLat, cmErrs = append(cmRates, rate), append(cmLat, lats...), cmErrs+errs
	}
	med := func(v []float64) (float64, float64, float64) {
		s := append([]float64(nil), v...)
		sort.Float64s(s)
		return (s[len(s)/2-1] + s[len(s)/2]) / 2, s[0], s[len(s)-1]
	}
	crMed, crMin, crMax := med(crRates)
	cmMed, cmMin, cmMax := med(cmRates)
	fmt.Fprintf(os.Stdout, "\ncustom resource vs ConfigMap creates (%d each per round, %d rounds alternating, %d concurrent clients, fsync on; CR: 30-field schema + 2 CEL rules, dynamic client JSON; ConfigMap: 30 keys, typed client protobuf; load average before %s, after %s on %d CPUs)\n",
		perRound, rounds, workers, loadBefore, loadavg(), runtime.NumCPU())
	fmt.Fprintf(os.Stdout, "  %-22s median %6.0f /s (min %.0f, max %.0f)  p50 %s  p99 %s  (%d errors)\n", "custom resource", crMed, crMin, crMax, ms(percentile(crLat, .5)), ms(percentile(crLat, .99)), crErrs)
	fmt.Fprintf(os.Stdout, "  %-22s median %6.0f /s (min %.0f, max %.0f)  p50 %s  p99 %s  (%d errors)\n", "ConfigMap", cmMed, cmMin, cmMax, ms(percentile(cmLat, .5)), ms(percentile(cmLat, .99)), cmErrs)
	fmt.Fprintf(os.Stdout, "  %-22s %.2f×\n", "CR / ConfigMap", crMed/cmMed)
	j, _ := json.Marshal(map[string]any{
		"cr_creates_per_s": crMed, "cm_creates_per_s": cmMed, "ratio": crMed / cmMed,
		"cr_p99_ms": float64(percentile(crLat, .99).Microseconds()) / 1000, "cm_p99_ms": float64(percentile(cmLat, .99).Microseconds()) / 1000,
		"loadavg_before": loadBefore, "loadavg_after": loadavg(),
	})
	fmt.Fprintf(os.Stdout, "BENCH_JSON %s\n", j)
	if crErrs > 0 || cmErrs > 0 {
		b.Fatalf("%d custom resource and %d ConfigMap creates failed", crErrs, cmErrs)
	}
}
