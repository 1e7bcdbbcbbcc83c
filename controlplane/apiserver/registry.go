package apiserver

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"reflect"
	"slices"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
	"github.com/waggle-io/waggle/controlplane/apiserver/extensions/crd"
	"github.com/waggle-io/waggle/controlplane/storage"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// registry serves one resource: it runs the create/update/delete logic of
// the resource's strategy against the store, and reads through the watch
// cache where the request allows.
type registry struct {
	res   *catalog.Resource
	gr    schema.GroupResource
	store *storage.Store
	cache *storage.Cacher
	codec *storageCodec
	st    *strategy
	srv   *Server
	// fms are the field managers keeping managedFields, by the subresource
	// written through ("" for the resource itself).
	fms map[string]*managedfields.FieldManager
	// cr is the served CRD version of a custom resource (nil for built-in
	// kinds); stop ends its watch cache when it stops being served.
	cr   *crd.Version
	stop context.CancelFunc
}

func (r *registry) key(ns, name string) string {
	if r.res.Namespaced {
		return r.res.EtcdPrefix() + ns + "/" + name
	}
	return r.res.EtcdPrefix() + name
}

func (r *registry) prefix(ns string) string {
	if r.res.Namespaced && ns != "" {
		return r.res.EtcdPrefix() + ns + "/"
	}
	return r.res.EtcdPrefix()
}

// putOpts are the options of every write of an object: its lifetime when
// the resource has one (Events), as upstream's TTLFunc on create and update.
func (r *registry) putOpts() []storage.PutOption {
	if r.st.ttl == nil {
		return nil
	}
	if ttl := r.st.ttl(&r.srv.cfg); ttl > 0 {
		return []storage.PutOption{storage.WithTTL(ttl)}
	}
	return nil
}

func (r *registry) notFound(name string) error { return apierrors.NewNotFound(r.gr, name) }

// get reads one object: from the watch cache for resourceVersion=0, from
// etcd otherwise.
func (r *registry) get(ctx context.Context, ns, name, rv string) (*storage.Object, error) {
	if rv == "0" {
		o, _, err := r.cache.Get(ctx, 0, r.key(ns, name))
		if err != nil {
			if errors.Is(err, storage.ErrNotFound) {
				return nil, r.notFound(name)
			}
			return nil, err
		}
		return o, nil
	}
	if rv != "" {
		// At least resourceVersion: from the cache once it got there.
		min, err := strconv.ParseInt(rv, 10, 64)
		if err != nil || min < 0 {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("invalid resourceVersion %q", rv))
		}
		wctx, cancel := context.WithTimeout(ctx, tooLargeRVWait)
		o, _, err := r.cache.Get(wctx, min, r.key(ns, name))
		cancel()
		switch {
		case err == nil:
			return o, nil
		case errors.Is(err, storage.ErrNotFound):
			return nil, r.notFound(name)
		case errors.Is(err, storage.ErrUnavailable) && ctx.Err() == nil:
			if tl := r.tooLargeRV(ctx, min); tl != nil {
				return nil, tl
			}
		default:
			return nil, err
		}
	}
	kv, _, err := r.store.Get(ctx, r.key(ns, name))
	if err != nil {
		if errors.Is(err, storage.ErrNotFound) {
			return nil, r.notFound(name)
		}
		return nil, err
	}
	return r.codec.Decode(kv.Key, kv.Value, kv.ModRevision)
}

// tooLargeRVWait is how long a read that asks for a resourceVersion the
// cache has not reached waits before kube-apiserver's 504 "Too large
// resource version" (its cacher waits 3 s).
const tooLargeRVWait = 3 * time.Second

