package containerlog

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"time"
)

// Options select and shape what Read writes, with the meaning of
// upstream's PodLogOptions.
type Options struct {
	// Follow keeps reading what is appended while the container runs.
	Follow bool
	// TailLines starts at the file's last n records (negative: all). Without
	// Follow, reading stops after them.
	TailLines int64
	// LimitBytes stops after that many bytes of output (0: no limit).
	LimitBytes int64
	// Since skips records stamped before it.
	Since time.Time
	// Timestamps prefixes each line of output with its first record's time
	// (TimeFormatOut) and a space.
	Timestamps bool
}

// pollInterval is how often a follow looks for appended records.
const pollInterval = 100 * time.Millisecond

// Read writes the log at path to stdout and stderr, each record to its
// stream's writer (a nil writer drops the stream, and its bytes do not
// count toward LimitBytes), partial records joined into their line, as
// upstream's kubelet reads CRI logs. A missing file is an empty log. With
// Follow it returns once running() reports false and the file has been
// read to its end, or when ctx ends. Writers with a Flush method (an
// http.ResponseWriter) are flushed whenever the reader catches up.
//
// A line that is not a CRI record (a log written in the raw format of
// older Waggle kubelets) is passed through as stdout, with no timestamp
// (and left out by Since).
func Read(ctx context.Context, path string, opts Options, stdout, stderr io.Writer, running func() bool) error {
	f, err := os.Open(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		f = nil
	case err != nil:
		return fmt.Errorf("open log: %w", err)
	default:
		defer f.Close()
		start, err := tailStart(f, opts.TailLines)
		if err != nil {
			return fmt.Errorf("tail log: %w", err)
		}
		if _, err := f.Seek(start, io.SeekStart); err != nil {
			return fmt.Errorf("tail log: %w", err)
		}
	}
	flush := func() {
		for _, w := range []io.Writer{stdout, stderr} {
			if fl, ok := w.(interface{ Flush() }); ok {
				fl.Flush()
			}
		}
	}
	defer flush()
	lw := &lineWriter{opts: &opts, stdout: stdout, stderr: stderr, remain: math.MaxInt64, atLineStart: true}
	if opts.LimitBytes > 0 {
		lw.remain = opts.LimitBytes
	}
	limited := opts.TailLines >= 0 && !opts.Follow
	left := opts.TailLines
	var br *bufio.Reader
	if f != nil {
		br = bufio.NewReader(f)
	}
	var pending []byte // an incomplete last line, completed by a later read
	lastPass := false
	for {
		if limited && left == 0 {
			return nil
		}
		var line []byte
		err := io.EOF
		if br != nil {
			line, err = br.ReadBytes('\n')
		}
		if len(pending) > 0 {
			line, pending = append(pending, line...), nil
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("read log: %w", err)
		}
		if err != nil && opts.Follow {
			pending = line
			flush()
			if lastPass {
				return nil
			}
			if !running() {
				lastPass = true
				continue
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(pollInterval):
			}
			if f == nil {
				if f, err = os.Open(path); err == nil {
					defer f.Close()
					br = bufio.NewReader(f)
				} else {
					f = nil
				}
			}
			continue
		}
		if len(line) > 0 {
			if done, werr := lw.write(line); werr != nil || done {
				return werr
			}
			if limited {
				left--
			}
		}
		if err != nil {
			return nil
		}
	}
}

// errDone ends a read at LimitBytes.
var errDone = errors.New("limit reached")

// lineWriter writes records as upstream's kubelet's logWriter does.
type lineWriter struct {
	opts           *Options
	stdout, stderr io.Writer
	remain         int64
	// atLineStart: the previous record ended its line, so the next one
	// gets the timestamp prefix.
	atLineStart bool
	buf         []byte
}

// write writes one line of the file; done reports that LimitBytes is
// reached.
func (w *lineWriter) write(line []byte) (done bool, err error) {
	rec, perr := Parse(line)
	raw := perr != nil
	if raw {
		rec = Record{Stream: Stdout, Content: bytes.TrimSuffix(line, []byte{'\n'})}
	}
	ends := !rec.Partial && line[len(line)-1] == '\n'
	prefix := w.opts.Timestamps && w.atLineStart && !raw
	w.atLineStart = ends
	if rec.Time.Before(w.opts.Since) {
		return false, nil
	}
	out := w.stdout
	if rec.Stream == Stderr {
		out = w.stderr
	}
	if out == nil {
		return false, nil
	}
	w.buf = w.buf[:0]
	if prefix {
		w.buf = rec.Time.AppendFormat(w.buf, TimeFormatOut)
		w.buf = append(w.buf, ' ')
	}
	w.buf = append(w.buf, rec.Content...)
	if ends {
		w.buf = append(w.buf, '\n')
	}
	b := w.buf
	if int64(len(b)) > w.remain {
		b = b[:w.remain]
	}
	n, err := out.Write(b)
	w.remain -= int64(n)
	if err != nil {
		return true, err
	}
	if n < len(b) {
		return true, io.ErrShortWrite
	}
	return w.remain <= 0, nil
}

// tailStart is where the file's last n lines start (0 for n < 0), as
// upstream counts them: every newline ends a line, and an unterminated last
// line is not one of the n.
func tailStart(f *os.File, n int64) (int64, error) {
	if n < 0 {
		return 0, nil
	}
	st, err := f.Stat()
	if err != nil {
		return 0, err
	}
	const chunk = 8192
	buf := make([]byte, chunk)
	var seen int64
	for end := st.Size(); end > 0; {
		start := max(end-chunk, 0)
		b := buf[:end-start]
		if _, err := f.ReadAt(b, start); err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
		for i := len(b) - 1; i >= 0; i-- {
			if b[i] != '\n' {
				continue
			}
			if seen++; seen == n+1 {
				return start + int64(i) + 1, nil
			}
		}
		end = start
	}
	return 0, nil
}
