package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream/wsstream"
	remotecommandconsts "k8s.io/apimachinery/pkg/util/remotecommand"
	kremote "k8s.io/cri-streaming/pkg/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"

	"github.com/waggle-io/waggle/kubelet/runtime"
)

const (
	streamIdleTimeout     = 4 * time.Hour
	streamCreationTimeout = 30 * time.Second
)

// executor runs execs for the Kubernetes stream protocol handlers.
type executor struct {
	rt runtime.Runtime
	id string
}

func (e executor) ExecInContainer(ctx context.Context, _ string, _ string, _ string, cmd []string, in io.Reader, out, errw io.WriteCloser, tty bool, resize <-chan kremote.TerminalSize, _ time.Duration) error {
	opts := runtime.ExecOptions{TTY: tty}
	if in != nil {
		opts.Stdin = in
	}
	if out != nil {
		opts.Stdout = out
	}
	if errw != nil {
		opts.Stderr = errw
	}
	if resize != nil {
		ch := make(chan runtime.TermSize)
		go func() {
			defer close(ch)
			for sz := range resize {
				select {
				case ch <- runtime.TermSize{Width: sz.Width, Height: sz.Height}:
				case <-ctx.Done():
					return
				}
			}
		}()
		opts.Resize = ch
	}
	code, err := e.rt.Exec(ctx, e.id, cmd, opts)
	if err != nil {
		return err
	}
	if code != 0 {
		return utilexec.CodeExitError{Err: fmt.Errorf("command terminated with exit code %d", code), Code: code}
	}
	return nil
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	ns, pod, name := r.PathValue("ns"), r.PathValue("pod"), r.PathValue("container")
	c, uid, err := s.p.Container(ns, pod, name, false)
	if err != nil {
		httpError(w, err)
		return
	}
	if c.State != runtime.StateRunning {
		httpError(w, badRequest{fmt.Sprintf("container %s is not running", name)})
		return
	}
	cmd := r.URL.Query()["command"]
	if len(cmd) == 0 {
		httpError(w, badRequest{"command is required"})
		return
	}
	opts, err := kremote.NewOptions(r)
	if err != nil {
		httpError(w, badRequest{err.Error()})
		return
	}
	ex := executor{rt: s.p.Runtime(), id: c.ID}
	if wsstream.IsWebSocketRequest(r) && wantsV5(r) {
		serveV5(w, r, opts, func(in io.Reader, out, errw io.WriteCloser, resize <-chan kremote.TerminalSize) error {
			return ex.ExecInContainer(r.Context(), "", "", "", cmd, in, out, errw, opts.TTY, resize, 0)
		})
		return
	}
	kremote.ServeExec(w, r, ex, pod, string(uid), name, cmd, opts, streamIdleTimeout, streamCreationTimeout, remotecommandconsts.SupportedStreamingProtocols)
}

func wantsV5(r *http.Request) bool {
	for _, h := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(h, ",") {
			if strings.TrimSpace(p) == remotecommandconsts.StreamProtocolV5Name {
				return true
			}
		}
	}
	return false
}

// serveV5 serves an exec or attach in the WebSocket v5.channel.k8s.io
// protocol kubectl 1.30+ speaks: channels 0-4 (stdin, stdout, stderr,
// error, resize) and the stdin close signal, which apimachinery's wsstream
// implements.
func serveV5(w http.ResponseWriter, r *http.Request, opts *kremote.Options, run func(in io.Reader, out, errw io.WriteCloser, resize <-chan kremote.TerminalSize) error) {
	rd := func(real bool) wsstream.ChannelType {
		if real {
			return wsstream.ReadChannel
		}
		return wsstream.IgnoreChannel
	}
	wr := func(real bool) wsstream.ChannelType {
		if real {
			return wsstream.WriteChannel
		}
		return wsstream.IgnoreChannel
	}
	channels := []wsstream.ChannelType{rd(opts.Stdin), wr(opts.Stdout), wr(opts.Stderr && !opts.TTY), wsstream.WriteChannel, wsstream.ReadChannel}
	conn := wsstream.NewConn(map[string]wsstream.ChannelProtocolConfig{
		remotecommandconsts.StreamProtocolV5Name: {Binary: true, Channels: channels},
	})
	conn.SetIdleTimeout(streamIdleTimeout)
	_, streams, err := conn.Open(w, r)
	if err != nil {
		return
	}
	defer conn.Close()
	var in io.Reader
	var out, errw io.WriteCloser
	if opts.Stdin {
		in = streams[0]
	}
	if opts.Stdout {
		out = streams[1]
	}
	if opts.Stderr && !opts.TTY {
		errw = streams[2]
	}
	var resize chan kremote.TerminalSize
	if opts.TTY {
		resize = make(chan kremote.TerminalSize)
		go func() {
			defer close(resize)
			dec := json.NewDecoder(streams[4])
			for {
				var sz kremote.TerminalSize
				if err := dec.Decode(&sz); err != nil {
					return
				}
				select {
				case resize <- sz:
				case <-r.Context().Done():
					return
				}
			}
		}()
	}
	err = run(in, out, errw, resize)
	status := metav1.Status{Status: metav1.StatusSuccess}
	if err != nil {
		if ee, ok := err.(utilexec.ExitError); ok && ee.Exited() {
			status = metav1.Status{
				Status: metav1.StatusFailure, Reason: remotecommandconsts.NonZeroExitCodeReason,
				Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{
					Type: remotecommandconsts.ExitCodeCauseType, Message: fmt.Sprintf("%d", ee.ExitStatus()),
				}}},
				Message: fmt.Sprintf("command terminated with non-zero exit code: %v", err),
			}
		} else {
			status = apierrors.NewInternalError(fmt.Errorf("error executing command in container: %v", err)).ErrStatus
		}
	}
	b, _ := json.Marshal(status)
	streams[3].Write(b)
}