// tooLargeRV returns kube-apiserver's 504 Timeout (cause
// ResourceVersionTooLarge, Retry-After 1) when want is newer than etcd's
// current revision, nil otherwise.
func (r *registry) tooLargeRV(ctx context.Context, want int64) error {
	cur, err := r.store.Revision(ctx)
	if err != nil || want <= cur {
		return nil
	}
	e := apierrors.NewTimeoutError(fmt.Sprintf("Too large resource version: %d, current: %d", want, cur), 1)
	e.ErrStatus.Details.Causes = []metav1.StatusCause{{Type: metav1.CauseTypeResourceVersionTooLarge, Message: "Too large resource version"}}
	return e
}

// listResult is one page of a LIST.
type listResult struct {
	items  []*storage.Object
	rev    int64
	cont   string
	remain *int64
}

type continueToken struct {
	APIVersion string `json:"v"`
	RV         int64  `json:"rv"`
	Start      string `json:"start"`
}

func encodeContinue(rv int64, lastKey, prefix string) string {
	b, _ := json.Marshal(continueToken{APIVersion: "meta.k8s.io/v1", RV: rv, Start: lastKey[len(prefix):]})
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeContinue(s, prefix string) (int64, string, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return 0, "", apierrors.NewBadRequest("continue key is not valid: " + err.Error())
	}
	var t continueToken
	// rv -1: an inconsistent continue (its revision was compacted away),
	// read at the latest revision, as upstream's tokens say it.
	if err := json.Unmarshal(b, &t); err != nil || t.APIVersion != "meta.k8s.io/v1" || t.RV == 0 || t.RV < -1 || t.Start == "" {
		return 0, "", apierrors.NewBadRequest("continue key is not valid")
	}
	return t.RV, prefix + t.Start, nil
}

// errInconsistentContinue is upstream's answer to a continue token whose
// revision was compacted away: 410 Gone carrying a token that continues
// after the same key at the latest revision (an inconsistent list).
func errInconsistentContinue(after, prefix string) error {
	e := apierrors.NewResourceExpired("The provided continue parameter is too old to display a consistent list result. " +
		"You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. " +
		"Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.")
	e.ErrStatus.ListMeta.Continue = encodeContinue(-1, after, prefix)
	return e
}

// predicate builds the selection of a LIST or WATCH, refusing unknown field
// labels with 400.
func (r *registry) predicate(ns string, opts *metav1.ListOptions) (storage.Predicate, error) {
	p := storage.Predicate{}
	if r.res.Namespaced && ns != "" {
		p.KeyPrefix = r.prefix(ns)
	}
	if opts.LabelSelector != "" {
		sel, err := labels.Parse(opts.LabelSelector)
		if err != nil {
			return p, apierrors.NewBadRequest(fmt.Sprintf("unable to parse requirement: %v", err))
		}
		p.Label = sel
	}
	if opts.FieldSelector != "" {
		sel, err := fields.ParseSelector(opts.FieldSelector)
		if err != nil {
			return p, apierrors.NewBadRequest(fmt.Sprintf("invalid field selector: %v", err))
		}
		for _, req := range sel.Requirements() {
			if !r.st.fieldLabels[req.Field] {
				return p, apierrors.NewBadRequest(fmt.Sprintf("field label not supported: %s", req.Field))
			}
		}
		p.Field = sel
	}
	return p, nil
}

