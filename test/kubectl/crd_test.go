package kubectl

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// gadgetCRD is a CRD of one or two versions (conversion None). With two,
// v2 is the storage version and v1 stays served.
func gadgetCRD(group string, twoVersions bool) string {
	version := func(name string, storage bool) string {
		return fmt.Sprintf(`
  - name: %s
    served: true
    storage: %t
    subresources:
      status: {}
      scale:
        specReplicasPath: .spec.replicas
        statusReplicasPath: .status.replicas
    additionalPrinterColumns:
    - name: Replicas
      type: integer
      jsonPath: .spec.replicas
    - name: Color
      type: string
      jsonPath: .spec.color
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            x-kubernetes-validations:
            - rule: self.replicas <= 10
              message: at most 10 replicas
            properties:
              replicas: {type: integer, minimum: 0}
              color: {type: string, default: blue, enum: [red, blue]}
              ports:
                type: array
                x-kubernetes-list-type: map
                x-kubernetes-list-map-keys: [name]
                items:
                  type: object
                  required: [name]
                  properties:
                    name: {type: string}
                    port: {type: integer}
          status:
            type: object
            properties:
              replicas: {type: integer}`, name, storage)
	}
	versions := version("v1", true)
	if twoVersions {
		versions = version("v1", false) + version("v2", true)
	}
	return fmt.Sprintf(`apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gadgets.%[1]s
spec:
  group: %[1]s
  scope: Namespaced
  names:
    plural: gadgets
    singular: gadget
    kind: Gadget
    shortNames: [gd]
    categories: [gizmos]
  versions:%[2]s
`, group, versions)
}

func gadget(group, version, name, spec string) string {
	return fmt.Sprintf("apiVersion: %s/%s\nkind: Gadget\nmetadata:\n  name: %s\nspec:\n%s\n", group, version, name, spec)
}

