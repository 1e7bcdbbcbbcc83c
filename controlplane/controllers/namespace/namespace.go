// Package namespace is the controller-manager's namespace controller: when a
// namespace is deleted (the API server marks it Terminating and keeps it
// while its spec.finalizers hold "kubernetes"), it deletes every namespaced
// object of every served resource in it (found by discovery on each pass,
// custom resources and aggregated APIs included), waits until they are
// gone, then removes the "kubernetes" finalizer through
// namespaces/{name}/finalize, after which the API server removes the
// namespace.
//
// It does not refuse new objects in a Terminating namespace: that is the API
// server's NamespaceLifecycle admission.
package namespace

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrlutil"
)

// Name is the controller's name in --controllers and in its queue metrics.
const Name = "namespace"

// ErrContentRemaining means objects are still being deleted; the namespace is
// checked again after Options.RecheckPeriod.
var ErrContentRemaining = errors.New("namespace content remaining")

// Resource is one namespaced resource the controller empties.
type Resource struct {
	GVR schema.GroupVersionResource
	// DeleteCollection says the resource serves deletecollection; otherwise
	// its objects are listed and deleted one by one.
	DeleteCollection bool
}

// Discovery finds the namespaced resources the API server serves
// (client-go's discovery client, through
// discovery.ToDiscoveryInterfaceWithContext). On a partial failure it
// returns what it found with a *discovery.ErrGroupDiscoveryFailed.
type Discovery interface {
	ServerPreferredNamespacedResourcesWithContext(ctx context.Context) ([]*metav1.APIResourceList, error)
}

// Options configure the controller.
type Options struct {
	// Dynamic is the client used to list and delete objects of any resource.
	// Required.
	Dynamic dynamic.Interface
	// Resources to empty; nil means every namespaced resource Discovery
	// finds, on each namespace processed, that serves list and delete.
	Resources []Resource
	// Discovery is required when Resources is nil.
	Discovery Discovery
	// RecheckPeriod is how long to wait before checking again a namespace
	// whose objects are still going (default 2 s).
	RecheckPeriod time.Duration
}

// Controller empties and finalizes deleted namespaces.
type Controller struct {
	client    kubernetes.Interface
	dyn       dynamic.Interface
	log       *slog.Logger
	resources []Resource
	disco     Discovery
	recheck   time.Duration
	nsList    corelisters.NamespaceLister
	queue     workqueue.TypedRateLimitingInterface[string]
	synced    cache.InformerSynced
}

// New builds the controller on factory's namespace informer; the caller
// starts factory.
func New(client kubernetes.Interface, factory informers.SharedInformerFactory, log *slog.Logger, opts Options) *Controller {
	if opts.RecheckPeriod <= 0 {
		opts.RecheckPeriod = 2 * time.Second
	}
	inf := factory.Core().V1().Namespaces()
	c := &Controller{
		client: client, dyn: opts.Dynamic, log: log.With("controller", Name),
		resources: opts.Resources, disco: opts.Discovery, recheck: opts.RecheckPeriod,
		nsList: inf.Lister(), queue: ctrlutil.NewQueue(Name), synced: inf.Informer().HasSynced,
	}
	enqueue := func(obj any) {
		if ns, ok := ctrlutil.Unwrap(obj).(*corev1.Namespace); ok && ns.DeletionTimestamp != nil {
			c.queue.Add(ns.Name)
		}
	}
	inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, cur any) { enqueue(cur) },
	})
	return c
}

// Run processes deleted namespaces with workers goroutines until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	if c.dyn == nil {
		c.log.Error("namespace controller needs a dynamic client (Options.Dynamic)")
		c.queue.ShutDown()
		return
	}
	if c.resources == nil && c.disco == nil {
		c.log.Error("namespace controller needs a discovery client (Options.Discovery) or a list of resources")
		c.queue.ShutDown()
		return
	}
	ctrlutil.RunWorkers(ctx, c.log, Name, c.queue, workers, func(ctx context.Context, key string) error {
		err := c.sync(ctx, key)
		if errors.Is(err, ErrContentRemaining) {
			c.log.Debug("namespace still has content", "namespace", key, "err", err)
			c.queue.AddAfter(key, c.recheck)
			return nil
		}
		return err
	}, c.synced)
}