// list serves a LIST. Without limit/continue it is answered from the watch
// cache (after the cache caught up with etcd's current revision unless
// resourceVersion says older data is fine); pages come from etcd at a fixed
// revision, as kube-apiserver's continue tokens do.
func (r *registry) list(ctx context.Context, ns string, opts *metav1.ListOptions) (*listResult, error) {
	p, err := r.predicate(ns, opts)
	if err != nil {
		return nil, err
	}
	var minRev int64
	if opts.ResourceVersion != "" {
		if minRev, err = strconv.ParseInt(opts.ResourceVersion, 10, 64); err != nil || minRev < 0 {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("invalid resourceVersion %q", opts.ResourceVersion))
		}
	}
	exact := opts.ResourceVersionMatch == metav1.ResourceVersionMatchExact
	if opts.Continue == "" && !exact && (opts.Limit <= 0 || opts.ResourceVersion == "0") {
		if opts.ResourceVersion == "" {
			// Consistent read: wait until the cache reflects etcd now.
			if minRev, err = r.store.Revision(ctx); err != nil {
				return nil, err
			}
		}
		wait := time.Second
		if opts.ResourceVersion != "" {
			wait = tooLargeRVWait
		}
		wctx, cancel := context.WithTimeout(ctx, wait)
		items, rev, err := r.cache.List(wctx, minRev, p)
		cancel()
		if err == nil {
			return &listResult{items: items, rev: rev}, nil
		}
		if !errors.Is(err, storage.ErrUnavailable) || ctx.Err() != nil {
			return nil, err
		}
		if opts.ResourceVersion != "" {
			if tl := r.tooLargeRV(ctx, minRev); tl != nil {
				return nil, tl
			}
		}
		// The cache did not catch up in time: read etcd itself.
		r.srv.log.Debug("watch cache behind, listing from etcd", "resource", r.res.Resource, "err", err)
	}
	prefix := r.prefix(ns)
	var rev int64
	after := ""
	if opts.Continue != "" {
		if rev, after, err = decodeContinue(opts.Continue, prefix); err != nil {
			return nil, err
		}
		if rev == -1 {
			rev = 0
		}
	} else if exact || opts.ResourceVersion != "" && opts.ResourceVersion != "0" {
		if tl := r.tooLargeRV(ctx, minRev); tl != nil {
			return nil, tl
		}
		rev = minRev
		if !exact {
			rev = 0 // NotOlderThan: the latest is not older
		}
	}
	limit := opts.Limit
	out := &listResult{}
	for {
		page, err := r.store.List(ctx, prefix, storage.ListOptions{Revision: rev, Limit: limit, After: after})
		if err != nil {
			if opts.Continue != "" && errors.Is(err, storage.ErrCompacted) {
				return nil, errInconsistentContinue(after, prefix)
			}
			return nil, err
		}
		rev = page.Revision
		for _, kv := range page.KVs {
			o, err := r.codec.Decode(kv.Key, kv.Value, kv.ModRevision)
			if err != nil {
				return nil, err
			}
			after = kv.Key
			if !p.Matches(o) {
				continue
			}
			out.items = append(out.items, o)
			if limit > 0 && int64(len(out.items)) == limit {
				break
			}
		}
		if limit > 0 && int64(len(out.items)) == limit {
			// More remains if this page stopped early or etcd has more.
			if after != page.KVs[len(page.KVs)-1].Key || page.More {
				out.cont = encodeContinue(rev, after, prefix)
				// As upstream: the count of what remains only when no
				// selector filters (then etcd's count is exact).
				if p.Label == nil && p.Field == nil && after == page.KVs[len(page.KVs)-1].Key {
					n := page.Count - int64(len(page.KVs))
					out.remain = &n
				}
			}
			break
		}
		if !page.More || limit <= 0 {
			break
		}
	}
	out.rev = rev
	return out, nil
}

// Random suffixes of generateName, as Kubernetes makes them.
const nameAlphabet = "bcdfghjklmnpqrstvwxz2456789"

func randomSuffix() string {
	b := make([]byte, 5)
	for i := range b {
		n, _ := rand.Int(rand.Reader, big.NewInt(int64(len(nameAlphabet))))
		b[i] = nameAlphabet[n.Int64()]
	}
	return string(b)
}

// writeOpts are the options common to create, update, patch and delete.
type writeOpts struct {
	dryRun bool
	// stale: the stored value was decrypted with a key that is no longer
	// the encryption configuration's first, so even an unchanged object is
	// rewritten (re-encrypted), as upstream's GuaranteedUpdate does.
	stale bool
	user  *userInfo
	// fieldValidation: "Strict", "Warn" or "Ignore".
	strictErrs []string
	// manager is the field manager the write is recorded under.
	manager string
	// applied: managedFields were already merged by a server-side apply.
	applied bool
	// fmSub names the field manager when it differs from the written
	// subresource (scale writes the parent object as a spec update).
	fmSub string
}

