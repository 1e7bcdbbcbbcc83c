package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/waggle-io/waggle/internal/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
)

func obj(key string, lbl map[string]string) *Object {
	return &Object{Key: key, Labels: labels.Set(lbl), Fields: fields.Set{"metadata.name": key}}
}

func TestPredicateFilterMovesObjectsInAndOutOfSelection(t *testing.T) {
	sel := Predicate{Label: labels.SelectorFromSet(labels.Set{"app": "x"})}
	in, out := obj("/r/ns/a", map[string]string{"app": "x"}), obj("/r/ns/a", map[string]string{"app": "y"})
	cases := []struct {
		name   string
		pred   Predicate
		event  *Event
		want   watch.EventType
		wantOK bool
	}{
		{"added and selected", sel, &Event{Type: watch.Added, Obj: in}, watch.Added, true},
		{"added not selected", sel, &Event{Type: watch.Added, Obj: out}, "", false},
		{"modified stays in", sel, &Event{Type: watch.Modified, Obj: in, Prev: in}, watch.Modified, true},
		{"modified moves in", sel, &Event{Type: watch.Modified, Obj: in, Prev: out}, watch.Added, true},
		{"modified moves out", sel, &Event{Type: watch.Modified, Obj: out, Prev: in}, watch.Deleted, true},
		{"modified stays out", sel, &Event{Type: watch.Modified, Obj: out, Prev: out}, "", false},
		{"deleted selected", sel, &Event{Type: watch.Deleted, Obj: in, Prev: in}, watch.Deleted, true},
		{"deleted not selected", sel, &Event{Type: watch.Deleted, Obj: out, Prev: out}, "", false},
		{"namespace prefix excludes", Predicate{KeyPrefix: "/r/other/"}, &Event{Type: watch.Added, Obj: in}, "", false},
		{"field selector", Predicate{Field: fields.OneTermEqualSelector("metadata.name", "/r/ns/a")}, &Event{Type: watch.Added, Obj: in}, watch.Added, true},
		{"bookmark always passes", sel, &Event{Type: watch.Bookmark, Rev: 5}, watch.Bookmark, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, _, ok := tc.pred.Filter(tc.event)
			if got != tc.want || ok != tc.wantOK {
				t.Fatalf("Filter = %q %v, want %q %v", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

func TestCompactedErrorIsErrCompacted(t *testing.T) {
	err := fmt.Errorf("watch: %w", &CompactedError{Requested: 3, Compacted: 9})
	if !errors.Is(err, ErrCompacted) {
		t.Fatal("CompactedError must match ErrCompacted")
	}
}

// podCodec is a minimal Codec for the cache tests.
type podCodec struct{}

func (podCodec) Decode(key string, value []byte, rev int64) (*Object, error) {
	var p corev1.Pod
	if err := json.Unmarshal(value, &p); err != nil {
		return nil, err
	}
	p.ResourceVersion = fmt.Sprint(rev)
	b, _ := json.Marshal(&p)
	return &Object{Key: key, Rev: rev, Obj: &p, JSON: b, Labels: labels.Set(p.Labels), Fields: fields.Set{"metadata.name": p.Name}}, nil
}

func openStore(t *testing.T) *Store {
	t.Helper()
	testutil.Privileged(t)
	s, err := Open(context.Background(), withTLS(t, t.TempDir(), Config{UnsafeNoFsync: true}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func podJSON(name string) []byte {
	b, _ := json.Marshal(&corev1.Pod{ObjectMeta: metaName(name)})
	return b
}

func TestStoreOptimisticWrites(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	rev, err := s.Create(ctx, "/registry/pods/ns/a", podJSON("a"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, "/registry/pods/ns/a", podJSON("a")); !errors.Is(err, ErrExists) {
		t.Fatalf("create twice: %v", err)
	}
	rev2, _, err := s.OptimisticPut(ctx, "/registry/pods/ns/a", podJSON("a2"), rev)
	if err != nil {
		t.Fatal(err)
	}
	if _, cur, err := s.OptimisticPut(ctx, "/registry/pods/ns/a", podJSON("stale"), rev); !errors.Is(err, ErrConflict) || cur.ModRevision != rev2 {
		t.Fatalf("stale put: %v %+v", err, cur)
	}
	kv, _, err := s.Get(ctx, "/registry/pods/ns/a")
	if err != nil || !strings.Contains(string(kv.Value), "a2") {
		t.Fatalf("stale put overwrote: %s %v", kv.Value, err)
	}
	if _, _, err := s.OptimisticDelete(ctx, "/registry/pods/ns/a", rev); !errors.Is(err, ErrConflict) {
		t.Fatalf("stale delete: %v", err)
	}
	if _, _, err := s.OptimisticDelete(ctx, "/registry/pods/ns/a", rev2); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.OptimisticPut(ctx, "/registry/pods/ns/a", podJSON("x"), rev2); !errors.Is(err, ErrNotFound) {
		t.Fatalf("put of a deleted key: %v", err)
	}
	for i := 0; i < 5; i++ {
		if _, err := s.Create(ctx, fmt.Sprintf("/registry/pods/ns/p%d", i), podJSON("p")); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := s.Count(ctx, "/registry/pods/"); err != nil || n != 5 {
		t.Fatalf("count = %d %v", n, err)
	}
	page, err := s.List(ctx, "/registry/pods/", ListOptions{Limit: 2})
	if err != nil || len(page.KVs) != 2 || !page.More {
		t.Fatalf("page 1: %+v %v", page, err)
	}
	page2, err := s.List(ctx, "/registry/pods/", ListOptions{Limit: 10, After: page.KVs[1].Key, Revision: page.Revision})
	if err != nil || len(page2.KVs) != 3 || page2.More || page2.KVs[0].Key != "/registry/pods/ns/p2" {
		t.Fatalf("page 2: %+v %v", page2, err)
	}
	cur, _ := s.Revision(ctx)
	if err := s.Compact(ctx, cur); err != nil {
		t.Fatal(err)
	}
	if _, err := s.List(ctx, "/registry/pods/", ListOptions{Revision: page.Revision - 1}); !errors.Is(err, ErrCompacted) {
		t.Fatalf("list at a compacted revision: %v", err)
	}
}

func startCache(t *testing.T, s *Store, buffer int) *Cacher {
	t.Helper()
	c := NewCacher(s, CacherConfig{Resource: "pods", Prefix: "/registry/pods/", Codec: podCodec{}, WatcherBuffer: buffer, History: 100, BookmarkInterval: 200 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return c
}

func TestCacherSlowWatcherIsClosedWithoutSlowingOthers(t *testing.T) {
	s := openStore(t)
	c := startCache(t, s, 100)
	ctx := context.Background()
	slow, err := c.Watch(ctx, 0, Predicate{})
	if err != nil {
		t.Fatal(err)
	}
	fast, err := c.Watch(ctx, 0, Predicate{})
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan int, 1000)
	go func() {
		n := 0
		for {
			e, _, err := fast.Next(ctx, true)
			if err != nil {
				close(seen)
				return
			}
			if e.Type == watch.Added {
				n++
				seen <- n
			}
		}
	}()
	// Batches of 50, each consumed by the fast watcher before the next:
	// its queue never holds more than 50 (limit 100), whatever the timing,
	// while the slow one, reading nothing, passes the limit.
	n := 0
	for batch := 0; batch < 6; batch++ {
		for i := 0; i < 50; i++ {
			if _, err := s.Create(ctx, fmt.Sprintf("/registry/pods/ns/p%03d", batch*50+i), podJSON("p")); err != nil {
				t.Fatal(err)
			}
		}
		for n < (batch+1)*50 {
			select {
			case got, ok := <-seen:
				if !ok {
					t.Fatalf("the fast watcher was closed after %d events", n)
				}
				n = got
			case <-time.After(30 * time.Second):
				t.Fatalf("the fast watcher is stuck at %d events", n)
			}
		}
	}
	select {
	case <-slow.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the slow watcher was not closed")
	}
	// It still drains what was queued, then reports the close.
	var err2 error
	for err2 == nil {
		_, _, err2 = slow.Next(ctx, true)
	}
	if !errors.Is(err2, ErrWatchClosed) {
		t.Fatalf("slow watcher error = %v", err2)
	}
	if c.SlowClosed() != 1 {
		t.Fatalf("SlowClosed = %d", c.SlowClosed())
	}
}

func TestCacherResumesFromHistoryAndExpiresOldRevisions(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	first, _ := s.Create(ctx, "/registry/pods/ns/before", podJSON("before"))
	c := startCache(t, s, 100)
	items, rev, err := c.List(ctx, first, Predicate{})
	if err != nil || len(items) != 1 {
		t.Fatalf("list: %d %v", len(items), err)
	}
	var revs []int64
	for i := 0; i < 150; i++ {
		r, err := s.Create(ctx, fmt.Sprintf("/registry/pods/ns/p%03d", i), podJSON("p"))
		if err != nil {
			t.Fatal(err)
		}
		revs = append(revs, r)
	}
	if _, _, err := c.List(ctx, revs[len(revs)-1], Predicate{}); err != nil {
		t.Fatal(err)
	}
	// The window keeps the last 100 events: resuming at rev (before all
	// 150) is too old, resuming at the 120th works and replays the rest.
	var ce *CompactedError
	if _, err := c.Watch(ctx, rev, Predicate{}); !errors.As(err, &ce) {
		t.Fatalf("resume before the window: %v", err)
	}
	// ... but etcd still has that history: the store-backed watcher
	// resumes there, with the right event types.
	old := c.WatchFromStore(ctx, rev, Predicate{})
	for i := 0; i < 150; i++ {
		e, typ, err := old.Next(ctx, true)
		if err != nil || e.Rev != revs[i] || typ != watch.Added {
			t.Fatalf("store watcher event %d: %+v %s %v", i, e, typ, err)
		}
	}
	old.Stop()
	if err := s.Compact(ctx, revs[10]); err != nil {
		t.Fatal(err)
	}
	gone := c.WatchFromStore(ctx, rev, Predicate{})
	if _, _, err := gone.Next(ctx, true); !errors.As(err, &ce) {
		t.Fatalf("store watcher from a compacted revision: %v", err)
	}
	w, err := c.Watch(ctx, revs[119], Predicate{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for i := 120; i < 150; i++ {
		e, _, err := w.Next(ctx, true)
		if err != nil || e.Rev != revs[i] {
			t.Fatalf("event %d: %+v %v", i, e, err)
		}
	}
	// Bookmarks carry the current revision when nothing happens.
	for {
		e, typ, err := w.Next(ctx, true)
		if err != nil {
			t.Fatal(err)
		}
		if typ == watch.Bookmark {
			if e.Rev < revs[149] {
				t.Fatalf("bookmark at %d, behind %d", e.Rev, revs[149])
			}
			break
		}
	}
}

func metaName(n string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: n} }

func TestCacherCatchesUpWithRevisionsOfOtherResources(t *testing.T) {
	s := openStore(t)
	c := NewCacher(s, CacherConfig{Resource: "pods", Prefix: "/registry/pods/", Codec: podCodec{}, BookmarkInterval: time.Hour})
	rctx, rcancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(rctx); close(done) }()
	t.Cleanup(func() { rcancel(); <-done })
	ctx := context.Background()
	if _, _, err := c.List(ctx, 0, Predicate{}); err != nil {
		t.Fatal(err)
	}
	// Writes elsewhere move etcd's revision; the quiet pods cache must
	// reach it through a requested progress notification (the periodic
	// one is an hour away).
	var rev int64
	for i := 0; i < 3; i++ {
		r, err := s.Create(ctx, fmt.Sprintf("/registry/configmaps/ns/c%d", i), []byte("{}"))
		if err != nil {
			t.Fatal(err)
		}
		rev = r
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, got, err := c.List(cctx, rev, Predicate{}); err != nil || got < rev {
		t.Fatalf("consistent list at %d: got %d, %v", rev, got, err)
	}
}

// Quiet caches of one store share its etcd watch stream and its progress
// requests (one per quarter bookmark interval, whichever cache's tick asks):
// each of them must still see the revision that writes elsewhere reached,
// in its own watchers' bookmarks.
func TestQuietCachesShareProgressRequests(t *testing.T) {
	s := openStore(t)
	ctx := context.Background()
	var caches []*Cacher
	for i := 0; i < 8; i++ {
		res := fmt.Sprintf("quiet%d", i)
		c := NewCacher(s, CacherConfig{Resource: res, Prefix: "/registry/" + res + "/", Codec: podCodec{}, BookmarkInterval: 200 * time.Millisecond})
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { c.Run(rctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		caches = append(caches, c)
	}
	var watchers []*Watcher
	for _, c := range caches {
		w, err := c.WatchFromNow(ctx, 0, Predicate{})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		watchers = append(watchers, w)
	}
	var rev int64
	for i := 0; i < 3; i++ {
		r, err := s.Create(ctx, fmt.Sprintf("/registry/configmaps/ns/c%d", i), []byte("{}"))
		if err != nil {
			t.Fatal(err)
		}
		rev = r
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for i, w := range watchers {
		for {
			e, typ, err := w.Next(wctx, true)
			if err != nil {
				t.Fatalf("cache %d: no bookmark at %d: %v", i, rev, err)
			}
			if typ == watch.Bookmark && e.Rev >= rev {
				break
			}
		}
	}
}
