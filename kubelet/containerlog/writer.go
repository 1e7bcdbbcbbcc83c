package containerlog

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// LoggerCommand is the `waggle` subcommand that runs RunLogger; a binary
// log URI names it as its one query parameter (see LoggerArgs).
const LoggerCommand = "container-logger"

// Copy reads one stream of a container's output until it ends and writes
// it to w as records, each with one Write, as containerd's CRI plugin does:
// a line becomes an F record stamped when it was read; a line longer than
// maxLine bytes is split into P records of maxLine bytes, its last piece an
// F record; output that ends without a newline is a last P record.
func Copy(w io.Writer, r io.Reader, stream Stream, maxLine int, now func() time.Time) error {
	if maxLine <= 0 {
		maxLine = MaxLineSize
	}
	br := bufio.NewReaderSize(r, min(maxLine, 4096))
	var pend, out []byte
	emit := func(content []byte, partial bool) error {
		out = Record{Time: now(), Stream: stream, Partial: partial, Content: content}.Append(out[:0])
		_, err := w.Write(out)
		return err
	}
	for {
		chunk, err := br.ReadSlice('\n')
		eol := err == nil
		if eol {
			chunk = chunk[:len(chunk)-1]
		}
		pend = append(pend, chunk...)
		for len(pend) > maxLine {
			if werr := emit(pend[:maxLine], true); werr != nil {
				return werr
			}
			pend = append(pend[:0], pend[maxLine:]...)
		}
		switch {
		case eol:
			if werr := emit(pend, false); werr != nil {
				return werr
			}
			pend = pend[:0]
		case errors.Is(err, bufio.ErrBufferFull):
		default:
			if len(pend) > 0 {
				if werr := emit(pend, true); werr != nil {
					return werr
				}
			}
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("read %s: %w", stream, err)
		}
	}
}

// lockedWriter serializes the two streams' records into one file.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// LoggerConfig is what a container-logger process does.
type LoggerConfig struct {
	// Path is the log file, appended to (created 0640 if missing).
	Path string
	// Stdout and Stderr are FIFOs to read the container's streams from.
	// Empty: the streams are the files a containerd shim passes a binary
	// logger (fds 3 and 4), and closing fd 5 tells the shim the logger is
	// ready.
	Stdout, Stderr string
	// MaxLine is where lines are split (default MaxLineSize).
	MaxLine int
}

// ParseLoggerArgs parses a container-logger's command line (after the
// subcommand): [--stdout FIFO --stderr FIFO] PATH.
func ParseLoggerArgs(args []string) (LoggerConfig, error) {
	var cfg LoggerConfig
	fs := flag.NewFlagSet(LoggerCommand, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&cfg.Stdout, "stdout", "", "FIFO of the container's stdout (default: fd 3, as a containerd shim passes it, with fd 5 closed when ready)")
	fs.StringVar(&cfg.Stderr, "stderr", "", "FIFO of the container's stderr (default: fd 4)")
	if err := fs.Parse(args); err != nil {
		return cfg, fmt.Errorf("%s: %w", LoggerCommand, err)
	}
	if fs.NArg() != 1 {
		return cfg, fmt.Errorf("%s: want one log file path, got %q", LoggerCommand, fs.Args())
	}
	if (cfg.Stdout == "") != (cfg.Stderr == "") {
		return cfg, fmt.Errorf("%s: --stdout and --stderr go together", LoggerCommand)
	}
	cfg.Path = fs.Arg(0)
	return cfg, nil
}

// LoggerArgs are the arguments of a container-logger writing path, in the
// form of a binary log URI's query: `waggle container-logger <path>`.
func LoggerArgs(path string) map[string]string { return map[string]string{LoggerCommand: path} }

// drainGrace is how long a logger asked to stop (the shim's SIGTERM, sent
// once it closed the streams' write ends) keeps copying what is left.
const drainGrace = 5 * time.Second

// RunLogger copies a container's stdout and stderr into its log file until
// both streams end. It runs in its own process, started by the containerd
// shim (or, for a container with stdin, by the runtime), so it outlives the
// kubelet. Canceling ctx gives it drainGrace to copy what is buffered.
func RunLogger(ctx context.Context, cfg LoggerConfig) error {
	if cfg.Path == "" {
		return errors.New("container-logger: no log path")
	}
	if err := os.MkdirAll(filepath.Dir(cfg.Path), 0o755); err != nil {
		return fmt.Errorf("log dir: %w", err)
	}
	f, err := os.OpenFile(cfg.Path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return fmt.Errorf("open log: %w", err)
	}
	defer f.Close()
	var stdout, stderr io.ReadCloser
	if cfg.Stdout == "" {
		stdout, stderr = os.NewFile(3, "CONTAINER_STDOUT"), os.NewFile(4, "CONTAINER_STDERR")
		if err := os.NewFile(5, "CONTAINER_WAIT").Close(); err != nil {
			return fmt.Errorf("signal ready: %w", err)
		}
	} else {
		// A FIFO's open waits for its writer, the shim.
		if stdout, err = os.Open(cfg.Stdout); err != nil {
			return fmt.Errorf("open stdout: %w", err)
		}
		if stderr, err = os.Open(cfg.Stderr); err != nil {
			stdout.Close()
			return fmt.Errorf("open stderr: %w", err)
		}
	}
	defer stdout.Close()
	defer stderr.Close()
	w := &lockedWriter{w: f}
	errs := make(chan error, 2)
	for _, s := range []struct {
		r      io.Reader
		stream Stream
	}{{stdout, Stdout}, {stderr, Stderr}} {
		go func() { errs <- Copy(w, s.r, s.stream, cfg.MaxLine, time.Now) }()
	}
	var first error
	var grace <-chan time.Time
	stop := ctx.Done()
	for done := 0; done < 2; {
		select {
		case err := <-errs:
			done++
			if first == nil {
				first = err
			}
		case <-stop:
			stop = nil
			t := time.NewTimer(drainGrace)
			defer t.Stop()
			grace = t.C
		case <-grace:
			return fmt.Errorf("streams still open %v after stop", drainGrace)
		}
	}
	return first
}

// Main is a logger process's whole life when args (os.Args) name
// LoggerCommand: it parses the rest, copies until the streams end (SIGTERM,
// which the shim sends once it closed the streams' write ends, leaves
// drainGrace to copy what is buffered) and returns the exit code. It
// returns -1 when args do not ask for the logger.
func Main(args []string) int {
	if len(args) < 2 || args[1] != LoggerCommand {
		return -1
	}
	cfg, err := ParseLoggerArgs(args[2:])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := RunLogger(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