// trackFields records the write of obj (over old; nil for a create) in
// obj's managedFields, as kube-apiserver's handlers do before admission.
func (r *registry) trackFields(obj, old runtime.Object, sub string, wo writeOpts) runtime.Object {
	if wo.applied {
		return obj
	}
	if wo.fmSub != "" {
		sub = wo.fmSub
	}
	fm := r.fms[sub]
	if fm == nil {
		// Writes that kube-apiserver does not track (pods/binding) keep
		// the managedFields they had.
		if old != nil {
			objectMeta(obj).SetManagedFields(objectMeta(old).GetManagedFields())
		} else {
			objectMeta(obj).SetManagedFields(nil)
		}
		return obj
	}
	if old == nil {
		old = emptyLive(r.res)
	}
	manager := wo.manager
	if manager == "" {
		manager = "waggle-apiserver" // the server's own writes (bootstrap)
	}
	var out runtime.Object
	fieldManagerStacks.do(func() { out = fm.UpdateNoErrors(old, obj, manager) })
	return out
}

// emptyLive is the live object of a create for the field manager: a new
// object of the kind, with its kind set (the field manager's conversion to
// the kind's version would set it on a copy).
func emptyLive(res *catalog.Resource) runtime.Object {
	o := res.New()
	o.GetObjectKind().SetGroupVersionKind(res.GroupVersionKind())
	return o
}

type userInfo struct {
	name   string
	groups []string
}

func invalid(r *registry, name string, errs field.ErrorList) error {
	return apierrors.NewInvalid(r.res.GroupVersionKind().GroupKind(), name, errs)
}

// create stores a new object after admission, defaulting and validation.
func (r *registry) create(ctx context.Context, ns string, obj runtime.Object, wo writeOpts) (runtime.Object, error) {
	m := objectMeta(obj)
	if r.res.Namespaced {
		if m.GetNamespace() != "" && m.GetNamespace() != ns {
			return nil, apierrors.NewBadRequest("the namespace of the provided object does not match the namespace sent on the request")
		}
		m.SetNamespace(ns)
	} else {
		m.SetNamespace("")
	}
	generated := false
	if m.GetName() == "" && m.GetGenerateName() != "" {
		m.SetName(m.GetGenerateName() + randomSuffix())
		generated = true
	}
	if m.GetName() == "" {
		return nil, invalid(r, "", field.ErrorList{field.Required(field.NewPath("metadata", "name"), "name or generateName is required")})
	}
	m.SetUID(typesUID())
	m.SetCreationTimestamp(metav1.Now())
	m.SetResourceVersion("")
	m.SetDeletionTimestamp(nil)
	m.SetDeletionGracePeriodSeconds(nil)
	m.SetSelfLink("")
	if r.st.generation {
		m.SetGeneration(1)
	} else {
		m.SetGeneration(0)
	}
	if r.st.admitCreate != nil {
		if err := r.st.admitCreate(); err != nil {
			return nil, err
		}
	}
	if r.st.prepareCreate != nil {
		r.st.prepareCreate(obj)
	}
	if r.st.prepareCreateFor != nil {
		r.st.prepareCreateFor(ctx, obj)
	}
	if r.st.defaults != nil {
		r.st.defaults(obj)
	}
	obj = r.trackFields(obj, nil, "", wo)
	m = objectMeta(obj)
	if err := r.srv.admit(ctx, &AdmissionAttributes{Operation: OpCreate, Resource: r.res, Namespace: ns, Name: m.GetName(), Object: obj, DryRun: wo.dryRun}); err != nil {
		return nil, err
	}
	if errs := r.st.validateCreate(r, obj); len(errs) > 0 {
		return nil, invalid(r, m.GetName(), errs)
	}
	if err := r.srv.validate(ctx, &AdmissionAttributes{Operation: OpCreate, Resource: r.res, Namespace: ns, Name: m.GetName(), Object: obj, DryRun: wo.dryRun}); err != nil {
		return nil, err
	}
	var release func()
	if r.st.allocate != nil {
		rel, err := r.st.allocate(ctx, r.srv, obj, nil, wo.dryRun)
		if err != nil {
			return nil, err
		}
		release = rel
	}
	fail := func(err error) (runtime.Object, error) {
		if release != nil {
			release()
		}
		return nil, err
	}
	data, err := r.encode(obj)
	if err != nil {
		return fail(err)
	}
	if len(data) > MaxObjectBytes {
		return fail(tooLarge(len(data)))
	}
	if wo.dryRun {
		if release != nil {
			release()
		}
		return obj, nil
	}
	for attempt := 0; ; attempt++ {
		rev, err := r.store.Create(ctx, r.key(ns, m.GetName()), data, r.putOpts()...)
		if err == nil {
			m.SetResourceVersion(strconv.FormatInt(rev, 10))
			return obj, nil
		}
		if errors.Is(err, storage.ErrExists) && generated && attempt < 5 {
			m.SetName(m.GetGenerateName() + randomSuffix())
			if data, err = r.encode(obj); err != nil {
				return fail(err)
			}
			continue
		}
		if errors.Is(err, storage.ErrExists) {
			return fail(apierrors.NewAlreadyExists(r.gr, m.GetName()))
		}
		return fail(err)
	}
}