// TestCustomResourcesWithKubectl: a CRD applied with kubectl is served as
// soon as it is Established (kubectl get by plural, short name and
// category; its printer columns; explain from the CRD's OpenAPI); custom
// resources go through apply (client- and server-side, list map keys from
// the schema), patch, scale and the status subresource; bad input gets
// upstream's errors; a second version with conversion None rewrites
// apiVersion; deleting the CRD deletes its instances.
func TestCustomResourcesWithKubectl(t *testing.T) {
	requireE2E(t, defaultKubectl)
	k := newKC(t, defaultKubectl, sharedServer(t))
	ns := k.namespace("crd-")
	const group = "kubectl.waggle.io"
	t.Cleanup(func() { k.try("", "delete", "crd", "gadgets."+group, "--ignore-not-found", "--wait=false") })

	start := time.Now()
	if out := k.apply(gadgetCRD(group, false)); !strings.Contains(out, "customresourcedefinition.apiextensions.k8s.io/gadgets."+group+" created") {
		t.Fatalf("apply CRD: %s", out)
	}
	k.run("wait", "--for=condition=Established", "crd/gadgets."+group, "--timeout=30s")
	k.run("get", "gadgets", "-n", ns)
	t.Logf("CRD applied to kubectl get gadgets served: %v", time.Since(start))

	k.apply(gadget(group, "v1", "g1", "  replicas: 2\n  ports:\n  - name: http\n    port: 80"), "-n", ns)
	out := k.run("get", "gd", "-n", ns)
	if got := strings.Join(fields(header(out)), " "); got != "NAME REPLICAS COLOR" {
		t.Errorf("printer columns %q\n%s", got, out)
	}
	if row := rowOf(t, out, "g1"); row[1] != "2" || row[2] != "blue" {
		t.Errorf("row %v: want 2 replicas and the defaulted color", row)
	}
	if out := k.run("get", "gizmos", "-n", ns, "-o", "name"); strings.TrimSpace(out) != "gadget."+group+"/g1" {
		t.Errorf("get by category: %q", out)
	}
	if out := k.run("explain", "gadgets.spec.color"); !strings.Contains(out, "FIELD: color <string>") {
		t.Errorf("explain:\n%s", out)
	}

	// Server-side apply by a second manager merges list entries by their
	// map key (name), as the schema says.
	k.apply(gadget(group, "v1", "g1", "  ports:\n  - name: https\n    port: 443"), "-n", ns, "--server-side", "--field-manager=other")
	if got := k.run("get", "gadget", "g1", "-n", ns, "-o", "jsonpath={.spec.ports[*].name}"); got != "http https" {
		t.Errorf("ports after server-side apply: %q, want http https", got)
	}
	k.run("patch", "gadget", "g1", "-n", ns, "--type=merge", "-p", `{"spec":{"color":"red"}}`)
	k.run("scale", "gadget", "g1", "-n", ns, "--replicas=5")
	if got := k.run("get", "gadget", "g1", "-n", ns, "-o", "jsonpath={.spec.replicas}/{.spec.color}/{.metadata.generation}"); got != "5/red/4" {
		t.Errorf("after patch and scale: %q, want 5/red/4", got)
	}
	k.run("patch", "gadget", "g1", "-n", ns, "--subresource=status", "--type=merge", "-p", `{"status":{"replicas":5}}`)
	if got := k.run("get", "gadget", "g1", "-n", ns, "-o", "jsonpath={.status.replicas}/{.metadata.generation}"); got != "5/4" {
		t.Errorf("after status patch: %q, want 5/4", got)
	}

	// Bad input: upstream's codes and messages, nothing stored.
	if e := k.fails(gadget(group, "v1", "bad", "  replicas: 11"), "apply", "-n", ns, "-f", "-"); !strings.Contains(e, "at most 10 replicas") || !strings.Contains(e, "is invalid") {
		t.Errorf("CEL rule: %s", e)
	}
	if e := k.fails(gadget(group, "v1", "bad", "  replicas: 1\n  color: green"), "apply", "-n", ns, "-f", "-"); !strings.Contains(e, `spec.color: Unsupported value: "green": supported values: "red", "blue"`) {
		t.Errorf("schema: %s", e)
	}
	if e := k.fails(gadget(group, "v1", "bad", "  replicas: 1\n  shape: round"), "create", "-n", ns, "-f", "-"); !strings.Contains(e, `unknown field "spec.shape"`) {
		t.Errorf("strict field validation: %s", e)
	}
	k.fails("", "get", "gadget", "bad", "-n", ns)
	nonStructural := strings.Replace(gadgetCRD("bad.waggle.io", false), "              color: {type: string, default: blue, enum: [red, blue]}", "              color: {}", 1)
	if e := k.fails(nonStructural, "apply", "-f", "-"); !strings.Contains(e, "properties[color].type: Required value: must not be empty for specified object fields") {
		t.Errorf("non-structural schema: %s", e)
	}

	// A second version, now the storage version: the v1 object reads as v2.
	k.apply(gadgetCRD(group, true))
	k.run("wait", "--for=jsonpath={.status.storedVersions[1]}=v2", "crd/gadgets."+group, "--timeout=30s")
	if got := k.run("get", "gadgets.v2."+group, "g1", "-n", ns, "-o", "jsonpath={.apiVersion}/{.spec.replicas}"); got != group+"/v2/5" {
		t.Errorf("v1 object read as v2: %q", got)
	}
	k.apply(gadget(group, "v2", "g2", "  replicas: 1"), "-n", ns)
	if got := k.run("get", "gadgets.v1."+group, "g2", "-n", ns, "-o", "jsonpath={.apiVersion}"); got != group+"/v1" {
		t.Errorf("v2 object read as v1: %q", got)
	}

	// Deleting the CRD deletes the instances, then the CRD.
	k.run("delete", "crd", "gadgets."+group, "--timeout=45s")
	if e := k.fails("", "get", "gadgets."+group, "-n", ns); !strings.Contains(e, `the server doesn't have a resource type "gadgets`) {
		t.Errorf("after CRD deletion: %s", e)
	}
	k.apply(gadgetCRD(group, false))
	k.run("wait", "--for=condition=Established", "crd/gadgets."+group, "--timeout=30s")
	if out, _, _ := k.try("", "get", "gadgets", "-n", ns, "-o", "name"); strings.TrimSpace(out) != "" {
		t.Errorf("instances survived their CRD's deletion: %q", out)
	}
}

