package containerlog

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/waggle-io/waggle/internal/testutil"
)

var t0 = time.Date(2024, 5, 6, 7, 8, 9, 123000000, time.UTC)

// clock returns a now() that advances a second per call from t0.
func clock() func() time.Time {
	n := 0
	return func() time.Time {
		n++
		return t0.Add(time.Duration(n-1) * time.Second)
	}
}

func TestCopyWritesRecordsAsContainerdCRI(t *testing.T) {
	x16, x40 := strings.Repeat("x", 16), strings.Repeat("y", 40)
	for _, tc := range []struct {
		name, in string
		want     []string // "<tag> <content>"
	}{
		{"lines", "a\n\nb\n", []string{"F a", "F ", "F b"}},
		{"unterminated end is partial", "a\nrest", []string{"F a", "P rest"}},
		{"long line split at max", x40 + "\n", []string{"P " + x40[:16], "P " + x40[16:32], "F " + x40[32:]}},
		{"line of exactly max is one full record", x16 + "\n", []string{"F " + x16}},
		{"long unterminated", x40, []string{"P " + x40[:16], "P " + x40[16:32], "P " + x40[32:]}},
		{"carriage return kept", "a\r\n", []string{"F a\r"}},
		{"empty", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := Copy(&out, strings.NewReader(tc.in), Stderr, 16, clock()); err != nil {
				t.Fatal(err)
			}
			var got []string
			for i, l := range strings.SplitAfter(out.String(), "\n") {
				if l == "" {
					continue
				}
				r, err := Parse([]byte(l))
				if err != nil {
					t.Fatalf("record %q: %v", l, err)
				}
				if r.Stream != Stderr || !r.Time.Equal(t0.Add(time.Duration(i)*time.Second)) {
					t.Errorf("record %q: stream %s time %v", l, r.Stream, r.Time)
				}
				tag := "F"
				if r.Partial {
					tag = "P"
				}
				got = append(got, tag+" "+string(r.Content))
			}
			if strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Errorf("records %q, want %q", got, tc.want)
			}
		})
	}
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		line string
		want Record
		err  bool
	}{
		{"2016-10-06T00:17:09.669794202Z stdout F log content 1\n", Record{Time: time.Date(2016, 10, 6, 0, 17, 9, 669794202, time.UTC), Stream: Stdout, Content: []byte("log content 1")}, false},
		{"2016-10-06T00:17:09.669794202+02:00 stderr P part", Record{Time: time.Date(2016, 10, 5, 22, 17, 9, 669794202, time.UTC), Stream: Stderr, Partial: true, Content: []byte("part")}, false},
		{"2016-10-06T00:17:09Z stdout F:x ", Record{Time: time.Date(2016, 10, 6, 0, 17, 9, 0, time.UTC), Stream: Stdout, Content: []byte{}}, false},
		{"2016-10-06T00:17:09Z stdout P:x y", Record{Time: time.Date(2016, 10, 6, 0, 17, 9, 0, time.UTC), Stream: Stdout, Partial: true, Content: []byte("y")}, false},
		{"hello world\n", Record{}, true},
		{"2016-10-06T00:17:09Z stdin F x", Record{}, true},
		{"2016-10-06T00:17:09Z stdout F", Record{}, true},
		{"", Record{}, true},
	} {
		got, err := Parse([]byte(tc.line))
		if (err != nil) != tc.err {
			t.Errorf("Parse(%q) err = %v, want error %v", tc.line, err, tc.err)
			continue
		}
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Errorf("Parse(%q) err = %v, want ErrFormat", tc.line, err)
			}
			continue
		}
		if !got.Time.Equal(tc.want.Time) || got.Stream != tc.want.Stream || got.Partial != tc.want.Partial || !bytes.Equal(got.Content, tc.want.Content) {
			t.Errorf("Parse(%q) = %+v, want %+v", tc.line, got, tc.want)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("2016-10-06T00:17:09.669794202Z stdout F log content 1\n"))
	f.Add([]byte("2016-10-06T00:17:09Z stderr P:x \n"))
	f.Add([]byte("raw line"))
	f.Fuzz(func(t *testing.T, line []byte) {
		r, err := Parse(line)
		if err != nil {
			return
		}
		// A parsed record written again parses to the same record.
		again, err := Parse(r.Append(nil))
		if err != nil || !again.Time.Equal(r.Time) || again.Stream != r.Stream || again.Partial != r.Partial || !bytes.Equal(again.Content, r.Content) {
			t.Fatalf("round trip of %q: %+v, %v; was %+v", line, again, err, r)
		}
	})
}

