package ctrlutil

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
)

func TestSlowStartBatchGrowsBatchesAndStopsAfterAFailedBatch(t *testing.T) {
	tests := []struct {
		name      string
		count     int
		failAfter int64 // calls beyond this fail; -1 never
		wantDone  int
		wantCalls int64
		wantErr   bool
	}{
		{"all succeed", 10, -1, 10, 10, false},
		{"zero", 0, -1, 0, 0, false},
		// Batches 1, 2, 4: the third batch has failures, the fourth never runs.
		{"stops after the failing batch", 20, 4, 4, 7, true},
		{"first call fails", 5, 0, 0, 1, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int64
			done, err := SlowStartBatch(tc.count, 1, func() error {
				if n := calls.Add(1); tc.failAfter >= 0 && n > tc.failAfter {
					return errors.New("quota exceeded")
				}
				return nil
			})
			if done != tc.wantDone || calls.Load() != tc.wantCalls || (err != nil) != tc.wantErr {
				t.Fatalf("done=%d calls=%d err=%v; want done=%d calls=%d err=%v", done, calls.Load(), err, tc.wantDone, tc.wantCalls, tc.wantErr)
			}
		})
	}
}

func TestExpectationsBlockUntilObservedOrExpired(t *testing.T) {
	e := NewExpectations()
	now := time.Unix(1000, 0)
	e.now = func() time.Time { return now }
	if !e.Satisfied("k") {
		t.Fatal("no expectations must be satisfied")
	}
	e.ExpectCreations("k", 2)
	e.ExpectDeletions("k", []string{"ns/a"})
	for _, step := range []struct {
		do   func()
		want bool
	}{
		{func() {}, false},
		{func() { e.CreationObserved("k") }, false},
		{func() { e.CreationObserved("k") }, false},
		{func() { e.DeletionObserved("k", "ns/other") }, false},
		{func() { e.DeletionObserved("k", "ns/a") }, true},
	} {
		step.do()
		if got := e.Satisfied("k"); got != step.want {
			adds, dels := e.Pending("k")
			t.Fatalf("satisfied=%v with %d adds, %d deletions pending", got, adds, dels)
		}
	}
	e.ExpectCreations("k", 1)
	now = now.Add(ExpectationsTimeout + time.Second)
	if !e.Satisfied("k") {
		t.Fatal("expired expectations must not block forever")
	}
}

func TestClaimAdoptsReleasesAndLeavesOthersAlone(t *testing.T) {
	owner := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "owner", Namespace: "ns", UID: "owner"}}
	other := metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: "x", UID: "x", Controller: ptrTrue()}
	mine := NewControllerRef(owner, "v1", "Pod")
	mk := func(name string, lbl string, ref *metav1.OwnerReference) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name), Labels: map[string]string{"app": lbl}}}
		if ref != nil {
			p.OwnerReferences = []metav1.OwnerReference{*ref}
		}
		return p
	}
	objs := []*corev1.Pod{
		mk("orphan-match", "a", nil),
		mk("orphan-nomatch", "b", nil),
		mk("mine-match", "a", &mine),
		mk("mine-nomatch", "b", &mine),
		mk("theirs", "a", &other),
	}
	// The patches are applied as the API server applies them (strategic
	// merge, ownerReferences merged by uid) to the objects above.
	updated := map[string]*corev1.Pod{}
	byName := map[string]*corev1.Pod{}
	for _, o := range objs {
		byName[o.Name] = o
	}
	var rechecks atomic.Int32
	cl := &Claimer[*corev1.Pod]{
		Owner: owner, APIVersion: "v1", Kind: "Pod", Selector: labels.SelectorFromSet(labels.Set{"app": "a"}),
		CanAdopt: func(context.Context) error { rechecks.Add(1); return nil },
		Patch: func(_ context.Context, name string, patch []byte) error {
			orig, err := json.Marshal(byName[name])
			if err != nil {
				return err
			}
			merged, err := strategicpatch.StrategicMergePatch(orig, patch, &corev1.Pod{})
			if err != nil {
				return err
			}
			var p corev1.Pod
			if err := json.Unmarshal(merged, &p); err != nil {
				return err
			}
			if p.UID != byName[name].UID {
				return fmt.Errorf("patch of %s changed its uid to %s", name, p.UID)
			}
			updated[name] = &p
			return nil
		},
		Copy: func(p *corev1.Pod) *corev1.Pod { return p.DeepCopy() },
	}
	claimed, err := cl.Claim(context.Background(), objs)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range claimed {
		names = append(names, p.Name)
	}
	if len(names) != 2 || names[0] != "orphan-match" || names[1] != "mine-match" {
		t.Fatalf("claimed %v", names)
	}
	if ref := metav1.GetControllerOf(updated["orphan-match"]); ref == nil || ref.UID != "owner" {
		t.Fatal("orphan not adopted")
	}
	if refs := updated["orphan-match"].OwnerReferences; len(refs) != 1 || !reflect.DeepEqual(refs[0], mine) {
		t.Fatalf("adopted orphan's references: %+v, want exactly %+v", refs, mine)
	}
	if len(updated["mine-nomatch"].OwnerReferences) != 0 {
		t.Fatal("non-matching pod not released")
	}
	if _, ok := updated["theirs"]; ok {
		t.Fatal("another controller's pod was touched")
	}
	if rechecks.Load() != 1 {
		t.Fatalf("owner rechecked %d times, want once", rechecks.Load())
	}
	// An owner that cannot adopt (deleted, replaced) adopts nothing.
	cl.CanAdopt = func(context.Context) error { return errors.New("owner is being deleted") }
	updated = map[string]*corev1.Pod{}
	if _, err := cl.Claim(context.Background(), objs[:1]); err == nil || len(updated) != 0 {
		t.Fatalf("adopted despite the recheck failing (err %v)", err)
	}
}

func ptrTrue() *bool { b := true; return &b }

func TestResolveControllerNeedsKindAndUID(t *testing.T) {
	owner := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "rs", UID: "u1"}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p",
		OwnerReferences: []metav1.OwnerReference{NewControllerRef(owner, "apps/v1", "ReplicaSet")}}}
	get := func(cur *appsv1.ReplicaSet) func(ns, name string) (*appsv1.ReplicaSet, error) {
		return func(ns, name string) (*appsv1.ReplicaSet, error) {
			if ns != "ns" || name != "rs" {
				t.Fatalf("looked up %s/%s", ns, name)
			}
			return cur, nil
		}
	}
	if got, ok := ResolveController(pod, "ReplicaSet", get(owner)); !ok || got != owner {
		t.Fatalf("same UID: %v %v", got, ok)
	}
	reborn := owner.DeepCopy()
	reborn.UID = "u2"
	if _, ok := ResolveController(pod, "ReplicaSet", get(reborn)); ok {
		t.Fatal("a same-named owner with another UID was taken for the controller")
	}
	if _, ok := ResolveController(pod, "DaemonSet", get(owner)); ok {
		t.Fatal("the controller matched another kind")
	}
}
