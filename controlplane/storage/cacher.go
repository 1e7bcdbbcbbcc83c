package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// Object is one decoded stored object, shared read-only by the cache and
// every watcher: it is decoded and encoded once per change.
type Object struct {
	Key string
	// Rev is the object's resourceVersion (its modification revision, or
	// the deletion revision for the last state of a deleted object).
	Rev int64
	// Obj is the decoded object with resourceVersion set. Never mutate it:
	// deep-copy first.
	Obj runtime.Object
	// JSON is Obj encoded (with apiVersion, kind and resourceVersion) when
	// the codec had it at hand; nil means EncodedJSON encodes Obj on first
	// use. Read it through EncodedJSON.
	JSON []byte
	// Labels and Fields are what selectors match against.
	Labels labels.Set
	Fields fields.Set

	jsonOnce sync.Once
	json     []byte
	jsonErr  error
	altOnce  sync.Once
	alt      []byte
	altErr   error
}

// EncodedJSON returns Obj as JSON: the codec's JSON, or Obj encoded on first
// use and then shared by every reader and watcher.
func (o *Object) EncodedJSON() ([]byte, error) {
	o.jsonOnce.Do(func() {
		if o.JSON != nil {
			o.json = o.JSON
			return
		}
		o.json, o.jsonErr = json.Marshal(o.Obj)
	})
	return o.json, o.jsonErr
}

// Alternate returns Obj in a second encoding (the API server's protobuf),
// computed by enc on first use and then shared by every watcher, like JSON.
func (o *Object) Alternate(enc func(runtime.Object) ([]byte, error)) ([]byte, error) {
	o.altOnce.Do(func() { o.alt, o.altErr = enc(o.Obj) })
	return o.alt, o.altErr
}

// Codec turns stored values into Objects for the cache.
type Codec interface {
	// Decode decodes the value stored at key as of revision rev.
	Decode(key string, value []byte, rev int64) (*Object, error)
}

// Event is one change seen by the cache. Bookmark events carry only Rev.
type Event struct {
	Type watch.EventType
	Rev  int64
	// Obj is the new state (for Deleted: the last state, at the deletion
	// revision). Prev is the state before (nil for Added).
	Obj  *Object
	Prev *Object
	// InitialEventsEnd marks the bookmark that ends a streaming list's
	// initial events (WatchList).
	InitialEventsEnd bool
}

// Predicate selects objects by key prefix (a namespace), labels and fields.
// The zero value selects everything.
type Predicate struct {
	KeyPrefix string
	Label     labels.Selector
	Field     fields.Selector
}

// Matches reports whether o is selected.
func (p Predicate) Matches(o *Object) bool {
	if o == nil {
		return false
	}
	if p.KeyPrefix != "" && !strings.HasPrefix(o.Key, p.KeyPrefix) {
		return false
	}
	if p.Label != nil && !p.Label.Empty() && !p.Label.Matches(o.Labels) {
		return false
	}
	if p.Field != nil && !p.Field.Empty() && !p.Field.Matches(o.Fields) {
		return false
	}
	return true
}

// Filter maps a cache event to what a watcher with this predicate sees: a
// label change moves an object in (Added) or out (Deleted) of the selection.
// ok is false when the watcher should not see the event.
func (p Predicate) Filter(e *Event) (watch.EventType, *Object, bool) {
	switch e.Type {
	case watch.Bookmark:
		return watch.Bookmark, nil, true
	case watch.Added, watch.Deleted:
		if p.Matches(e.Obj) {
			return e.Type, e.Obj, true
		}
		return "", nil, false
	}
	cur, prev := p.Matches(e.Obj), p.Matches(e.Prev)
	switch {
	case cur && prev:
		return watch.Modified, e.Obj, true
	case cur:
		return watch.Added, e.Obj, true
	case prev:
		return watch.Deleted, e.Obj, true
	}
	return "", nil, false
}

// CacherConfig tunes a Cacher.
type CacherConfig struct {
	// Resource names the cache in logs and metrics ("pods").
	Resource string
	// Prefix is the etcd key prefix watched ("/registry/pods/").
	Prefix string
	Codec  Codec
	// History is how many recent events are kept for resuming watches
	// (default 10000).
	History int
	// WatcherBuffer is the most events a watcher may have queued; one that
	// falls further behind is closed (default 10000).
	WatcherBuffer int
	// BookmarkInterval is how often watchers get a BOOKMARK with the current
	// revision (default 5s).
	BookmarkInterval time.Duration
	Log              *slog.Logger
}

