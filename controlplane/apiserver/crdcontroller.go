package apiserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver/extensions/crd"
	"github.com/waggle-io/waggle/controlplane/storage"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/conversion"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	webhookutil "k8s.io/apiserver/pkg/util/webhook"
)

// crdController does, inside the API server, what apiextensions-apiserver's
// controllers do: it follows the CustomResourceDefinitions in the watch
// cache and, for each change, settles the names and the NamesAccepted and
// Established conditions (naming and establishing controllers), serves each
// version of an accepted CRD through a registry and the catalog (discovery
// and OpenAPI follow the catalog; the CRD handler and discovery
// controller), and deletes every instance of a CRD being deleted before
// removing its customresourcecleanup finalizer (finalizer controller).
type crdController struct {
	s      *Server
	mu     sync.Mutex
	served map[string]*servedCRD // by CRD name
	// cleaning marks the CRDs whose instances are being deleted.
	cleaning map[string]bool
	synced   atomic.Bool

	convOnce sync.Once
	conv     *conversion.CRConverterFactory
	convErr  error
	// following counts the controller's own cache watchers (not clients').
	following atomic.Int32
}

type servedCRD struct {
	crd         *apiextensionsv1.CustomResourceDefinition
	key         string   // what the registries were built from
	regs        []string // registry keys of the served versions
	terminating atomic.Bool
}

func newCRDController(s *Server) *crdController {
	return &crdController{s: s, served: map[string]*servedCRD{}, cleaning: map[string]bool{}}
}

func (c *crdController) reg() *registry { return c.s.lookupRegistry(crdKey()) }

// converterFactory is upstream's CR converter factory (conversion
// webhooks: ConversionReview v1/v1beta1 over the webhook client, Services
// resolved to their endpoints as for admission webhooks), made on first
// use.
func (c *crdController) converterFactory() (*conversion.CRConverterFactory, error) {
	c.convOnce.Do(func() {
		var resolver webhookutil.ServiceResolver = noServiceResolver{}
		if c.s.webhookServices != nil {
			resolver = c.s.webhookServices
		}
		c.conv, c.convErr = conversion.NewCRConverterFactory(resolver, nil)
	})
	return c.conv, c.convErr
}

// noServiceResolver answers when the server has no Service informers (no
// dynamic admission): webhooks by URL still work.
type noServiceResolver struct{}

func (noServiceResolver) ResolveEndpoint(namespace, name string, port int32) (*url.URL, error) {
	return nil, fmt.Errorf("service %s/%s: this API server resolves no Services", namespace, name)
}

