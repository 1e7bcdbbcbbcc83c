package apiserver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver/authn"
	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	rqadmission "k8s.io/apiserver/pkg/admission/plugin/resourcequota"
	resourcequotaapi "k8s.io/apiserver/pkg/admission/plugin/resourcequota/apis/resourcequota"
	"k8s.io/apiserver/pkg/authentication/user"
	quota "k8s.io/apiserver/pkg/quota/v1"
	"k8s.io/apiserver/pkg/quota/v1/generic"
	"k8s.io/kubernetes/pkg/quota/v1/evaluator/core"
	"k8s.io/utils/clock"
)

// quotaAdmission is kube-apiserver's ResourceQuota admission plugin: the
// upstream quota evaluator (k8s.io/apiserver's, with k8s.io/kubernetes'
// pod, service and PVC evaluators and an object-count evaluator for every
// other resource, count/<resource>.<group>) over a QuotaAccessor that reads
// and writes the quotas through this server's own store.
//
// A request is admitted only once every quota it counts against has been
// charged: the evaluator adds the request's usage to status.used and
// writes each changed quota with its resourceVersion as a precondition. Two
// racing requests cannot both pass on the same headroom: in this server the
// evaluator batches a namespace's requests through one worker, and across
// servers the loser's write conflicts, it re-reads and re-checks (up to
// three times, as upstream). A request refused after being charged (a name
// already taken) is given back by the ResourceQuota controller's next
// recalculation, as upstream.
type quotaAdmission struct {
	s    *Server
	eval rqadmission.Evaluator
}

func (quotaAdmission) Name() string { return "ResourceQuota" }

// quotaEvaluators are admission's evaluators: they judge the object in the
// request and never list (the controller computes totals).
//
// Not here: the ResourceClaim evaluator (DRA extended-resource quota needs
// informers on device classes and claims in the server); resourceclaims are
// counted as objects only.
func quotaEvaluators() []quota.Evaluator {
	evs := []quota.Evaluator{
		core.NewPodEvaluator(nil, clock.RealClock{}),
		core.NewServiceEvaluator(nil),
		core.NewPersistentVolumeClaimEvaluator(nil),
	}
	// The legacy object-count names (upstream's legacyObjectCountAliases).
	for res, alias := range map[string]corev1.ResourceName{
		"configmaps": corev1.ResourceConfigMaps, "resourcequotas": corev1.ResourceQuotas,
		"replicationcontrollers": corev1.ResourceReplicationControllers, "secrets": corev1.ResourceSecrets,
	} {
		evs = append(evs, generic.NewObjectCountEvaluator(schema.GroupResource{Resource: res}, nil, alias))
	}
	return evs
}

func newQuotaAdmission(s *Server, stop <-chan struct{}) quotaAdmission {
	acc := &quotaAccessor{s: s}
	eval := rqadmission.NewQuotaEvaluator(acc, catalog.QuotaIgnored(), generic.NewRegistry(quotaEvaluators()), nil,
		&resourcequotaapi.Configuration{}, 5, stop)
	return quotaAdmission{s: s, eval: eval}
}

func (p quotaAdmission) Admit(ctx context.Context, a *AdmissionAttributes) error {
	if a.Namespace == "" || !a.Resource.Namespaced {
		return nil
	}
	var op admission.Operation
	switch a.Operation {
	case OpCreate:
		op = admission.Create
	case OpUpdate:
		op = admission.Update
	default:
		return nil
	}
	var u user.Info
	if au, ok := authn.UserFrom(ctx); ok {
		u = &user.DefaultInfo{Name: au.Name, UID: au.UID, Groups: au.Groups}
	}
	attrs := admission.NewAttributesRecord(a.Object, a.OldObject, a.Resource.GroupVersionKind(), a.Namespace, a.Name,
		a.Resource.GroupVersionResource, a.Subresource, op, nil, a.DryRun, u)
	return p.eval.Evaluate(attrs)
}

// quotaAccessor is upstream's QuotaAccessor over the server's store. A
// namespace's quotas are read consistently (the watch cache once it has
// caught up with etcd's current revision): a stale copy could lack a
// status.hard just set, or a charge just made, and let a request through
// unchecked. Namespaces the cache holds no quota for cost no etcd round
// trip (a quota created within the cache's lag is not yet enforced, as
// with upstream's informer). Writes are status updates with the read
// resourceVersion as precondition.
type quotaAccessor struct{ s *Server }

// quotaTimeout bounds one quota read or write of admission.
const quotaTimeout = 5 * time.Second

func (q *quotaAccessor) reg() (*registry, error) {
	r := q.s.registries["resourcequotas"]
	if r == nil {
		return nil, errors.New("resourcequotas are not served")
	}
	return r, nil
}

func (q *quotaAccessor) GetQuotas(namespace string) ([]corev1.ResourceQuota, error) {
	r, err := q.reg()
	if err != nil {
		return nil, nil //nolint:nilerr // no quotas can exist
	}
	ctx, cancel := context.WithTimeout(q.s.bgCtx, quotaTimeout)
	defer cancel()
	res, err := r.list(ctx, namespace, &metav1.ListOptions{ResourceVersion: "0"})
	if err == nil && len(res.items) > 0 {
		res, err = r.list(ctx, namespace, &metav1.ListOptions{})
	}
	if err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("error resolving quota: %w", err))
	}
	out := make([]corev1.ResourceQuota, 0, len(res.items))
	for _, o := range res.items {
		out = append(out, *o.Obj.(*corev1.ResourceQuota).DeepCopy())
	}
	return out, nil
}

func (q *quotaAccessor) UpdateQuotaStatus(newQuota *corev1.ResourceQuota) error {
	r, err := q.reg()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(q.s.bgCtx, quotaTimeout)
	defer cancel()
	want := newQuota.DeepCopy()
	_, err = r.guaranteedUpdate(ctx, want.Namespace, want.Name, "status", writeOpts{manager: "resourcequota-admission"},
		func(cur runtime.Object) (runtime.Object, error) {
			// The resourceVersion pins the write: a quota charged by
			// someone else meanwhile is a conflict, re-read and re-checked.
			return want.DeepCopy(), nil
		})
	return err
}
