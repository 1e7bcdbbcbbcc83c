package apiserver_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// recorder checks an informer's event stream: per pod, resourceVersions
// never go back, every add/delete is seen once, and what it holds at the end
// is exactly what is stored.
type recorder struct {
	mu        sync.Mutex
	lastRV    map[string]int64
	adds      map[string]int
	deletes   map[string]int
	backwards []string
}

func newRecorder() *recorder {
	return &recorder{lastRV: map[string]int64{}, adds: map[string]int{}, deletes: map[string]int{}}
}

func rvOf(p *corev1.Pod) int64 { n, _ := strconv.ParseInt(p.ResourceVersion, 10, 64); return n }

func (r *recorder) see(p *corev1.Pod) {
	k := p.Namespace + "/" + p.Name
	if rv := rvOf(p); rv < r.lastRV[k] {
		r.backwards = append(r.backwards, fmt.Sprintf("%s: %d after %d", k, rv, r.lastRV[k]))
	} else {
		r.lastRV[k] = rv
	}
}

func (r *recorder) handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			r.mu.Lock()
			defer r.mu.Unlock()
			p := obj.(*corev1.Pod)
			r.adds[p.Name]++
			r.see(p)
		},
		UpdateFunc: func(_, obj any) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.see(obj.(*corev1.Pod))
		},
		DeleteFunc: func(obj any) {
			r.mu.Lock()
			defer r.mu.Unlock()
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			p := obj.(*corev1.Pod)
			r.deletes[p.Name]++
		},
	}
}

// TestInformerConvergesAcrossRestartAndCompaction drives thousands of pod
// creates, updates and deletes through a client-go SharedInformerFactory
// while the API server restarts twice and etcd is compacted (the informer
// must relist on 410), then checks the informer holds exactly the stored
// state and saw every change once, in order.
func TestInformerConvergesAcrossRestartAndCompaction(t *testing.T) {
	testutil.Privileged(t)
	srv := apiservertest.Start(t, apiservertest.Options{})
	addr := srv.Addr().String()
	dir := srv.DataDir
	cs, err := kubernetes.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	factory := informers.NewSharedInformerFactory(cs, 0)
	inf := factory.Core().V1().Pods().Informer()
	rec := newRecorder()
	if _, err := inf.AddEventHandler(rec.handler()); err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("informer did not sync")
	}

	const n = 1500
	created := map[string]bool{}
	var createdMu sync.Mutex
	run := func(from, to int, op func(i int) error) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, to-from)
		sem := make(chan struct{}, 16)
		for i := from; i < to; i++ {
			wg.Add(1)
			sem <- struct{}{}
			go func(i int) {
				defer wg.Done()
				defer func() { <-sem }()
				for attempt := 0; ; attempt++ {
					err := op(i)
					if err == nil || attempt > 50 {
						if err != nil {
							errs <- err
						}
						return
					}
					time.Sleep(100 * time.Millisecond) // server restarting
				}
			}(i)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	pods := func() interface {
		Create(context.Context, *corev1.Pod, metav1.CreateOptions) (*corev1.Pod, error)
	} {
		return cs.CoreV1().Pods("default")
	}
	create := func(i int) error {
		name := fmt.Sprintf("p-%05d", i)
		_, err := pods().Create(ctx, pod(name, map[string]string{"i": strconv.Itoa(i)}), metav1.CreateOptions{})
		if err != nil && !isExists(err) {
			return err
		}
		createdMu.Lock()
		created[name] = true
		createdMu.Unlock()
		return nil
	}
	update := func(i int) error {
		p, err := cs.CoreV1().Pods("default").Get(ctx, fmt.Sprintf("p-%05d", i), metav1.GetOptions{})
		if err != nil {
			return err
		}
		p.Labels["updated"] = "yes"
		_, err = cs.CoreV1().Pods("default").Update(ctx, p, metav1.UpdateOptions{})
		return err
	}
	del := func(i int) error {
		err := cs.CoreV1().Pods("default").Delete(ctx, fmt.Sprintf("p-%05d", i), metav1.DeleteOptions{})
		if isNotFound(err) {
			return nil
		}
		return err
	}

	run(0, n/2, create)
	run(0, n/4, update)

	// Restart the server on the same address and data.
	srv.Stop()
	srv = apiservertest.Start(t, apiservertest.Options{DataDir: dir, Addr: addr})
	run(n/2, n, create)
	run(n/4, n/2, update)
	run(0, n/8, del)

	// Compact etcd to now and restart again: the informer's
	// resourceVersion is gone and it must relist.
	rev, err := srv.Store().Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Store().Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	srv = apiservertest.Start(t, apiservertest.Options{DataDir: dir, Addr: addr})
	run(n/8, n/4, del)
	run(n/2, 3*n/4, update)

	// Converge: the informer must reach exactly the stored state.
	want, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantRV := map[string]string{}
	for _, p := range want.Items {
		wantRV[p.Name] = p.ResourceVersion
	}
	// The informer may be backing off after the restarts and the 410
	// before it relists; the deadline only bounds a hang (with no resync
	// period, a lost event never converges however long one waits). A
	// loaded CI machine once missed 60 s here with one deleted pod still
	// in the store.
	deadline := time.Now().Add(180 * time.Second)
	for {
		got := map[string]string{}
		for _, o := range inf.GetStore().List() {
			p := o.(*corev1.Pod)
			got[p.Name] = p.ResourceVersion
		}
		diff := 0
		for k, v := range wantRV {
			if got[k] != v {
				diff++
			}
		}
		diff += len(got) - len(wantRV)
		if diff == 0 && len(got) == len(wantRV) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("informer did not converge: %d pods differ (have %d, want %d)", diff, len(got), len(wantRV))
		}
		time.Sleep(100 * time.Millisecond) // poll interval of the convergence check (bounded by the deadline)
	}
	if len(wantRV) != n-n/4 {
		t.Fatalf("stored pods = %d, want %d", len(wantRV), n-n/4)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.backwards) > 0 {
		t.Fatalf("resourceVersion went back for %d pods, e.g. %s", len(rec.backwards), rec.backwards[0])
	}
	for name := range created {
		if rec.adds[name] != 1 {
			t.Errorf("%s added %d times", name, rec.adds[name])
		}
	}
	for i := 0; i < n/4; i++ {
		name := fmt.Sprintf("p-%05d", i)
		if rec.deletes[name] != 1 {
			t.Errorf("%s deleted %d times", name, rec.deletes[name])
		}
	}
	for name, c := range rec.deletes {
		if _, still := wantRV[name]; still {
			t.Errorf("%s seen deleted %d times but exists", name, c)
		}
	}
}