// run follows the CRDs until ctx ends.
func (c *crdController) run(ctx context.Context) {
	reg := c.reg()
	for ctx.Err() == nil {
		items, rev, err := reg.cache.List(ctx, 0, storage.Predicate{})
		if err != nil {
			c.s.log.Warn("listing CustomResourceDefinitions", "err", err)
			sleepCtx(ctx, time.Second)
			continue
		}
		for _, o := range items {
			c.sync(ctx, o.Obj.(*apiextensionsv1.CustomResourceDefinition).Name)
		}
		c.synced.Store(true)
		w, err := reg.cache.Watch(ctx, rev, storage.Predicate{})
		if err != nil {
			sleepCtx(ctx, time.Second)
			continue
		}
		c.following.Add(1)
		for {
			e, _, err := w.Next(ctx, true)
			if err != nil {
				break
			}
			if e.Obj == nil {
				continue
			}
			name := e.Obj.Obj.(*apiextensionsv1.CustomResourceDefinition).Name
			c.sync(ctx, name)
		}
		w.Stop()
		c.following.Add(-1)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func (c *crdController) all(ctx context.Context) []*apiextensionsv1.CustomResourceDefinition {
	items, _, err := c.reg().cache.List(ctx, 0, storage.Predicate{})
	if err != nil {
		return nil
	}
	out := make([]*apiextensionsv1.CustomResourceDefinition, 0, len(items))
	for _, o := range items {
		out = append(out, o.Obj.(*apiextensionsv1.CustomResourceDefinition))
	}
	return out
}

// sync brings one CRD's status and serving in line with its current state.
func (c *crdController) sync(ctx context.Context, name string) {
	reg := c.reg()
	o, _, err := reg.cache.Get(ctx, 0, reg.key("", name))
	if err != nil {
		if errors.Is(err, storage.ErrNotFound) {
			group := c.unserve(name)
			// Its names are free: the group's other CRDs may take them.
			for _, other := range c.all(ctx) {
				if other.Spec.Group == group && !crd.IsTrue(other, apiextensionsv1.NamesAccepted) {
					c.sync(ctx, other.Name)
				}
			}
		}
		return
	}
	cur := o.Obj.(*apiextensionsv1.CustomResourceDefinition)
	// Names first (naming controller); once accepted, serve the versions,
	// and only then say Established (establishing controller), so a client
	// that waits for Established finds the resources served.
	served := false
	if crd.IsTrue(cur, apiextensionsv1.NamesAccepted) && equality.Semantic.DeepEqual(cur.Spec.Names, cur.Status.AcceptedNames) {
		if err := c.serve(cur); err != nil {
			c.s.log.Error("serving CustomResourceDefinition", "crd", name, "err", err)
		} else {
			served = true
		}
	} else if crd.IsTrue(cur, apiextensionsv1.NamesAccepted) {
		// Accepted names differ from the spec's (a conflict or a rename
		// pending): keep serving the accepted ones.
		served = c.serve(cur) == nil
	}
	if _, changed := crd.Reconcile(cur, c.all(ctx), served); changed {
		c.writeStatus(ctx, name, func(live *apiextensionsv1.CustomResourceDefinition) *apiextensionsv1.CustomResourceDefinition {
			out, changed := crd.Reconcile(live, c.all(ctx), served)
			if !changed {
				return nil
			}
			return out
		})
	}
	if cur.DeletionTimestamp != nil && slices.Contains(cur.Finalizers, crd.CleanupFinalizer) {
		c.mu.Lock()
		start := !c.cleaning[name]
		c.cleaning[name] = true
		c.mu.Unlock()
		if start {
			c.s.bg.Add(1)
			go func() {
				defer c.s.bg.Done()
				c.cleanup(ctx, cur)
			}()
		}
	}
}

// writeStatus updates a CRD's status with fn (nil: nothing to write), as
// the server's controllers.
func (c *crdController) writeStatus(ctx context.Context, name string, fn func(*apiextensionsv1.CustomResourceDefinition) *apiextensionsv1.CustomResourceDefinition) {
	_, err := c.reg().guaranteedUpdate(ctx, "", name, "status", writeOpts{manager: "kube-apiserver"}, func(cur runtime.Object) (runtime.Object, error) {
		out := fn(cur.(*apiextensionsv1.CustomResourceDefinition))
		if out == nil {
			return nil, nil
		}
		out.ResourceVersion = ""
		return out, nil
	})
	if err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
		c.s.log.Warn("updating CustomResourceDefinition status", "crd", name, "err", err)
	}
}

// servingKey is what a CRD's registries depend on: its spec and accepted
// names (not its status conditions or metadata).
func servingKey(cur *apiextensionsv1.CustomResourceDefinition) string {
	b, _ := json.Marshal(struct {
		UID   string
		Spec  apiextensionsv1.CustomResourceDefinitionSpec
		Names apiextensionsv1.CustomResourceDefinitionNames
	}{string(cur.UID), cur.Spec, cur.Status.AcceptedNames})
	return string(b)
}

// serve builds (or rebuilds after a change) the registries and catalog
// entries of an accepted CRD's served versions.
func (c *crdController) serve(cur *apiextensionsv1.CustomResourceDefinition) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := servingKey(cur)
	sc := c.served[cur.Name]
	if sc != nil && sc.key == key {
		sc.terminating.Store(cur.DeletionTimestamp != nil)
		sc.crd = cur
		return nil
	}
	var conv runtime.ObjectConvertor
	if cur.Spec.Conversion != nil && cur.Spec.Conversion.Strategy == apiextensionsv1.WebhookConverter {
		f, err := c.converterFactory()
		if err != nil {
			return err
		}
		if conv, _, err = f.NewConverter(cur); err != nil {
			return err
		}
	}
	vers, err := crd.Versions(cur, conv)
	if err != nil {
		return err
	}
	next := &servedCRD{crd: cur, key: key}
	next.terminating.Store(cur.DeletionTimestamp != nil)
	var built []*registry
	for _, v := range vers {
		if !v.Served {
			continue
		}
		reg, err := c.s.newCustomRegistry(v, next.terminating.Load)
		if err != nil {
			for _, r := range built {
				r.stop()
			}
			return err
		}
		built = append(built, reg)
	}
	keep := map[string]bool{}
	for _, reg := range built {
		k := regKey(reg.res)
		keep[k] = true
		next.regs = append(next.regs, k)
		old := c.s.lookupRegistry(k)
		if old != nil && old.cr == nil {
			// A built-in resource of that name: never replaced.
			reg.stop()
			continue
		}
		c.s.setRegistry(reg)
		if err := c.s.catalog.Set(*reg.res); err != nil {
			c.s.log.Error("catalog", "resource", k, "err", err)
		}
		if old != nil && old.stop != nil {
			old.stop()
		}
	}
	if sc != nil {
		for _, k := range sc.regs {
			if !keep[k] {
				c.dropLocked(k)
			}
		}
	}
	c.served[cur.Name] = next
	c.s.log.Info("serving custom resources", "crd", cur.Name, "versions", len(next.regs))
	return nil
}