// certManagerCRs is one custom resource of each of cert-manager's kinds.
const certManagerCRs = `apiVersion: cert-manager.io/v1
kind: ClusterIssuer
metadata:
  name: selfsigned
spec:
  selfSigned: {}
---
apiVersion: cert-manager.io/v1
kind: Issuer
metadata:
  name: selfsigned
spec:
  selfSigned: {}
---
apiVersion: cert-manager.io/v1
kind: Certificate
metadata:
  name: web
spec:
  secretName: web-tls
  dnsNames: [web.example.com]
  duration: 2160h
  privateKey: {algorithm: ECDSA, size: 256}
  issuerRef: {name: selfsigned, kind: Issuer}
---
apiVersion: cert-manager.io/v1
kind: CertificateRequest
metadata:
  name: web-1
spec:
  request: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURSBSRVFVRVNULS0tLS0K
  issuerRef: {name: selfsigned, kind: Issuer}
  usages: [digital signature, key encipherment]
---
apiVersion: acme.cert-manager.io/v1
kind: Order
metadata:
  name: web-1-order
spec:
  request: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURSBSRVFVRVNULS0tLS0K
  issuerRef: {name: letsencrypt, kind: ClusterIssuer}
  dnsNames: [web.example.com]
---
apiVersion: acme.cert-manager.io/v1
kind: Challenge
metadata:
  name: web-1-challenge
spec:
  authorizationURL: https://acme.example.com/authz/1
  dnsName: web.example.com
  issuerRef: {name: letsencrypt, kind: ClusterIssuer}
  key: k
  token: t
  type: HTTP-01
  url: https://acme.example.com/chall/1
  solver:
    http01:
      ingress: {ingressClassName: nginx}
`

// TestCertManagerCRDsWithKubectl installs cert-manager's CRDs (v1.19.1,
// testdata/cert-manager) the way its docs say, creates one resource of
// each kind, reads them back through their printer columns, and deletes
// the CRDs with their instances.
func TestCertManagerCRDsWithKubectl(t *testing.T) {
	requireE2E(t, defaultKubectl)
	k := newKC(t, defaultKubectl, sharedServer(t))
	ns := k.namespace("cm-")
	dir, err := filepath.Abs("testdata/cert-manager")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.try("", "delete", "-f", dir, "--ignore-not-found", "--wait=false") })
	out := k.run("apply", "-f", dir)
	for _, crd := range []string{"certificates.cert-manager.io", "certificaterequests.cert-manager.io", "issuers.cert-manager.io",
		"clusterissuers.cert-manager.io", "orders.acme.cert-manager.io", "challenges.acme.cert-manager.io"} {
		if !strings.Contains(out, "customresourcedefinition.apiextensions.k8s.io/"+crd+" created") {
			t.Errorf("apply: no %s created in\n%s", crd, out)
		}
	}
	k.run("wait", "--for=condition=Established", "-f", dir, "--timeout=30s")
	created := k.apply(certManagerCRs, "-n", ns)
	for _, ref := range []string{"clusterissuer.cert-manager.io/selfsigned", "issuer.cert-manager.io/selfsigned", "certificate.cert-manager.io/web",
		"certificaterequest.cert-manager.io/web-1", "order.acme.cert-manager.io/web-1-order", "challenge.acme.cert-manager.io/web-1-challenge"} {
		if !strings.Contains(created, ref+" created") {
			t.Errorf("no %s created in\n%s", ref, created)
		}
	}
	if got := strings.Join(fields(header(k.run("get", "certs", "-n", ns))), " "); got != "NAME READY SECRET AGE" {
		t.Errorf("kubectl get certs: columns %q", got)
	}
	if got := k.run("get", "cert-manager", "-n", ns, "-o", "name"); !strings.Contains(got, "certificate.cert-manager.io/web") || !strings.Contains(got, "issuer.cert-manager.io/selfsigned") {
		t.Errorf("get by category cert-manager:\n%s", got)
	}
	// cert-manager's schema refuses an unknown key algorithm; nothing is stored.
	bad := "apiVersion: cert-manager.io/v1\nkind: Certificate\nmetadata:\n  name: bad\nspec:\n  secretName: bad\n  privateKey: {algorithm: DSA}\n  issuerRef: {name: selfsigned}\n"
	if e := k.fails(bad, "create", "-n", ns, "-f", "-"); !strings.Contains(e, `spec.privateKey.algorithm: Unsupported value: "DSA"`) {
		t.Errorf("bad Certificate: %s", e)
	}
	k.fails("", "get", "certificate", "bad", "-n", ns)
	k.run("delete", "-f", dir, "--timeout=45s")
	if e := k.fails("", "get", "certificates.cert-manager.io", "-n", ns); !strings.Contains(e, "the server doesn't have a resource type") {
		t.Errorf("after deleting the CRDs: %s", e)
	}
}