func (c *Controller) sync(ctx context.Context, name string) error {
	ns, err := c.nsList.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if ns.DeletionTimestamp == nil {
		return nil
	}
	if ns.Status.Phase != corev1.NamespaceTerminating {
		upd := ns.DeepCopy()
		upd.Status.Phase = corev1.NamespaceTerminating
		if ns, err = c.client.CoreV1().Namespaces().UpdateStatus(ctx, upd, metav1.UpdateOptions{}); err != nil {
			if apierrors.IsNotFound(err) {
				return nil
			}
			return fmt.Errorf("mark namespace %s Terminating: %w", name, err)
		}
	}
	if !slices.Contains(ns.Spec.Finalizers, corev1.FinalizerKubernetes) {
		return nil // already finalized; the API server removes it
	}

	ns, remaining, err := c.deleteContent(ctx, ns)
	if err != nil {
		return err
	}
	if len(remaining) > 0 {
		return fmt.Errorf("%w in %s: %s", ErrContentRemaining, name, strings.Join(remaining, ", "))
	}

	upd := ns.DeepCopy()
	upd.Spec.Finalizers = slices.DeleteFunc(upd.Spec.Finalizers, func(f corev1.FinalizerName) bool { return f == corev1.FinalizerKubernetes })
	if _, err := c.client.CoreV1().Namespaces().Finalize(ctx, upd, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("finalize namespace %s: %w", name, err)
	}
	c.log.Info("namespace emptied and finalized", "namespace", name)
	return nil
}

// podsGVR: pods go first (upstream's OrderedNamespaceDeletion, on by
// default): the other content stays until every pod is gone, so a pod never
// runs without the secrets, config maps and service account it uses.
var podsGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

// served is what one discovery found: the resources to empty (those it
// could discover) and what failed.
type served struct {
	resources []Resource
	// discoveryErr: some groups could not be discovered (their resources
	// are missing from resources).
	discoveryErr error
	// parseErr: some discovered group versions could not be parsed.
	parseErr error
}

// discover returns Options.Resources, or else the namespaced resources the
// API server serves now that can be listed and deleted, as upstream's
// namespace controller (deletecollection when served). A failed discovery
// still returns what was found: that is deleted, and the namespace is kept
// until a pass discovers everything.
func (c *Controller) discover(ctx context.Context) served {
	if c.resources != nil {
		return served{resources: c.resources}
	}
	lists, err := c.disco.ServerPreferredNamespacedResourcesWithContext(ctx)
	out := served{discoveryErr: err}
	var parseErrs []error
	for _, l := range lists {
		if l == nil {
			continue
		}
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			parseErrs = append(parseErrs, err)
			continue
		}
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") || !slices.Contains(r.Verbs, "list") || !slices.Contains(r.Verbs, "delete") {
				continue // a subresource, or objects that cannot be listed and deleted
			}
			out.resources = append(out.resources, Resource{GVR: gv.WithResource(r.Name), DeleteCollection: slices.Contains(r.Verbs, "deletecollection")})
		}
	}
	out.parseErr = errors.Join(parseErrs...)
	return out
}

// deleteContent deletes the namespace's pods and, once none is left, every
// other object; it records the outcome in the namespace's deletion
// conditions, as upstream's namespace controller, and returns the resources
// that still have objects ("pods: 3"), such as pods in graceful termination
// or objects held by finalizers. A discovery failure is returned after what
// could be discovered was deleted, so the namespace is not finalized.
func (c *Controller) deleteContent(ctx context.Context, ns *corev1.Namespace) (*corev1.Namespace, []string, error) {
	found := c.discover(ctx)
	var pods, others []Resource
	for _, r := range found.resources {
		if r.GVR == podsGVR {
			pods = append(pods, r)
		} else {
			others = append(others, r)
		}
	}
	errs := c.deleteAll(ctx, ns.Name, pods)
	left, err := c.remaining(ctx, ns.Name, pods)
	if err == nil && len(errs) == 0 && len(left.counts) == 0 {
		errs = c.deleteAll(ctx, ns.Name, others)
		left, err = c.remaining(ctx, ns.Name, others)
	}
	ns = c.setConditions(ctx, ns, found, errs, left)
	if found.discoveryErr != nil {
		errs = append(errs, fmt.Errorf("discover the namespaced resources: %w", found.discoveryErr))
	}
	if found.parseErr != nil {
		errs = append(errs, fmt.Errorf("discover the namespaced resources: %w", found.parseErr))
	}
	if err := errors.Join(errs...); err != nil {
		return ns, nil, err
	}
	if err != nil {
		return ns, nil, err
	}
	var out []string
	for _, r := range found.resources {
		if n := left.counts[r.GVR]; n > 0 {
			out = append(out, fmt.Sprintf("%s: %d", r.GVR.Resource, n))
		}
	}
	return ns, out, nil
}

