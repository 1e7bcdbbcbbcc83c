package job

import (
	"fmt"
	"slices"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// matchPodFailurePolicy returns the action of the first rule of the Job's
// podFailurePolicy that a failed pod matches, with the message Kubernetes
// writes into the Job's condition, or nil when no rule matches (the failure
// counts towards backoffLimit as usual).
func matchPodFailurePolicy(policy *batchv1.PodFailurePolicy, p *corev1.Pod) (*batchv1.PodFailurePolicyAction, string) {
	if policy == nil || p.Status.Phase != corev1.PodFailed {
		return nil, ""
	}
	for i, rule := range policy.Rules {
		action := rule.Action
		if req := rule.OnExitCodes; req != nil {
			statuses := append(append([]corev1.ContainerStatus(nil), p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...)
			for _, cs := range statuses {
				if req.ContainerName != nil && *req.ContainerName != cs.Name {
					continue
				}
				t := cs.State.Terminated
				if t == nil || t.ExitCode == 0 {
					continue
				}
				in := slices.Contains(req.Values, t.ExitCode)
				if (req.Operator == batchv1.PodFailurePolicyOnExitCodesOpIn) == in {
					return &action, fmt.Sprintf("Container %s for pod %s/%s failed with exit code %v matching %v rule at index %d",
						cs.Name, p.Namespace, p.Name, t.ExitCode, action, i)
				}
			}
		}
		for _, pat := range rule.OnPodConditions {
			want := pat.Status
			if want == "" {
				want = corev1.ConditionTrue
			}
			for _, c := range p.Status.Conditions {
				if c.Type == pat.Type && c.Status == want {
					return &action, fmt.Sprintf("Pod %s/%s has condition %v matching %v rule at index %d",
						p.Namespace, p.Name, c.Type, action, i)
				}
			}
		}
	}
	return nil, ""
}

// matchSuccessPolicy returns the index of the first successPolicy rule the
// completed indexes satisfy, or -1: a rule with succeededIndexes needs
// succeededCount of them (all of them when unset) completed; a rule with only
// succeededCount needs that many indexes completed.
func matchSuccessPolicy(policy *batchv1.SuccessPolicy, completions int, completed indexSet) int {
	if policy == nil {
		return -1
	}
	for i, rule := range policy.Rules {
		if rule.SucceededIndexes != nil {
			want := parseIndexes(*rule.SucceededIndexes, completions)
			n := 0
			for idx := range want {
				if completed[idx] {
					n++
				}
			}
			if rule.SucceededCount != nil {
				if n >= int(*rule.SucceededCount) {
					return i
				}
			} else if len(want) > 0 && n == len(want) {
				return i
			}
			continue
		}
		if rule.SucceededCount != nil && len(completed) >= int(*rule.SucceededCount) {
			return i
		}
	}
	return -1
}