// Cacher is the watch cache of one resource: a full copy of its objects kept
// current by a single etcd watch, a window of recent events, and the set of
// watchers every event is fanned out to.
type Cacher struct {
	cfg   CacherConfig
	store *Store
	log   *slog.Logger

	mu      sync.RWMutex
	changed *sync.Cond // broadcast when rev advances or readiness changes
	ready   bool
	// listErr is why the last listing failed (nil once one succeeded).
	listErr error
	items   map[string]*Object
	rev     int64
	// history is a ring of the latest events; oldest is the revision from
	// which resuming is possible (events with Rev > oldest are all kept).
	history []*Event
	hstart  int
	hlen    int
	oldest  int64

	nextID     int
	watchers   map[int]*Watcher
	closedSlow int64
}

// NewCacher returns a cache; Run fills and maintains it.
func NewCacher(store *Store, cfg CacherConfig) *Cacher {
	if cfg.History <= 0 {
		cfg.History = 10000
	}
	if cfg.WatcherBuffer <= 0 {
		cfg.WatcherBuffer = 10000
	}
	if cfg.BookmarkInterval <= 0 {
		cfg.BookmarkInterval = 5 * time.Second
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Cacher{cfg: cfg, store: store, log: log.With("cache", cfg.Resource), watchers: map[int]*Watcher{}}
	c.changed = sync.NewCond(&c.mu)
	return c
}

// Run lists and watches until ctx ends, relisting after any watch failure.
// Every watcher is closed when Run returns.
func (c *Cacher) Run(ctx context.Context) {
	defer func() {
		c.mu.Lock()
		c.ready = false
		c.closeAllLocked()
		c.changed.Broadcast()
		c.mu.Unlock()
	}()
	stop := context.AfterFunc(ctx, func() {
		c.mu.Lock()
		c.changed.Broadcast()
		c.mu.Unlock()
	})
	defer stop()
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := c.listAndWatch(ctx)
		if ctx.Err() != nil {
			return
		}
		c.mu.Lock()
		if !c.ready {
			c.listErr = err
		}
		c.mu.Unlock()
		c.log.Warn("watch cache restarting", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		if backoff < 5*time.Second {
			backoff *= 2
		}
	}
}

func (c *Cacher) listAndWatch(ctx context.Context) error {
	items := map[string]*Object{}
	var rev int64
	after := ""
	for {
		res, err := c.store.List(ctx, c.cfg.Prefix, ListOptions{Revision: rev, Limit: 10000, After: after})
		if err != nil {
			return err
		}
		rev = res.Revision
		for _, kv := range res.KVs {
			o, err := c.cfg.Codec.Decode(kv.Key, kv.Value, kv.ModRevision)
			if err != nil {
				c.log.Error("undecodable stored object skipped", "key", kv.Key, "err", err)
				continue
			}
			items[kv.Key] = o
		}
		if !res.More || len(res.KVs) == 0 {
			break
		}
		after = res.KVs[len(res.KVs)-1].Key
	}
	c.mu.Lock()
	c.closeAllLocked() // watchers of a previous incarnation resume from their revision
	c.items = items
	c.rev = rev
	c.history = make([]*Event, c.cfg.History)
	c.hstart, c.hlen = 0, 0
	c.oldest = rev
	c.ready = true
	c.listErr = nil
	c.changed.Broadcast()
	c.mu.Unlock()
	c.log.Debug("watch cache listed", "objects", len(items), "rev", rev)

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	batches, werr := c.store.Watch(wctx, c.cfg.Prefix, rev+1)
	ticker := time.NewTicker(c.cfg.BookmarkInterval)
	defer ticker.Stop()
	for {
		select {
		case b, ok := <-batches:
			if !ok {
				c.mu.Lock()
				c.ready = false
				c.mu.Unlock()
				return werr()
			}
			c.apply(b)
		case <-ticker.C:
			// Ask etcd for a progress notification so the revision moves
			// even when this resource is quiet (one request per quarter
			// interval serves every cache: they share the stream), then
			// bookmark.
			_ = c.store.RequestProgressEvery(wctx, c.cfg.BookmarkInterval/4)
			c.bookmark()
		}
	}
}

func (c *Cacher) apply(b WatchBatch) {
	// Decode outside the lock (the expensive part, done once per change),
	// then apply and fan out atomically so that a watcher starting now sees
	// each change exactly once: either in its snapshot or as an event.
	type decoded struct {
		re  RawEvent
		obj *Object
	}
	ds := make([]decoded, 0, len(b.Events))
	for _, re := range b.Events {
		var o *Object
		var err error
		switch {
		case !re.Delete:
			o, err = c.cfg.Codec.Decode(re.KV.Key, re.KV.Value, re.KV.ModRevision)
		case re.PrevKV != nil:
			o, err = c.cfg.Codec.Decode(re.KV.Key, re.PrevKV.Value, re.KV.ModRevision)
		}
		if err != nil {
			c.log.Error("undecodable stored object skipped", "key", re.KV.Key, "err", err)
			continue
		}
		ds = append(ds, decoded{re, o})
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, d := range ds {
		key := d.re.KV.Key
		prev := c.items[key]
		var e *Event
		if d.re.Delete {
			if prev == nil {
				continue
			}
			last := d.obj
			if last == nil {
				last = prev // history compacted under us: the cached state is the best we have
			}
			e = &Event{Type: watch.Deleted, Rev: d.re.KV.ModRevision, Obj: last, Prev: prev}
			delete(c.items, key)
		} else {
			t := watch.Modified
			if prev == nil {
				t = watch.Added
			}
			e = &Event{Type: t, Rev: d.re.KV.ModRevision, Obj: d.obj, Prev: prev}
			c.items[key] = d.obj
		}
		c.push(e)
		if e.Rev > c.rev {
			c.rev = e.Rev
		}
		c.fanOutLocked(e, false)
	}
	// A response without events is a progress notification: every change
	// up to its revision has been delivered.
	if len(b.Events) == 0 && b.Revision > c.rev {
		c.rev = b.Revision
	}
	c.changed.Broadcast()
}

func (c *Cacher) push(e *Event) {
	n := len(c.history)
	if c.hlen == n {
		// Evict the oldest: resuming before it is no longer possible.
		c.oldest = c.history[c.hstart].Rev
		c.history[c.hstart] = nil
		c.hstart = (c.hstart + 1) % n
		c.hlen--
	}
	c.history[(c.hstart+c.hlen)%n] = e
	c.hlen++
}

func (c *Cacher) bookmark() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fanOutLocked(&Event{Type: watch.Bookmark, Rev: c.rev}, true)
}

// fanOutLocked offers e to every watcher without blocking. A watcher whose
// queue is full is closed (it resumes from its last revision) unless the
// event is only a bookmark, which it may miss.
func (c *Cacher) fanOutLocked(e *Event, optional bool) {
	for id, w := range c.watchers {
		if w.offer(e, c.cfg.WatcherBuffer, optional) {
			continue
		}
		c.closedSlow++
		c.log.Debug("closing slow watcher", "id", id)
		w.terminate(ErrWatchClosed)
		delete(c.watchers, id)
	}
}

func (c *Cacher) closeAllLocked() {
	for id, w := range c.watchers {
		w.terminate(ErrWatchClosed)
		delete(c.watchers, id)
	}
}

// waitLocked waits, with c.mu held, until the cache is ready and has reached
// rev (0: just ready), or ctx ends.
func (c *Cacher) waitLocked(ctx context.Context, rev int64) error {
	if c.ready && c.rev >= rev {
		return nil
	}
	if !c.ready && errors.Is(c.listErr, ErrTransform) {
		// A stored value it cannot decrypt keeps the cache from listing
		// until the key is back: do not wait, let the caller read etcd
		// (which fails only the reads that touch that value).
		return fmt.Errorf("watch cache of %s not ready (%v): %w", c.cfg.Resource, c.listErr, ErrUnavailable)
	}
	if rev > 0 {
		// Behind, typically because other resources moved the revision: ask
		// etcd for progress notifications until the cache catches up (etcd
		// ignores a request while the watch is still syncing, so repeat).
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			t := time.NewTicker(50 * time.Millisecond)
			defer t.Stop()
			for {
				_ = c.store.RequestProgress(ctx)
				select {
				case <-t.C:
				case <-stop:
					return
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	stop := context.AfterFunc(ctx, func() {
		c.mu.Lock()
		c.changed.Broadcast()
		c.mu.Unlock()
	})
	defer stop()
	for !c.ready || c.rev < rev {
		if err := ctx.Err(); err != nil {
			if !c.ready {
				return fmt.Errorf("watch cache of %s not ready: %w", c.cfg.Resource, ErrUnavailable)
			}
			return fmt.Errorf("watch cache of %s at %d, waiting for %d: %w", c.cfg.Resource, c.rev, rev, ErrUnavailable)
		}
		c.changed.Wait()
	}
	return nil
}

// ListErr returns why the cache is not ready: the error of its last
// failed listing, nil while ready or before its first listing ended.
func (c *Cacher) ListErr() error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.ready {
		return nil
	}
	return c.listErr
}

// Revision returns the revision the cache reflects.
func (c *Cacher) Revision() int64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.rev
}

// List returns the selected objects in key order and the cache revision,
// after waiting (bounded by ctx) until the cache has reached minRev.
func (c *Cacher) List(ctx context.Context, minRev int64, p Predicate) ([]*Object, int64, error) {
	c.mu.Lock()
	if err := c.waitLocked(ctx, minRev); err != nil {
		c.mu.Unlock()
		return nil, 0, err
	}
	out := make([]*Object, 0, len(c.items))
	for _, o := range c.items {
		if p.Matches(o) {
			out = append(out, o)
		}
	}
	rev := c.rev
	c.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, rev, nil
}

// Get returns the cached object at key, after the cache reached minRev.
func (c *Cacher) Get(ctx context.Context, minRev int64, key string) (*Object, int64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.waitLocked(ctx, minRev); err != nil {
		return nil, 0, err
	}
	o := c.items[key]
	if o == nil {
		return nil, c.rev, fmt.Errorf("get %s: %w", key, ErrNotFound)
	}
	return o, c.rev, nil
}

// Watchers returns the number of open watchers.
func (c *Cacher) Watchers() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.watchers)
}

