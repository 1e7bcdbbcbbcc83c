package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/httpstream/wsstream"
	remotecommandconsts "k8s.io/apimachinery/pkg/util/remotecommand"
	kremote "k8s.io/cri-streaming/pkg/streaming/remotecommand"

	"github.com/waggle-io/waggle/kubelet/containerlog"
	"github.com/waggle-io/waggle/kubelet/runtime"
)

// attacher attaches to a running container's main process: its output is
// the container's log from now on (stdout records on the stdout stream,
// stderr records on stderr; with a TTY, both on stdout), its input goes to
// the stdin FIFO the runtime made for a container with stdin: true. The
// attach ends when the container stops or the client goes, and, as under a
// CRI runtime, when the client's input ends — except for a stdinOnce
// container without a TTY, whose stdin is then closed while its output
// keeps coming until it stops (kubectl run --attach -i).
type attacher struct {
	s             *Server
	ns, pod, name string
	c             runtime.Container
}

// attachDrain is how long an attach whose input ended keeps streaming the
// log before it ends (five of the log reader's polls).
const attachDrain = 500 * time.Millisecond

func (a attacher) AttachContainer(ctx context.Context, _, _, _ string, in io.Reader, out, errw io.WriteCloser, tty bool, _ <-chan kremote.TerminalSize) error {
	if _, err := os.Stat(a.c.LogPath); err != nil {
		return fmt.Errorf("container %s has no log to attach to: %w", a.name, err)
	}
	if in != nil {
		// Non-blocking: ENXIO means nobody reads the FIFO (the container
		// was not started with stdin).
		fifo, err := os.OpenFile(runtime.StdinPath(a.c.LogPath), os.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			return fmt.Errorf("container %s does not take stdin (stdin: true in its spec is needed): %w", a.name, err)
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		go func() {
			io.Copy(fifo, in)
			fifo.Close()
			if !a.c.StdinOnce || tty {
				// What the process writes in reply to the last input still
				// reaches the client: the log is read a few more times.
				time.AfterFunc(attachDrain, cancel)
				return
			}
			if err := a.s.p.Runtime().StdinDone(context.WithoutCancel(ctx), a.c.ID); err != nil && a.s.cfg.Log != nil {
				a.s.cfg.Log.Warn("close stdin after attach", "container", a.c.ID, "err", err)
			}
		}()
	}
	// A nil writer (a stream the client did not ask for) drops its records.
	var stdout, stderr io.Writer = out, errw
	if tty {
		stderr = stdout
	}
	running := func() bool {
		cur, _, err := a.s.p.Container(a.ns, a.pod, a.name, false)
		return err == nil && cur.ID == a.c.ID && cur.State == runtime.StateRunning
	}
	// From the log's end on: TailLines 0 with Follow.
	return containerlog.Read(ctx, a.c.LogPath, containerlog.Options{Follow: true, TailLines: 0}, stdout, stderr, running)
}

func (s *Server) attach(w http.ResponseWriter, r *http.Request) {
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
	opts, err := kremote.NewOptions(r)
	if err != nil {
		httpError(w, badRequest{err.Error()})
		return
	}
	a := attacher{s: s, ns: ns, pod: pod, name: c.Name, c: c}
	if wsstream.IsWebSocketRequest(r) && wantsV5(r) {
		serveV5(w, r, opts, func(in io.Reader, out, errw io.WriteCloser, resize <-chan kremote.TerminalSize) error {
			return a.AttachContainer(r.Context(), "", "", "", in, out, errw, opts.TTY, resize)
		})
		return
	}
	kremote.ServeAttach(w, r, a, pod, string(uid), name, opts, streamIdleTimeout, streamCreationTimeout, remotecommandconsts.SupportedStreamingProtocols)
}
