package server

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"

	kportforward "k8s.io/cri-streaming/pkg/streaming/portforward"
)

// forwarder copies a port-forward stream to and from a port of the pod.
type forwarder struct {
	p       Provider
	ns, pod string
}

func (f forwarder) PortForward(ctx context.Context, _ string, _ string, port int32, stream io.ReadWriteCloser) error {
	defer stream.Close()
	conn, err := f.p.PortForwardDial(ctx, f.ns, f.pod, port)
	if err != nil {
		return fmt.Errorf("port forward to %s/%s:%d: %w", f.ns, f.pod, port, err)
	}
	defer conn.Close()
	done := make(chan struct{}, 2)
	go func() { io.Copy(conn, stream); conn.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	go func() { io.Copy(stream, conn); done <- struct{}{} }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	return nil
}

func (s *Server) portForward(w http.ResponseWriter, r *http.Request) {
	ns, pod := r.PathValue("ns"), r.PathValue("pod")
	uid, err := s.p.PodUID(ns, pod)
	if err != nil {
		httpError(w, err)
		return
	}
	opts, err := kportforward.NewV4Options(r)
	if err != nil {
		httpError(w, badRequest{err.Error()})
		return
	}
	kportforward.ServePortForward(w, r, forwarder{p: s.p, ns: ns, pod: pod}, pod, string(uid), opts, streamIdleTimeout, streamCreationTimeout, []string{"portforward.k8s.io"})
}
