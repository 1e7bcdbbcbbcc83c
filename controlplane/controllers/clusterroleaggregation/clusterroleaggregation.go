// Package clusterroleaggregation is the controller-manager's ClusterRole
// aggregation controller: a ClusterRole with an aggregationRule gets, as
// its rules, the union of the rules of every ClusterRole its selectors
// match (how admin, edit and view pick up system:aggregate-to-* and the
// roles users label rbac.authorization.k8s.io/aggregate-to-<role>). As
// upstream, rules are ordered by the source roles' names and duplicates are
// dropped; a role's own rules are never aggregated into itself.
//
// It is not the RBAC authorizer and writes nothing but aggregated rules.
package clusterroleaggregation

import (
	"context"
	"fmt"
	"log/slog"
	"sort"

	rbacv1 "k8s.io/api/rbac/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	rbaclisters "k8s.io/client-go/listers/rbac/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrlutil"
)

// Name is the controller's name in --controllers and in its queue metrics.
const Name = "clusterrole-aggregation"

// Controller fills aggregated ClusterRoles.
type Controller struct {
	client kubernetes.Interface
	log    *slog.Logger
	list   rbaclisters.ClusterRoleLister
	queue  workqueue.TypedRateLimitingInterface[string]
	synced cache.InformerSynced
}

// New builds the controller on factory's ClusterRole informer.
func New(client kubernetes.Interface, factory informers.SharedInformerFactory, log *slog.Logger) *Controller {
	inf := factory.Rbac().V1().ClusterRoles()
	c := &Controller{client: client, log: log.With("controller", Name), list: inf.Lister(),
		queue: ctrlutil.NewQueue(Name), synced: inf.Informer().HasSynced}
	// Any change may feed any aggregated role: re-check them all (they are
	// few).
	enqueueAll := func(any) {
		roles, err := c.list.List(labels.Everything())
		if err != nil {
			return
		}
		for _, r := range roles {
			if r.AggregationRule != nil {
				c.queue.Add(r.Name)
			}
		}
	}
	inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueueAll,
		UpdateFunc: func(_, cur any) { enqueueAll(cur) },
		DeleteFunc: enqueueAll,
	})
	return c
}

// Run syncs with workers goroutines until ctx ends.
func (c *Controller) Run(ctx context.Context, workers int) {
	ctrlutil.RunWorkers(ctx, c.log, Name, c.queue, workers, c.sync, c.synced)
}

func (c *Controller) sync(ctx context.Context, name string) error {
	role, err := c.list.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if role.AggregationRule == nil {
		return nil
	}
	rules, err := c.aggregate(role)
	if err != nil {
		return err
	}
	if apiequality.Semantic.DeepEqual(rules, role.Rules) || (len(rules) == 0 && len(role.Rules) == 0) {
		return nil
	}
	upd := role.DeepCopy()
	upd.Rules = rules
	if _, err := c.client.RbacV1().ClusterRoles().Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update aggregated clusterrole %s: %w", name, err)
	}
	c.log.Debug("aggregated clusterrole", "name", name, "rules", len(rules))
	return nil
}

func (c *Controller) aggregate(role *rbacv1.ClusterRole) ([]rbacv1.PolicyRule, error) {
	seen := map[string]*rbacv1.ClusterRole{}
	for _, ls := range role.AggregationRule.ClusterRoleSelectors {
		sel, err := metav1.LabelSelectorAsSelector(&ls)
		if err != nil {
			return nil, fmt.Errorf("clusterrole %s: selector: %w", role.Name, err)
		}
		matched, err := c.list.List(sel)
		if err != nil {
			return nil, err
		}
		for _, m := range matched {
			if m.Name != role.Name {
				seen[m.Name] = m
			}
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	var rules []rbacv1.PolicyRule
	for _, n := range names {
		for _, r := range seen[n].Rules {
			dup := false
			for i := range rules {
				if apiequality.Semantic.DeepEqual(rules[i], r) {
					dup = true
					break
				}
			}
			if !dup {
				rules = append(rules, *r.DeepCopy())
			}
		}
	}
	return rules, nil
}