// SlowClosed returns how many watchers were closed for falling behind.
func (c *Cacher) SlowClosed() int64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.closedSlow
}

// Watch starts a watcher. from is the resourceVersion to resume after; with
// from == 0 the watcher first gets the current selected state as Added
// events. A from older than the cache's window gives *CompactedError (410);
// a from ahead of the cache waits (bounded by ctx) for the cache to reach it.
func (c *Cacher) Watch(ctx context.Context, from int64, p Predicate) (*Watcher, error) {
	return c.watch(ctx, from, from, p, false)
}

// WatchList starts a streaming list (sendInitialEvents=true): once the
// cache has reached minRev, the current selected state as Added events,
// then a bookmark marked InitialEventsEnd at the state's revision, then
// every later change.
func (c *Cacher) WatchList(ctx context.Context, minRev int64, p Predicate) (*Watcher, error) {
	return c.watch(ctx, minRev, 0, p, true)
}

// WatchFromNow starts a watcher that gets only changes after the cache's
// current revision (sendInitialEvents=false), once it reached minRev.
func (c *Cacher) WatchFromNow(ctx context.Context, minRev int64, p Predicate) (*Watcher, error) {
	return c.watch(ctx, minRev, -1, p, false)
}

func (c *Cacher) watch(ctx context.Context, minRev, from int64, p Predicate, endMarker bool) (*Watcher, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.waitLocked(ctx, minRev); err != nil {
		return nil, err
	}
	if from < 0 {
		from = c.rev
	}
	w := newWatcher(c, p)
	if from == 0 {
		keys := make([]string, 0, len(c.items))
		for k, o := range c.items {
			if p.Matches(o) {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		w.initial = make([]*Event, len(keys))
		for i, k := range keys {
			o := c.items[k]
			w.initial[i] = &Event{Type: watch.Added, Rev: o.Rev, Obj: o}
		}
		if endMarker {
			w.initial = append(w.initial, &Event{Type: watch.Bookmark, Rev: c.rev, InitialEventsEnd: true})
		}
	} else {
		if from < c.oldest {
			return nil, &CompactedError{Requested: from, Compacted: c.oldest}
		}
		n := len(c.history)
		for i := 0; i < c.hlen; i++ {
			e := c.history[(c.hstart+i)%n]
			if e.Rev > from {
				w.initial = append(w.initial, e)
			}
		}
	}
	w.id = c.nextID
	c.nextID++
	c.watchers[w.id] = w
	return w, nil
}

// WatchFromStore serves a watch that resumes before the cache's window
// straight from etcd: events after from, decoded for this watcher alone.
// etcd's own compaction is the limit; a compacted from ends the watcher
// with a *CompactedError (410 for the client).
func (c *Cacher) WatchFromStore(ctx context.Context, from int64, p Predicate) *Watcher {
	wctx, cancel := context.WithCancel(ctx)
	w := newWatcher(c, p)
	w.id, w.cancel = -1, cancel
	batches, werr := c.store.Watch(wctx, c.cfg.Prefix, from+1)
	go func() {
		defer cancel()
		for b := range batches {
			for _, re := range b.Events {
				var e *Event
				var prev *Object
				if re.PrevKV != nil {
					prev, _ = c.cfg.Codec.Decode(re.KV.Key, re.PrevKV.Value, re.PrevKV.ModRevision)
				}
				switch {
				case re.Delete && re.PrevKV != nil:
					last, err := c.cfg.Codec.Decode(re.KV.Key, re.PrevKV.Value, re.KV.ModRevision)
					if err != nil {
						continue
					}
					e = &Event{Type: watch.Deleted, Rev: re.KV.ModRevision, Obj: last, Prev: prev}
				case re.Delete:
					continue
				default:
					o, err := c.cfg.Codec.Decode(re.KV.Key, re.KV.Value, re.KV.ModRevision)
					if err != nil {
						continue
					}
					t := watch.Modified
					if re.KV.CreateRevision == re.KV.ModRevision {
						t = watch.Added
					}
					e = &Event{Type: t, Rev: re.KV.ModRevision, Obj: o, Prev: prev}
				}
				// A dedicated etcd watch: waiting for the client here
				// slows no one else.
				for !w.offer(e, c.cfg.WatcherBuffer, false) {
					select {
					case <-w.space:
					case <-wctx.Done():
						w.terminate(nil)
						return
					}
				}
			}
		}
		err := werr()
		if err == nil {
			err = ErrWatchClosed
		}
		w.terminate(err)
	}()
	return w
}

// Watcher receives the events of one watch. Call Stop when done.
//
// Its queue is appended to by the cache without ever blocking; a watcher
// whose queue exceeds the limit is closed instead, so one slow client never
// delays the others, and bursts (one etcd response may carry many events)
// do not close clients that keep up.
type Watcher struct {
	cancel  context.CancelFunc
	id      int
	c       *Cacher
	pred    Predicate
	initial []*Event

	qmu    sync.Mutex
	q      []*Event
	notify chan struct{} // capacity 1: "the queue is not empty"
	space  chan struct{} // capacity 1: "an event was taken"

	once sync.Once
	done chan struct{}
	err  error
}

func newWatcher(c *Cacher, p Predicate) *Watcher {
	return &Watcher{c: c, pred: p, notify: make(chan struct{}, 1), space: make(chan struct{}, 1), done: make(chan struct{})}
}

// offer queues e; it reports false when the queue is over limit (the
// caller closes the watcher). Optional events (bookmarks) are dropped
// rather than counted against the limit.
func (w *Watcher) offer(e *Event, limit int, optional bool) bool {
	w.qmu.Lock()
	if len(w.q) >= limit {
		w.qmu.Unlock()
		return optional
	}
	w.q = append(w.q, e)
	w.qmu.Unlock()
	select {
	case w.notify <- struct{}{}:
	default:
	}
	return true
}

func (w *Watcher) pop() *Event {
	w.qmu.Lock()
	defer w.qmu.Unlock()
	if len(w.q) == 0 {
		return nil
	}
	e := w.q[0]
	select {
	case w.space <- struct{}{}:
	default:
	}
	w.q[0] = nil
	w.q = w.q[1:]
	if len(w.q) == 0 {
		w.q = nil // let the backing array go
	}
	return e
}

func (w *Watcher) terminate(err error) {
	w.once.Do(func() { w.err = err; close(w.done) })
}

// Stop unregisters the watcher.
func (w *Watcher) Stop() {
	if w.cancel != nil {
		w.cancel()
	} else {
		w.c.mu.Lock()
		delete(w.c.watchers, w.id)
		w.c.mu.Unlock()
	}
	w.terminate(nil)
}

// Next returns the next event the watcher's predicate lets through (with the
// event type as this watcher sees it), blocking until one arrives. It
// returns an error when the watcher was closed (ErrWatchClosed: too slow or
// cache restart; *CompactedError), stopped, or ctx ended; events queued
// before a close are delivered first. wait=false returns (nil, "", nil)
// instead of blocking when nothing is queued.
func (w *Watcher) Next(ctx context.Context, wait bool) (*Event, watch.EventType, error) {
	for {
		var e *Event
		if len(w.initial) > 0 {
			e, w.initial = w.initial[0], w.initial[1:]
		} else {
			for e == nil {
				if e = w.pop(); e != nil {
					break
				}
				select {
				case <-w.done:
					if e = w.pop(); e != nil {
						continue
					}
					if w.err != nil {
						return nil, "", w.err
					}
					return nil, "", errors.New("watch stopped")
				default:
				}
				if !wait {
					return nil, "", nil
				}
				select {
				case <-w.notify:
				case <-w.done:
				case <-ctx.Done():
					return nil, "", ctx.Err()
				}
			}
		}
		t, _, ok := w.pred.Filter(e)
		if ok {
			return e, t, nil
		}
	}
}

// Done is closed when the watcher is closed or stopped.
func (w *Watcher) Done() <-chan struct{} { return w.done }
