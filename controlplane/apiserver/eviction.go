package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver/decode"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	podutil "k8s.io/kubernetes/pkg/api/v1/pod"
)

// maxDisruptedPods bounds a budget's status.disruptedPods, as upstream.
const maxDisruptedPods = 2000

// serveEviction serves pods/eviction as kube-apiserver: a pod that no
// PodDisruptionBudget covers, or that is not running (pending, finished,
// already being deleted), is deleted; otherwise the one budget selecting it
// must allow a disruption (status.disruptionsAllowed, computed by the
// disruption controller), else 429. An allowed eviction records the pod in
// the budget's status.disruptedPods and takes one disruption before the
// pod goes. dryRun (query or the Eviction's deleteOptions) checks all of
// this and changes nothing.
func (s *Server) serveEviction(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request) error {
	wo, _, err := parseWriteOpts(r)
	if err != nil {
		return err
	}
	body, err := readBody(r)
	if err != nil {
		return err
	}
	var ev policyv1.Eviction
	if _, err := decodeInto(body, &ev, r.Header.Get("Content-Type"), decode.Ignore); err != nil {
		return err
	}
	if ev.Name != "" && ev.Name != req.name {
		return apierrors.NewBadRequest(fmt.Sprintf("name in URL does not match name in Eviction object: %s vs %s", req.name, ev.Name))
	}
	opts := ev.DeleteOptions
	if opts == nil {
		opts = &metav1.DeleteOptions{}
	}
	for _, d := range opts.DryRun {
		if d != metav1.DryRunAll {
			return apierrors.NewBadRequest(fmt.Sprintf("unsupported dryRun value %q", d))
		}
		wo.dryRun = true
	}
	for attempt := 0; ; attempt++ {
		o, err := req.reg.get(ctx, req.ns, req.name, "")
		if err != nil {
			return err
		}
		pod := o.Obj.(*corev1.Pod)
		if !evictionNeedsBudget(pod) {
			return s.evictDelete(ctx, w, req, pod, opts, wo)
		}
		pdb, err := s.budgetFor(ctx, pod)
		if err != nil {
			return err
		}
		if pdb == nil {
			return s.evictDelete(ctx, w, req, pod, opts, wo)
		}
		if !podReady(pod) && unhealthyMayGo(pdb) {
			// An unready pod does not count against a budget that is
			// healthy (IfHealthyBudget) or that says AlwaysAllow.
			return s.evictDelete(ctx, w, req, pod, opts, wo)
		}
		if err := checkBudget(pdb); err != nil {
			return err
		}
		if !wo.dryRun {
			err := s.takeDisruption(ctx, pdb, pod.Name)
			if apierrors.IsConflict(err) && attempt < 5 {
				continue // the budget changed: decide again
			}
			if err != nil {
				return err
			}
		}
		return s.evictDelete(ctx, w, req, pod, opts, wo)
	}
}