func tooLarge(n int) error {
	return apierrors.NewRequestEntityTooLargeError(fmt.Sprintf("object is too large: %d bytes exceeds the limit of %d bytes (1.5 MiB); nothing was stored", n, MaxObjectBytes))
}

func typesUID() types.UID { return types.UID(uuid.NewString()) }

// updateFunc computes the new object from the current one (a private deep
// copy it may modify). Returning a nil object with a nil error means
// "nothing to do".
type updateFunc func(cur runtime.Object) (runtime.Object, error)

// guaranteedUpdate reads the current object, applies fn and writes the
// result with an optimistic check, retrying on conflicts unless the caller
// pinned a resourceVersion (then a conflict is a 409).
func (r *registry) guaranteedUpdate(ctx context.Context, ns, name, sub string, wo writeOpts, fn updateFunc) (runtime.Object, error) {
	key := r.key(ns, name)
	for attempt := 0; ; attempt++ {
		kv, _, err := r.store.Get(ctx, key)
		if err != nil {
			if errors.Is(err, storage.ErrNotFound) {
				return nil, r.notFound(name)
			}
			return nil, err
		}
		cur, err := r.codec.Decode(kv.Key, kv.Value, kv.ModRevision)
		if err != nil {
			return nil, err
		}
		old := cur.Obj
		next, err := fn(old.DeepCopyObject())
		if err != nil {
			return nil, err
		}
		if next == nil {
			return old.DeepCopyObject(), nil
		}
		pinned := objectMeta(next).GetResourceVersion() != ""
		wo.stale = kv.Stale
		out, err := r.finishUpdate(ctx, ns, name, sub, old, next, kv.ModRevision, wo)
		if errors.Is(err, storage.ErrConflict) {
			if pinned || attempt > 20 {
				return nil, apierrors.NewConflict(r.gr, name, errors.New("the object has been modified; please apply your changes to the latest version and try again"))
			}
			continue
		}
		return out, err
	}
}

