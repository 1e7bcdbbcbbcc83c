package testutil

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// An object created right after WaitOpen returns reaches the watch: the
// count moves only once the watch is registered with the tracker.
func TestWatchesOpenedAreOpen(t *testing.T) {
	cs := fake.NewClientset()
	w := TrackWatches(cs)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got := make(chan string, 1)
	go func() {
		wi, err := cs.CoreV1().ConfigMaps("ns").Watch(ctx, metav1.ListOptions{})
		if err != nil {
			t.Error(err)
			return
		}
		defer wi.Stop()
		select {
		case ev := <-wi.ResultChan():
			got <- ev.Object.(*corev1.ConfigMap).Name
		case <-ctx.Done():
		}
	}()
	w.WaitOpen(t, 1, 5*time.Second)
	if _, err := cs.CoreV1().ConfigMaps("ns").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "ns"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case name := <-got:
		if name != "a" {
			t.Fatalf("watch saw %q", name)
		}
	case <-ctx.Done():
		t.Fatal("the object created after WaitOpen never reached the watch")
	}
}
