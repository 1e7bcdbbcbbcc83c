package client

import (
	"errors"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func node(port int32, addrs ...v1.NodeAddress) *v1.Node {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	n.Status.DaemonEndpoints.KubeletEndpoint.Port = port
	n.Status.Addresses = addrs
	return n
}

func TestURLs(t *testing.T) {
	n := node(10250, v1.NodeAddress{Type: v1.NodeHostName, Address: "n1"}, v1.NodeAddress{Type: v1.NodeInternalIP, Address: "10.0.0.5"})
	for _, tc := range []struct {
		name string
		got  func() (string, error)
		want string
	}{
		{"logs with options", func() (string, error) {
			u, err := LogURL(n, "default", "web", &v1.PodLogOptions{Container: "echo", Follow: true, Previous: true, TailLines: ptr.To[int64](5)})
			return u.String(), err
		}, "https://10.0.0.5:10250/containerLogs/default/web/echo?follow=true&previous=true&tailLines=5"},
		{"exec with command and streams", func() (string, error) {
			u, err := ExecURL(n, "ns", "p", &v1.PodExecOptions{Container: "c", Command: []string{"ls", "-l"}, Stdin: true, Stdout: true, TTY: true})
			return u.String(), err
		}, "https://10.0.0.5:10250/exec/ns/p/c?command=ls&command=-l&input=1&output=1&tty=1"},
		{"node proxy", func() (string, error) {
			u, err := NodeProxyURL(n, "stats/summary", "")
			return u.String(), err
		}, "https://10.0.0.5:10250/stats/summary"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.got()
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestEndpointNeedsPortAndAddress(t *testing.T) {
	if _, err := Endpoint(node(0, v1.NodeAddress{Type: v1.NodeInternalIP, Address: "10.0.0.1"})); !errors.Is(err, ErrNoAddress) {
		t.Errorf("no port: %v", err)
	}
	if _, err := Endpoint(node(10250)); !errors.Is(err, ErrNoAddress) {
		t.Errorf("no address: %v", err)
	}
	u, err := Endpoint(node(10250, v1.NodeAddress{Type: v1.NodeHostName, Address: "h"}))
	if err != nil || u.Host != "h:10250" {
		t.Errorf("hostname fallback: %v %v", u, err)
	}
}