// finishUpdate applies the strategy to an update of old into obj and writes
// it expecting revision rev.
func (r *registry) finishUpdate(ctx context.Context, ns, name, sub string, old, obj runtime.Object, rev int64, wo writeOpts) (runtime.Object, error) {
	m, om := objectMeta(obj), objectMeta(old)
	if m.GetName() != "" && m.GetName() != name {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("the name of the object (%s) does not match the name on the URL (%s)", m.GetName(), name))
	}
	if r.res.Namespaced && m.GetNamespace() != "" && m.GetNamespace() != ns {
		return nil, apierrors.NewBadRequest("the namespace of the provided object does not match the namespace sent on the request")
	}
	if v := m.GetResourceVersion(); v != "" && v != om.GetResourceVersion() {
		return nil, apierrors.NewConflict(r.gr, name, fmt.Errorf("the object has been modified; please apply your changes to the latest version and try again"))
	}
	if uid := m.GetUID(); uid != "" && uid != om.GetUID() {
		return nil, apierrors.NewConflict(r.gr, name, fmt.Errorf("precondition failed: UID in object meta: %s, does not match the UID of the stored object: %s", uid, om.GetUID()))
	}
	// Fields the server owns.
	m.SetResourceVersion(om.GetResourceVersion())
	m.SetName(name)
	m.SetNamespace(om.GetNamespace())
	m.SetUID(om.GetUID())
	m.SetCreationTimestamp(om.GetCreationTimestamp())
	m.SetDeletionTimestamp(om.GetDeletionTimestamp())
	m.SetDeletionGracePeriodSeconds(om.GetDeletionGracePeriodSeconds())
	m.SetGeneration(om.GetGeneration())
	m.SetGenerateName(om.GetGenerateName())
	m.SetSelfLink("")
	switch sub {
	case "approval":
		// CertificateSigningRequest approval: conditions only (the
		// strategy keeps the rest of status) and metadata, as upstream's
		// csrApprovalStrategy (it does not reset metadata as status does).
		copyField(obj, old, "Spec")
	case "status":
		// Status writes change status and metadata, never spec, and not
		// the metadata fields the kind's status strategy resets.
		copyField(obj, old, "Spec")
		for _, f := range r.st.statusMetaResets {
			switch f {
			case "labels":
				m.SetLabels(om.GetLabels())
			case "annotations":
				m.SetAnnotations(om.GetAnnotations())
			case "finalizers":
				m.SetFinalizers(om.GetFinalizers())
			case "ownerReferences":
				m.SetOwnerReferences(om.GetOwnerReferences())
			}
		}
	case "":
		if r.st.hasStatus {
			copyField(obj, old, "Status")
		}
	}
	if r.st.prepareUpdate != nil {
		r.st.prepareUpdate(obj, old, sub)
	}
	if r.st.defaults != nil {
		r.st.defaults(obj)
	}
	obj = r.trackFields(obj, old, sub, wo)
	m = objectMeta(obj)
	if r.st.bumpsGeneration(obj, old, sub) {
		m.SetGeneration(om.GetGeneration() + 1)
	}
	if err := r.srv.admit(ctx, &AdmissionAttributes{Operation: OpUpdate, Resource: r.res, Subresource: sub, Namespace: ns, Name: name, Object: obj, OldObject: old, DryRun: wo.dryRun}); err != nil {
		return nil, err
	}
	if errs := r.st.validateUpdate(r, obj, old, sub); len(errs) > 0 {
		return nil, invalid(r, name, errs)
	}
	if err := r.srv.validate(ctx, &AdmissionAttributes{Operation: OpUpdate, Resource: r.res, Subresource: sub, Namespace: ns, Name: name, Object: obj, OldObject: old, DryRun: wo.dryRun}); err != nil {
		return nil, err
	}
	var release func()
	var commit func()
	if r.st.allocate != nil && sub == "" {
		rel, err := r.st.allocate(ctx, r.srv, obj, old, wo.dryRun)
		if err != nil {
			return nil, err
		}
		release = rel
		commit = func() { r.st.releaseUnused(ctx, r.srv, obj, old) }
	}
	fail := func(err error) (runtime.Object, error) {
		if release != nil {
			release()
		}
		return nil, err
	}
	// An object marked for deletion whose last finalizer went is removed.
	if m.GetDeletionTimestamp() != nil && len(m.GetFinalizers()) == 0 && r.st.removable(obj) &&
		(m.GetDeletionGracePeriodSeconds() == nil || *m.GetDeletionGracePeriodSeconds() == 0) {
		if wo.dryRun {
			return obj, nil
		}
		drev, _, err := r.store.OptimisticDelete(ctx, r.key(ns, name), rev)
		if err != nil {
			return fail(err)
		}
		r.afterDelete(ctx, obj)
		m.SetResourceVersion(strconv.FormatInt(drev, 10))
		return obj, nil
	}
	if !wo.stale && apiequality.Semantic.DeepEqual(stripRV(obj), stripRV(old)) {
		// No change: no write, no event, as kube-apiserver.
		m.SetResourceVersion(om.GetResourceVersion())
		return obj, nil
	}
	data, err := r.encode(obj)
	if err != nil {
		return fail(err)
	}
	if len(data) > MaxObjectBytes {
		return fail(tooLarge(len(data)))
	}
	if wo.dryRun {
		if release != nil {
			release()
		}
		return obj, nil
	}
	nrev, _, err := r.store.OptimisticPut(ctx, r.key(ns, name), data, rev, r.putOpts()...)
	if err != nil {
		if release != nil {
			release()
		}
		if errors.Is(err, storage.ErrNotFound) {
			return nil, r.notFound(name)
		}
		return nil, err
	}
	if commit != nil {
		commit()
	}
	m.SetResourceVersion(strconv.FormatInt(nrev, 10))
	return obj, nil
}

