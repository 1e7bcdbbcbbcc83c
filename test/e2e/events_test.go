package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

const crashPod = `
apiVersion: v1
kind: Pod
metadata: {name: crasher, namespace: default}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: crash
    image: ` + echoImage + `
    imagePullPolicy: Never
    command: ["/waggle-echo", "exit", "3"]
`

// testCrashLoopEvents checks, through the real kubectl, the Events of a
// crash-looping pod: Pulled, Created, Started and BackOff with upstream's
// reasons, the repeats counted in one Event rather than one per restart.
func testCrashLoopEvents(t *testing.T, e *env) {
	e.apply(t, crashPod)
	t.Cleanup(func() { e.kubectlErr("delete", "pod", "crasher", "--wait=false") })
	eventually(t, 2*time.Minute, "crasher restarted twice and in CrashLoopBackOff", func() error {
		out, err := e.kubectlErr("get", "pod", "crasher", "-o", "jsonpath={.status.containerStatuses[0].restartCount} {.status.containerStatuses[0].state.waiting.reason}")
		if err != nil {
			return err
		}
		f := strings.Fields(out)
		if len(f) < 2 || f[1] != "CrashLoopBackOff" {
			return fmt.Errorf("status %q", out)
		}
		if n, _ := strconv.Atoi(f[0]); n < 2 {
			return fmt.Errorf("restartCount %s", f[0])
		}
		return nil
	})
	out := e.kubectl(t, "get", "events", "--field-selector", "involvedObject.name=crasher",
		"-o", `jsonpath={range .items[*]}{.reason} {.count} {.source.component}{"\n"}{end}`)
	counts := map[string]int{}
	events := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		n, _ := strconv.Atoi(f[1])
		counts[f[0]] += n
		events[f[0]]++
	}
	for _, reason := range []string{"Scheduled", "Pulled", "Created", "Started", "BackOff"} {
		if counts[reason] == 0 {
			t.Errorf("no %s event:\n%s", reason, out)
		}
	}
	if counts["Started"] < 3 || events["Started"] != 1 {
		t.Errorf("Started: %d Events counting %d starts; want one Event counting >= 3:\n%s", events["Started"], counts["Started"], out)
	}
	if desc := e.kubectl(t, "describe", "pod", "crasher"); !strings.Contains(desc, "Back-off restarting failed container crash") {
		t.Errorf("kubectl describe shows no back-off event:\n%s", desc)
	}
}