// logFile writes records, one per entry "<stream> <F|P> <content>", stamped
// a second apart from t0, and returns the file's path.
func logFile(t *testing.T, entries ...string) string {
	t.Helper()
	var b []byte
	for i, e := range entries {
		f := strings.SplitN(e, " ", 3)
		b = Record{Time: t0.Add(time.Duration(i) * time.Second), Stream: Stream(f[0]), Partial: f[1] == "P", Content: []byte(f[2])}.Append(b)
	}
	p := filepath.Join(t.TempDir(), "0.log")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func notRunning() bool { return false }

func TestReadAsUpstreamKubelet(t *testing.T) {
	// t0+0 … t0+5 s.
	path := logFile(t,
		"stdout F one",
		"stderr F two",
		"stdout P thr",
		"stdout P e",
		"stdout F e",
		"stdout F four")
	ts := func(sec int) string { return t0.Add(time.Duration(sec)*time.Second).Format(TimeFormatOut) + " " }
	for _, tc := range []struct {
		name     string
		opts     Options
		want     string
		wantErrw string // when stderr goes to its own writer
	}{
		{"all, partials joined", Options{TailLines: -1}, "one\ntwo\nthree\nfour\n", ""},
		{"tail counts records", Options{TailLines: 2}, "e\nfour\n", ""},
		{"tail 4 starts inside a line", Options{TailLines: 4}, "three\nfour\n", ""},
		{"tail 0", Options{TailLines: 0}, "", ""},
		{"tail beyond the file", Options{TailLines: 100}, "one\ntwo\nthree\nfour\n", ""},
		{"limit bytes counts output", Options{TailLines: -1, LimitBytes: 9}, "one\ntwo\nt", ""},
		{"limit bytes with timestamps", Options{TailLines: -1, LimitBytes: 40, Timestamps: true}, (ts(0) + "one\n" + ts(1) + "two\n")[:40], ""},
		{"timestamps: a line's first record's time", Options{TailLines: -1, Timestamps: true},
			ts(0) + "one\n" + ts(1) + "two\n" + ts(2) + "three\n" + ts(5) + "four\n", ""},
		{"since skips older records", Options{TailLines: -1, Since: t0.Add(1500 * time.Millisecond)}, "three\nfour\n", ""},
		{"since cuts a line's older pieces", Options{TailLines: -1, Since: t0.Add(2500 * time.Millisecond)}, "ee\nfour\n", ""},
		{"since equal to a record's time keeps it", Options{TailLines: -1, Since: t0.Add(5 * time.Second)}, "four\n", ""},
		{"since in the future", Options{TailLines: -1, Since: t0.Add(time.Hour)}, "", ""},
		{"since with tail and timestamps", Options{TailLines: 3, Since: t0.Add(3 * time.Second), Timestamps: true}, ts(3) + "ee\n" + ts(5) + "four\n", ""},
		{"stderr to its own writer", Options{TailLines: -1}, "one\nthree\nfour\n", "two\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errw bytes.Buffer
			stderr := &out
			if tc.wantErrw != "" {
				stderr = &errw
			}
			if err := Read(context.Background(), path, tc.opts, &out, stderr, notRunning); err != nil {
				t.Fatal(err)
			}
			if out.String() != tc.want || errw.String() != tc.wantErrw {
				t.Errorf("got %q / %q, want %q / %q", out.String(), errw.String(), tc.want, tc.wantErrw)
			}
		})
	}
}

func TestReadNilStreamIsNotCounted(t *testing.T) {
	path := logFile(t, "stderr F error text", "stdout F out")
	var out bytes.Buffer
	if err := Read(context.Background(), path, Options{TailLines: -1, LimitBytes: 4}, &out, nil, notRunning); err != nil {
		t.Fatal(err)
	}
	if out.String() != "out\n" {
		t.Errorf("got %q, want only stdout, limited after it", out.String())
	}
}

func TestReadRawLinesPassThrough(t *testing.T) {
	p := filepath.Join(t.TempDir(), "0.log")
	os.WriteFile(p, []byte("old raw line\nanother\n"), 0o644)
	var out bytes.Buffer
	if err := Read(context.Background(), p, Options{TailLines: 1, Timestamps: true}, &out, &out, notRunning); err != nil {
		t.Fatal(err)
	}
	if out.String() != "another\n" {
		t.Errorf("got %q", out.String())
	}
}

