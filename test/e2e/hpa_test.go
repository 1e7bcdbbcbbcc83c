package e2e

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

// hpaBurner is a Deployment whose one pod keeps a CPU busy up to its 200m
// limit: 4× its 50m request.
const hpaBurner = `
apiVersion: apps/v1
kind: Deployment
metadata: {name: hpa-burn, namespace: default}
spec:
  replicas: 1
  selector: {matchLabels: {app: hpa-burn}}
  template:
    metadata: {labels: {app: hpa-burn}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: burn
        image: ` + echoImage + `
        imagePullPolicy: Never
        command: ["/waggle-echo", "burn"]
        resources:
          requests: {cpu: 50m}
          limits: {cpu: 200m, memory: 64Mi}
`

var hpaTargets = regexp.MustCompile(`cpu: (\d+)%/50%`)

// testHPAScaleUp: a real pod burning CPU at 4× its request, read by the
// controller-manager's HPA through the API server's native metrics API,
// scales its Deployment (created by `kubectl autoscale`, 50% target) up to
// maxReplicas.
func testHPAScaleUp(t *testing.T, e *env) {
	e.apply(t, hpaBurner)
	t.Cleanup(func() {
		e.kubectlErr("delete", "hpa", "hpa-burn", "--wait=false")
		e.kubectlErr("delete", "deployment", "hpa-burn", "--wait=false")
	})
	e.kubectl(t, "rollout", "status", "deployment/hpa-burn", "--timeout=2m")
	e.kubectl(t, "autoscale", "deployment", "hpa-burn", "--cpu-percent=50", "--min=1", "--max=3")
	took := eventually(t, 2*time.Minute, "the HPA scales hpa-burn to its 3 maxReplicas", func() error {
		out, err := e.kubectlErr("get", "deployment", "hpa-burn", "-o", "jsonpath={.spec.replicas}")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		if out != "3" {
			hpa, _ := e.kubectlErr("get", "hpa", "hpa-burn", "--no-headers")
			return fmt.Errorf("%s replicas; hpa: %s", out, strings.TrimSpace(hpa))
		}
		return nil
	})
	t.Logf("scaled to 3 replicas %v after kubectl autoscale", took.Round(time.Second))
	out := e.kubectl(t, "get", "hpa", "hpa-burn", "--no-headers")
	m := hpaTargets.FindStringSubmatch(out)
	if f := strings.Fields(out); m == nil || len(f) < 7 || f[1] != "Deployment/hpa-burn" || f[4] != "1" || f[5] != "3" {
		t.Errorf("kubectl get hpa: %q", out)
	}
}