func stripRV(obj runtime.Object) runtime.Object {
	c := obj.DeepCopyObject()
	objectMeta(c).SetResourceVersion("")
	return c
}

// copyField copies the named top-level field (Spec, Status) from src to dst
// when the type has it.
func copyField(dst, src runtime.Object, name string) {
	d := reflect.ValueOf(dst).Elem().FieldByName(name)
	s := reflect.ValueOf(src).Elem().FieldByName(name)
	if d.IsValid() && s.IsValid() && d.CanSet() {
		d.Set(s)
	}
}

// bumpsGeneration reports whether a write of obj over old through sub
// bumps metadata.generation.
func (s *strategy) bumpsGeneration(obj, old runtime.Object, sub string) bool {
	if !s.generation || (sub != "" && !slices.Contains(s.generationSubresources, sub)) {
		return false
	}
	if !specEqual(obj, old) {
		return true
	}
	return s.generationLabels && !maps.Equal(objectMeta(obj).GetLabels(), objectMeta(old).GetLabels())
}

// specEqual compares everything but metadata and status: the fields whose
// change bumps metadata.generation.
func specEqual(a, b runtime.Object) bool {
	va, vb := reflect.ValueOf(a).Elem(), reflect.ValueOf(b).Elem()
	t := va.Type()
	for i := 0; i < t.NumField(); i++ {
		switch t.Field(i).Name {
		case "TypeMeta", "ObjectMeta", "Status":
			continue
		}
		if !apiequality.Semantic.DeepEqual(va.Field(i).Interface(), vb.Field(i).Interface()) {
			return false
		}
	}
	return true
}