// deleteAll deletes every object of resources in ns.
func (c *Controller) deleteAll(ctx context.Context, ns string, resources []Resource) []error {
	var errs []error
	bg := metav1.DeletePropagationBackground
	for _, r := range resources {
		ri := c.dyn.Resource(r.GVR).Namespace(ns)
		if r.DeleteCollection {
			err := ri.DeleteCollection(ctx, metav1.DeleteOptions{PropagationPolicy: &bg}, metav1.ListOptions{})
			if err == nil {
				continue
			}
			if !apierrors.IsNotFound(err) && !apierrors.IsMethodNotSupported(err) {
				errs = append(errs, fmt.Errorf("delete all %s in %s: %w", r.GVR.Resource, ns, err))
				continue
			}
			// not served after all: one by one below
		}
		list, err := ri.List(ctx, metav1.ListOptions{})
		if err != nil {
			if !apierrors.IsNotFound(err) && !apierrors.IsMethodNotSupported(err) {
				errs = append(errs, fmt.Errorf("list %s in %s: %w", r.GVR.Resource, ns, err))
			}
			continue
		}
		for _, item := range list.Items {
			if item.GetDeletionTimestamp() != nil {
				continue // already going (graceful deletion, finalizers)
			}
			uid := item.GetUID()
			err := ri.Delete(ctx, item.GetName(), metav1.DeleteOptions{PropagationPolicy: &bg, Preconditions: &metav1.Preconditions{UID: &uid}})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				errs = append(errs, fmt.Errorf("delete %s %s/%s: %w", r.GVR.Resource, ns, item.GetName(), err))
			}
		}
	}
	return errs
}

// leftover is what a namespace still holds after a deletion pass: objects
// per resource, and per finalizer the objects it holds.
type leftover struct {
	counts     map[schema.GroupVersionResource]int
	finalizers map[string]int
}

func (c *Controller) remaining(ctx context.Context, ns string, resources []Resource) (leftover, error) {
	left := leftover{counts: map[schema.GroupVersionResource]int{}, finalizers: map[string]int{}}
	for _, r := range resources {
		list, err := c.dyn.Resource(r.GVR).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) || apierrors.IsMethodNotSupported(err) {
				continue
			}
			return left, fmt.Errorf("list %s in %s: %w", r.GVR.Resource, ns, err)
		}
		if n := len(list.Items); n > 0 {
			left.counts[r.GVR] = n
		}
		for _, item := range list.Items {
			for _, f := range item.GetFinalizers() {
				left.finalizers[f]++
			}
		}
	}
	return left, nil
}

// The namespace deletion conditions upstream's controller keeps in
// status.conditions: each is False with its "ok" reason unless the last
// pass found otherwise.
var conditionTypes = []struct {
	typ             corev1.NamespaceConditionType
	reason, message string
}{
	{corev1.NamespaceDeletionDiscoveryFailure, "ResourcesDiscovered", "All resources successfully discovered"},
	{corev1.NamespaceDeletionGVParsingFailure, "ParsedGroupVersions", "All legacy kube types successfully parsed"},
	{corev1.NamespaceDeletionContentFailure, "ContentDeleted", "All content successfully deleted, may be waiting on finalization"},
	{corev1.NamespaceContentRemaining, "ContentRemoved", "All content successfully removed"},
	{corev1.NamespaceFinalizersRemaining, "ContentHasNoFinalizers", "All content-preserving finalizers finished"},
}