func TestReadMissingFileIsEmpty(t *testing.T) {
	var out bytes.Buffer
	if err := Read(context.Background(), filepath.Join(t.TempDir(), "none.log"), Options{TailLines: -1}, &out, &out, notRunning); err != nil || out.Len() != 0 {
		t.Errorf("got %q, %v", out.String(), err)
	}
}

// syncBuffer is a bytes.Buffer safe for a reader goroutine and the test.
type syncBuffer struct {
	mu  chan struct{}
	buf bytes.Buffer
}

func newSyncBuffer() *syncBuffer { return &syncBuffer{mu: make(chan struct{}, 1)} }
func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu <- struct{}{}
	defer func() { <-s.mu }()
	return s.buf.Write(p)
}
func (s *syncBuffer) String() string {
	s.mu <- struct{}{}
	defer func() { <-s.mu }()
	return s.buf.String()
}

func TestReadFollowJoinsAppendedPiecesUntilStopped(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "0.log") // created after the follow starts
	var running atomic.Bool
	running.Store(true)
	// Each call of running() marks a read that reached the file's end.
	var eofs atomic.Int64
	isRunning := func() bool { eofs.Add(1); return running.Load() }
	out := newSyncBuffer()
	done := make(chan error, 1)
	go func() {
		done <- Read(context.Background(), path, Options{Follow: true, TailLines: -1, Timestamps: true}, out, out, isRunning)
	}()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rec := Record{Time: t0, Stream: Stdout, Content: []byte("first")}.Append(nil)
	// A record cut mid-way is held until its end is written.
	f.Write(rec[:10])
	seen := eofs.Load()
	testutil.WaitFor(t, 10*time.Second, "two more reads at the end of the log", func() bool { return eofs.Load() >= seen+2 })
	if got := out.String(); got != "" {
		t.Fatalf("half a record written out: %q", got)
	}
	f.Write(rec[10:])
	testutil.WaitFor(t, 10*time.Second, "the first record, stamped", func() bool { return out.String() == t0.Format(TimeFormatOut)+" first\n" })
	f.Write(Record{Time: t0.Add(time.Second), Stream: Stderr, Partial: true, Content: []byte("sec")}.Append(nil))
	f.Write(Record{Time: t0.Add(2 * time.Second), Stream: Stderr, Content: []byte("ond")}.Append(nil))
	running.Store(false)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	want := t0.Format(TimeFormatOut) + " first\n" + t0.Add(time.Second).Format(TimeFormatOut) + " second\n"
	if out.String() != want {
		t.Errorf("got %q, want %q", out.String(), want)
	}
}

func TestReadFollowEndsWithContext(t *testing.T) {
	path := logFile(t, "stdout F x")
	ctx, cancel := context.WithCancel(context.Background())
	out := newSyncBuffer()
	done := make(chan error, 1)
	go func() {
		done <- Read(ctx, path, Options{Follow: true, TailLines: 0}, out, out, func() bool { return true })
	}()
	cancel()
	if err := <-done; err != nil || out.String() != "" {
		t.Errorf("got %q, %v; want nothing (tail 0 starts at the end)", out.String(), err)
	}
}

func TestRunLoggerFromFIFOs(t *testing.T) {
	dir := t.TempDir()
	so, se, path := filepath.Join(dir, "0.stdout"), filepath.Join(dir, "0.stderr"), filepath.Join(dir, "0.log")
	for _, p := range []string{so, se} {
		if err := syscall.Mkfifo(p, 0o600); err != nil {
			t.Skipf("mkfifo: %v", err)
		}
	}
	done := make(chan error, 1)
	go func() {
		done <- RunLogger(context.Background(), LoggerConfig{Path: path, Stdout: so, Stderr: se, MaxLine: 16})
	}()
	wo, err := os.OpenFile(so, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	we, err := os.OpenFile(se, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	wo.Write([]byte("out 1\n"))
	testutil.WaitFor(t, 10*time.Second, "out 1 in the log", func() bool { b, _ := os.ReadFile(path); return bytes.Contains(b, []byte("out 1")) })
	we.Write([]byte("err " + strings.Repeat("z", 20) + "\n"))
	wo.Write([]byte("no newline"))
	wo.Close()
	we.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var out, errw bytes.Buffer
	if err := Read(context.Background(), path, Options{TailLines: -1}, &out, &errw, notRunning); err != nil {
		t.Fatal(err)
	}
	if out.String() != "out 1\nno newline" || errw.String() != "err "+strings.Repeat("z", 20)+"\n" {
		t.Errorf("stdout %q stderr %q", out.String(), errw.String())
	}
}
