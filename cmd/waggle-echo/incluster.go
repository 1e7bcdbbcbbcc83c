package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
)

// inClusterPods is `waggle-echo list-pods [NAMESPACE]`: client-go's
// in-cluster configuration (KUBERNETES_SERVICE_HOST/PORT, the projected
// token and ca.crt under /var/run/secrets/kubernetes.io/serviceaccount)
// lists the pods of NAMESPACE (default: the pod's own, from the same
// volume), one name a line. A refusal prints the API's status code and
// message and exits 1, so tests can tell a 403 from a 401.
func inClusterPods(args []string) int {
	rc, err := rest.InClusterConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, "in-cluster config:", err)
		return 2
	}
	ns := ""
	if len(args) > 0 {
		ns = args[0]
	} else {
		b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		ns = strings.TrimSpace(string(b))
	}
	c, err := corev1client.NewForConfig(rc)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pods, err := c.Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		code := int32(0)
		if se, ok := err.(apierrors.APIStatus); ok {
			code = se.Status().Code
		}
		fmt.Fprintf(os.Stderr, "list pods: status %d: %v\n", code, err)
		return 1
	}
	for _, p := range pods.Items {
		fmt.Println(p.Name)
	}
	return 0
}