func (c *crdController) dropLocked(k string) {
	reg := c.s.dropRegistry(k)
	if reg == nil {
		return
	}
	c.s.catalog.Remove(reg.res.GroupVersionResource)
	if reg.stop != nil {
		reg.stop()
	}
}

// unserve stops serving a deleted CRD's resources; it returns its group.
func (c *crdController) unserve(name string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.cleaning, name)
	sc := c.served[name]
	if sc == nil {
		return ""
	}
	for _, k := range sc.regs {
		c.dropLocked(k)
	}
	delete(c.served, name)
	c.s.log.Info("stopped serving custom resources", "crd", name)
	return sc.crd.Spec.Group
}

// published lists the served CRDs, for OpenAPI.
func (c *crdController) published() []*apiextensionsv1.CustomResourceDefinition {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*apiextensionsv1.CustomResourceDefinition, 0, len(c.served))
	for _, sc := range c.served {
		out = append(out, sc.crd)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// cleanup deletes every instance of a CRD being deleted, then lets it go,
// as upstream's finalizer controller (conditions InstanceDeletionInProgress,
// then InstanceDeletionCompleted). Instances with finalizers are waited for.
func (c *crdController) cleanup(ctx context.Context, cur *apiextensionsv1.CustomResourceDefinition) {
	name := cur.Name
	setTerminating := func(status apiextensionsv1.ConditionStatus, reason, msg string) {
		c.writeStatus(ctx, name, func(live *apiextensionsv1.CustomResourceDefinition) *apiextensionsv1.CustomResourceDefinition {
			out := live.DeepCopy()
			crd.SetCondition(out, apiextensionsv1.CustomResourceDefinitionCondition{Type: apiextensionsv1.Terminating, Status: status, Reason: reason, Message: msg})
			return out
		})
	}
	setTerminating(apiextensionsv1.ConditionTrue, "InstanceDeletionInProgress", "CustomResource deletion is in progress")
	c.mu.Lock()
	var reg *registry
	if sc := c.served[name]; sc != nil && len(sc.regs) > 0 {
		reg = c.s.lookupRegistry(sc.regs[0])
	}
	c.mu.Unlock()
	if reg != nil {
		for deleted := false; ctx.Err() == nil; {
			items, _, err := reg.cache.List(ctx, 0, storage.Predicate{})
			if err == nil && len(items) == 0 {
				break
			}
			if err == nil && !deleted {
				for _, o := range items {
					m := objectMeta(o.Obj)
					if _, _, err := reg.deleteObject(ctx, m.GetNamespace(), m.GetName(), &metav1.DeleteOptions{}, writeOpts{manager: "kube-apiserver"}); err != nil && !apierrors.IsNotFound(err) {
						setTerminating(apiextensionsv1.ConditionTrue, "InstanceDeletionFailed", fmt.Sprintf("could not delete %s %s/%s: %v", reg.res.Resource, m.GetNamespace(), m.GetName(), err))
					}
				}
				deleted = true
			}
			sleepCtx(ctx, 100*time.Millisecond)
		}
	}
	if ctx.Err() != nil {
		return
	}
	setTerminating(apiextensionsv1.ConditionFalse, "InstanceDeletionCompleted", "removed all instances")
	_, err := c.reg().guaranteedUpdate(ctx, "", name, "", writeOpts{manager: "kube-apiserver"}, func(o runtime.Object) (runtime.Object, error) {
		live := o.(*apiextensionsv1.CustomResourceDefinition)
		if !slices.Contains(live.Finalizers, crd.CleanupFinalizer) {
			return nil, nil
		}
		live.Finalizers = slices.DeleteFunc(live.Finalizers, func(f string) bool { return f == crd.CleanupFinalizer })
		live.ResourceVersion = ""
		return live, nil
	})
	if err != nil && !apierrors.IsNotFound(err) {
		c.s.log.Warn("removing the cleanup finalizer", "crd", name, "err", err)
		c.mu.Lock()
		delete(c.cleaning, name)
		c.mu.Unlock()
	}
}