// setConditions writes the outcome of a deletion pass into the namespace's
// conditions (only when they change) and returns the namespace as stored.
func (c *Controller) setConditions(ctx context.Context, ns *corev1.Namespace, disco served, errs []error, left leftover) *corev1.Namespace {
	found := map[corev1.NamespaceConditionType]corev1.NamespaceCondition{}
	if err := disco.discoveryErr; err != nil {
		msg := err.Error()
		var groups *discovery.ErrGroupDiscoveryFailed
		if errors.As(err, &groups) {
			msg = fmt.Sprintf("Discovery failed for some groups, %d failing: %v", len(groups.Groups), err)
		}
		found[corev1.NamespaceDeletionDiscoveryFailure] = corev1.NamespaceCondition{Status: corev1.ConditionTrue, Reason: "DiscoveryFailed", Message: msg}
	}
	if err := disco.parseErr; err != nil {
		found[corev1.NamespaceDeletionGVParsingFailure] = corev1.NamespaceCondition{Status: corev1.ConditionTrue, Reason: "GroupVersionParsingFailed",
			Message: strings.ReplaceAll(err.Error(), "\n", ", ")}
	}
	if len(errs) > 0 {
		msgs := make([]string, 0, len(errs))
		for _, e := range errs {
			msgs = append(msgs, e.Error())
		}
		slices.Sort(msgs)
		found[corev1.NamespaceDeletionContentFailure] = corev1.NamespaceCondition{Status: corev1.ConditionTrue, Reason: "ContentDeletionFailed",
			Message: fmt.Sprintf("Failed to delete all resource types, %d remaining: %v", len(errs), strings.Join(msgs, ", "))}
	}
	if len(left.counts) > 0 {
		var rs []string
		for gvr, n := range left.counts {
			rs = append(rs, fmt.Sprintf("%s.%s has %d resource instances", gvr.Resource, gvr.Group, n))
		}
		slices.Sort(rs)
		found[corev1.NamespaceContentRemaining] = corev1.NamespaceCondition{Status: corev1.ConditionTrue, Reason: "SomeResourcesRemain",
			Message: "Some resources are remaining: " + strings.Join(rs, ", ")}
	}
	if len(left.finalizers) > 0 {
		var fs []string
		for f, n := range left.finalizers {
			fs = append(fs, fmt.Sprintf("%s in %d resource instances", f, n))
		}
		slices.Sort(fs)
		found[corev1.NamespaceFinalizersRemaining] = corev1.NamespaceCondition{Status: corev1.ConditionTrue, Reason: "SomeFinalizersRemain",
			Message: "Some content in the namespace has finalizers remaining: " + strings.Join(fs, ", ")}
	}
	upd := ns.DeepCopy()
	changed := false
	now := metav1.Now()
	for _, ct := range conditionTypes {
		want, ok := found[ct.typ]
		if !ok {
			want = corev1.NamespaceCondition{Status: corev1.ConditionFalse, Reason: ct.reason, Message: ct.message}
		}
		want.Type, want.LastTransitionTime = ct.typ, now
		i := slices.IndexFunc(upd.Status.Conditions, func(c corev1.NamespaceCondition) bool { return c.Type == ct.typ })
		switch {
		case i < 0:
			upd.Status.Conditions = append(upd.Status.Conditions, want)
			changed = true
		case upd.Status.Conditions[i].Status != want.Status || upd.Status.Conditions[i].Reason != want.Reason || upd.Status.Conditions[i].Message != want.Message:
			if upd.Status.Conditions[i].Status == want.Status {
				want.LastTransitionTime = upd.Status.Conditions[i].LastTransitionTime
			}
			upd.Status.Conditions[i] = want
			changed = true
		}
	}
	if !changed {
		return ns
	}
	stored, err := c.client.CoreV1().Namespaces().UpdateStatus(ctx, upd, metav1.UpdateOptions{})
	if err != nil {
		c.log.Debug("namespace deletion conditions not recorded", "namespace", ns.Name, "err", err)
		return ns
	}
	return stored
}
