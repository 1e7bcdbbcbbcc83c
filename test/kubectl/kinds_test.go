package kubectl

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
)

// v1beta1Describers are the kinds kubectl 1.33 describes through their
// v1beta1 API, which Kubernetes 1.37 does not serve by default.
var v1beta1Describers = map[string]bool{"ipaddresses": true, "servicecidrs": true, "volumeattributesclasses": true}

// TestEveryNewKindThroughKubectl: one object of every kind added with
// Kubernetes 1.37's default API (the apiserver's testdata/kinds fixtures)
// goes through the real kubectl: create, apply over it, get, describe,
// explain and delete. kubectl is run once per verb over the whole
// directory (explain once per kind), so the test stays short.
func TestEveryNewKindThroughKubectl(t *testing.T) {
	requireE2E(t, defaultKubectl)
	k := newKC(t, defaultKubectl, sharedServer(t))
	ns := k.namespace("kinds-")
	src, err := filepath.Glob("../../controlplane/apiserver/testdata/kinds/*.yaml")
	if err != nil || len(src) == 0 {
		t.Fatalf("fixtures: %v %v", src, err)
	}
	dir := t.TempDir()
	type fixture struct {
		file, name, ref string // ref: kubectl's <kind>[.<group>]/<name>
		res             *catalog.Resource
	}
	var fxs []fixture
	for _, f := range src {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(b, &u.Object); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		var res *catalog.Resource
		for _, r := range catalog.All() {
			if r.GroupVersionKind() == u.GroupVersionKind() {
				res = &r
				break
			}
		}
		if res == nil {
			t.Fatalf("%s: %s is not served", f, u.GroupVersionKind())
		}
		ref := strings.ToLower(res.Kind)
		if res.Group != "" {
			ref += "." + res.Group
		}
		fxs = append(fxs, fixture{file: filepath.Base(f), name: u.GetName(), ref: ref + "/" + u.GetName(), res: res})
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { k.try("", "delete", "-f", dir, "-n", ns, "--ignore-not-found", "--wait=false") })

	created := k.run("create", "-f", dir, "-n", ns)
	applied := k.run("apply", "-f", dir, "-n", ns)
	names := k.run("get", "-f", dir, "-n", ns, "-o", "name")
	// kubectl 1.33's describers for ipaddresses, servicecidrs and
	// volumeattributesclasses read their v1beta1 versions, which a 1.37
	// server does not serve by default (kube-apiserver's 404s too), and the
	// Ingress describer looks up its backend Service; those 404s are
	// kubectl's, anything else fails the test.
	described, descErr, err := k.try("", "describe", "-f", dir, "-n", ns, "-v=6")
	if err != nil {
		for _, l := range strings.Split(descErr, "\n") {
			if strings.Contains(l, " 404 ") && !strings.Contains(l, "/v1beta1/") && !strings.Contains(l, "/services/web ") {
				t.Errorf("describe: %s", l)
			}
		}
	}
	for _, fx := range fxs {
		t.Run(fx.file, func(t *testing.T) {
			if !strings.Contains(created, fx.ref+" created") {
				t.Errorf("create: no %q in\n%s", fx.ref+" created", created)
			}
			// Client-side apply over a created object: kubectl warns about
			// the missing last-applied annotation and patches it in.
			if !strings.Contains(applied, fx.ref+" configured") && !strings.Contains(applied, fx.ref+" unchanged") {
				t.Errorf("apply: no %s configured/unchanged in\n%s", fx.ref, applied)
			}
			if !strings.Contains(names, fx.ref+"\n") {
				t.Errorf("get -o name: no %s in\n%s", fx.ref, names)
			}
			if !strings.Contains(described, fx.name) && !v1beta1Describers[fx.res.Resource] {
				t.Errorf("describe: %s not described", fx.ref)
			}
			resource := fx.res.Resource
			explained := k.with(t).run("explain", resource, "--api-version="+fx.res.GroupVersion().String())
			if !strings.Contains(explained, "KIND:       "+fx.res.Kind) || !strings.Contains(explained, "VERSION:    "+fx.res.Version) {
				t.Errorf("explain %s:\n%s", resource, explained)
			}
		})
	}
	// Tables are kube-apiserver's own printers, through server-side printing.
	for r, want := range map[string]string{
		"statefulsets":             "NAME READY AGE",
		"jobs":                     "NAME STATUS COMPLETIONS DURATION AGE",
		"cronjobs":                 "NAME SCHEDULE TIMEZONE SUSPEND ACTIVE LAST SCHEDULE AGE",
		"persistentvolumeclaims":   "NAME STATUS VOLUME CAPACITY ACCESS MODES STORAGECLASS VOLUMEATTRIBUTESCLASS AGE",
		"horizontalpodautoscalers": "NAME REFERENCE TARGETS MINPODS MAXPODS REPLICAS AGE",
		"priorityclasses":          "NAME VALUE GLOBAL-DEFAULT AGE PREEMPTIONPOLICY",
		"roles":                    "NAME CREATED AT",
		"ingresses":                "NAME CLASS HOSTS ADDRESS PORTS AGE",
		"poddisruptionbudgets":     "NAME MIN AVAILABLE MAX UNAVAILABLE ALLOWED DISRUPTIONS AGE",
	} {
		if got := strings.Join(fields(header(k.run("get", r, "-n", ns))), " "); got != want {
			t.Errorf("kubectl get %s: columns %q, want %q", r, got, want)
		}
	}
	deleted := k.run("delete", "-f", dir, "-n", ns, "--wait=false")
	for _, fx := range fxs {
		kind, name, _ := strings.Cut(fx.ref, "/")
		if !strings.Contains(deleted, kind+` "`+name+`" deleted`) {
			t.Errorf("delete: no %s deleted in\n%s", fx.ref, deleted)
		}
	}
	if left := k.run("get", "-f", dir, "-n", ns, "-o", "name", "--ignore-not-found"); strings.TrimSpace(left) != "" {
		t.Errorf("after delete, still there:\n%s", left)
	}
}