// evictionNeedsBudget: running pods only; pending, finished and terminating
// pods are deleted without consulting budgets.
func evictionNeedsBudget(p *corev1.Pod) bool {
	switch p.Status.Phase {
	case corev1.PodSucceeded, corev1.PodFailed, corev1.PodPending:
		return false
	}
	return p.DeletionTimestamp == nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func unhealthyMayGo(pdb *policyv1.PodDisruptionBudget) bool {
	if p := pdb.Spec.UnhealthyPodEvictionPolicy; p != nil && *p == policyv1.AlwaysAllow {
		return true
	}
	return pdb.Status.DesiredHealthy > 0 && pdb.Status.CurrentHealthy >= pdb.Status.DesiredHealthy
}

// budgetFor returns the one budget whose selector selects the pod (nil for
// none; more than one is refused, as upstream).
func (s *Server) budgetFor(ctx context.Context, pod *corev1.Pod) (*policyv1.PodDisruptionBudget, error) {
	reg := s.registries["poddisruptionbudgets"]
	if reg == nil {
		return nil, nil // budgets not served: nothing forbids the eviction
	}
	res, err := reg.list(ctx, pod.Namespace, &metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var found []*policyv1.PodDisruptionBudget
	for _, o := range res.items {
		pdb, ok := o.Obj.(*policyv1.PodDisruptionBudget)
		if !ok || pdb.Spec.Selector == nil {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || sel.Empty() || !sel.Matches(labels.Set(pod.Labels)) {
			continue
		}
		found = append(found, pdb)
	}
	switch len(found) {
	case 0:
		return nil, nil
	case 1:
		return found[0].DeepCopy(), nil
	}
	return nil, apierrors.NewInternalError(errors.New("This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."))
}

// checkBudget refuses an eviction the budget does not allow, with
// upstream's codes and messages.
func checkBudget(pdb *policyv1.PodDisruptionBudget) error {
	if pdb.Status.ObservedGeneration < pdb.Generation {
		return tooManyEvictions(fmt.Sprintf("The disruption budget %s is still being processed by the server.", pdb.Name))
	}
	if pdb.Status.DisruptionsAllowed < 0 {
		return apierrors.NewForbidden(policyv1.Resource("poddisruptionbudget"), pdb.Name, errors.New("pdb disruptions allowed is negative"))
	}
	if len(pdb.Status.DisruptedPods) > maxDisruptedPods {
		return apierrors.NewForbidden(policyv1.Resource("poddisruptionbudget"), pdb.Name, errors.New("DisruptedPods map too big - too many evictions not confirmed by PDB controller"))
	}
	if pdb.Status.DisruptionsAllowed == 0 {
		return tooManyEvictions(fmt.Sprintf("The disruption budget %s needs %d healthy pods and has %d currently", pdb.Name, pdb.Status.DesiredHealthy, pdb.Status.CurrentHealthy))
	}
	return nil
}

func tooManyEvictions(cause string) error {
	err := apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
	err.ErrStatus.Details.Causes = append(err.ErrStatus.Details.Causes, metav1.StatusCause{Type: policyv1.DisruptionBudgetCause, Message: cause})
	return err
}

// takeDisruption writes the budget's status with one disruption fewer and
// the pod in disruptedPods, pinned to the budget's resourceVersion (a
// conflict means decide again).
func (s *Server) takeDisruption(ctx context.Context, pdb *policyv1.PodDisruptionBudget, pod string) error {
	reg := s.registries["poddisruptionbudgets"]
	rv := pdb.ResourceVersion
	_, err := reg.guaranteedUpdate(ctx, pdb.Namespace, pdb.Name, "status", writeOpts{manager: "waggle-apiserver"}, func(cur runtime.Object) (runtime.Object, error) {
		c := cur.(*policyv1.PodDisruptionBudget)
		if c.ResourceVersion != rv {
			return nil, apierrors.NewConflict(policyv1.Resource("poddisruptionbudgets"), pdb.Name, errors.New("the budget changed"))
		}
		c.Status.DisruptionsAllowed--
		if c.Status.DisruptedPods == nil {
			c.Status.DisruptedPods = map[string]metav1.Time{}
		}
		c.Status.DisruptedPods[pod] = metav1.NewTime(time.Now())
		return c, nil
	})
	return err
}

// evictDelete deletes the pod that was checked (its UID as a
// precondition) and answers 201 Success.
func (s *Server) evictDelete(ctx context.Context, w http.ResponseWriter, req *request, pod *corev1.Pod, opts *metav1.DeleteOptions, wo writeOpts) error {
	opts = opts.DeepCopy()
	if opts.Preconditions == nil {
		opts.Preconditions = &metav1.Preconditions{}
	}
	if opts.Preconditions.UID == nil {
		uid := pod.UID
		opts.Preconditions.UID = &uid
	}
	if !wo.dryRun {
		// The pod says why it goes, as upstream: DisruptionTarget=True
		// (EvictionByEvictionAPI) through pods/status, so a Job's
		// podFailurePolicy can tell an eviction from a failure.
		pre := opts.Preconditions
		updated, err := req.reg.guaranteedUpdate(ctx, req.ns, req.name, "status", writeOpts{manager: "waggle-apiserver"}, func(cur runtime.Object) (runtime.Object, error) {
			p := cur.(*corev1.Pod)
			if err := checkPreconditions(req.reg.gr, p.Name, pre, p); err != nil {
				return nil, err
			}
			if !podutil.UpdatePodCondition(&p.Status, &corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue,
				Reason: "EvictionByEvictionAPI", Message: "Eviction API: evicting"}) {
				return nil, nil
			}
			p.ResourceVersion = ""
			return p, nil
		})
		if err != nil {
			return err
		}
		if pre.ResourceVersion != nil {
			// This write moved the version the caller pinned.
			rv := objectMeta(updated).GetResourceVersion()
			pre.ResourceVersion = &rv
		}
	}
	if _, _, err := req.reg.deleteObject(ctx, req.ns, req.name, opts, wo); err != nil {
		return err
	}
	writeSuccess(w, http.StatusCreated)
	return nil
}
