package controllers

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestPodGCDeletesTerminatedPodsOverTheThresholdAndOrphans(t *testing.T) {
	c := newCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	for _, n := range []string{"live", "doomed"} {
		if _, err := c.cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mk := func(name, node string, phase corev1.PodPhase) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
		created, err := c.cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if phase != "" {
			created.Status.Phase = phase
			if _, err := c.cs.CoreV1().Pods("default").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(1100 * time.Millisecond) // creationTimestamp has second precision: order them
	}
	mk("done-0", "live", corev1.PodSucceeded)
	mk("done-1", "live", corev1.PodFailed)
	mk("done-2", "live", corev1.PodSucceeded)
	mk("running", "live", corev1.PodRunning)
	mk("orphan", "doomed", corev1.PodRunning)
	c.startManager("cm-0", func(cfg *Config) {
		cfg.TerminatedPodGCThreshold = 2
		cfg.PodGCPeriod = 200 * time.Millisecond
		cfg.PodGCQuarantine = time.Second
	})
	names := func() ([]string, error) {
		l, err := c.cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		var out []string
		for _, p := range l.Items {
			out = append(out, p.Name)
		}
		sort.Strings(out)
		return out, nil
	}
	eventually(t, 60*time.Second, func() error {
		n, err := names()
		if err != nil {
			return err
		}
		if fmt.Sprint(n) != "[done-1 done-2 orphan running]" {
			return fmt.Errorf("pods %v, want the oldest terminated pod gone", n)
		}
		return nil
	})
	// The node goes: its pod is marked failed and deleted after the
	// quarantine; the live node's running pod stays.
	if err := c.cs.CoreV1().Nodes().Delete(ctx, "doomed", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() error {
		_, err := c.cs.CoreV1().Pods("default").Get(ctx, "orphan", metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("orphan still there (err %v)", err)
		}
		return nil
	})
	if n, _ := names(); fmt.Sprint(n) != "[done-1 done-2 running]" {
		t.Fatalf("pods %v", n)
	}
}