// deleteObject deletes (or, with finalizers or a grace period, marks) one
// object. It returns the object as deleted or marked, and whether it is
// gone.
func (r *registry) deleteObject(ctx context.Context, ns, name string, opts *metav1.DeleteOptions, wo writeOpts) (runtime.Object, bool, error) {
	key := r.key(ns, name)
	for attempt := 0; ; attempt++ {
		kv, _, err := r.store.Get(ctx, key)
		if err != nil {
			if errors.Is(err, storage.ErrNotFound) {
				return nil, false, r.notFound(name)
			}
			return nil, false, err
		}
		cur, err := r.codec.Decode(kv.Key, kv.Value, kv.ModRevision)
		if err != nil {
			return nil, false, err
		}
		obj := cur.Obj.DeepCopyObject()
		m := objectMeta(obj)
		if err := checkPreconditions(r.gr, name, opts.Preconditions, m); err != nil {
			return nil, false, err
		}
		if err := r.srv.admit(ctx, &AdmissionAttributes{Operation: OpDelete, Resource: r.res, Namespace: ns, Name: name, OldObject: cur.Obj, DryRun: wo.dryRun}); err != nil {
			return nil, false, err
		}
		if err := r.srv.validate(ctx, &AdmissionAttributes{Operation: OpDelete, Resource: r.res, Namespace: ns, Name: name, OldObject: cur.Obj, DryRun: wo.dryRun}); err != nil {
			return nil, false, err
		}
		marked, grace := r.st.markForDeletion(obj, opts)
		if marked {
			if wo.dryRun {
				return obj, false, nil
			}
			if m.GetDeletionTimestamp() == nil || !equalTime(m, grace) {
				now := metav1.NewTime(time.Now().Add(time.Duration(grace) * time.Second))
				if ts := m.GetDeletionTimestamp(); ts == nil || now.Before(ts) {
					m.SetDeletionTimestamp(&now)
					m.SetDeletionGracePeriodSeconds(&grace)
					if r.st.generationOnDelete {
						m.SetGeneration(m.GetGeneration() + 1)
					}
				}
			}
			if apiequality.Semantic.DeepEqual(obj, cur.Obj) {
				return obj, false, nil
			}
			data, err := r.encode(obj)
			if err != nil {
				return nil, false, err
			}
			rev, _, err := r.store.OptimisticPut(ctx, key, data, kv.ModRevision, r.putOpts()...)
			if errors.Is(err, storage.ErrConflict) && attempt < 20 {
				continue
			}
			if err != nil {
				return nil, false, err
			}
			m.SetResourceVersion(strconv.FormatInt(rev, 10))
			return obj, false, nil
		}
		if wo.dryRun {
			return obj, true, nil
		}
		rev, _, err := r.store.OptimisticDelete(ctx, key, kv.ModRevision)
		if errors.Is(err, storage.ErrConflict) && attempt < 20 {
			continue
		}
		if err != nil {
			if errors.Is(err, storage.ErrNotFound) {
				return nil, false, r.notFound(name)
			}
			return nil, false, err
		}
		r.afterDelete(ctx, obj)
		m.SetResourceVersion(strconv.FormatInt(rev, 10))
		return obj, true, nil
	}
}

func equalTime(m metav1.Object, grace int64) bool {
	g := m.GetDeletionGracePeriodSeconds()
	return g != nil && *g <= grace
}

func (r *registry) afterDelete(ctx context.Context, obj runtime.Object) {
	if r.st.released != nil {
		r.st.released(ctx, r.srv, obj)
	}
}

// checkPreconditions refuses, with a 409, a write whose UID or
// resourceVersion preconditions the stored object m does not meet.
func checkPreconditions(gr schema.GroupResource, name string, pc *metav1.Preconditions, m metav1.Object) error {
	if pc == nil {
		return nil
	}
	if pc.UID != nil && *pc.UID != m.GetUID() {
		return apierrors.NewConflict(gr, name, fmt.Errorf("precondition failed: UID in precondition: %v, UID in object meta: %v", *pc.UID, m.GetUID()))
	}
	if pc.ResourceVersion != nil && *pc.ResourceVersion != m.GetResourceVersion() {
		return apierrors.NewConflict(gr, name, fmt.Errorf("precondition failed: ResourceVersion in precondition: %v, ResourceVersion in object meta: %v", *pc.ResourceVersion, m.GetResourceVersion()))
	}
	return nil
}
