// Package containerlog is the CRI container log format, as upstream's
// kubelet reads it and containerd's CRI plugin writes it: one record per
// line,
//
//	2016-10-06T00:17:09.669794202Z stdout F log content
//	<RFC3339Nano timestamp> <stdout|stderr> <F|P> <content>
//
// F ends a line of the container's output, P is a piece of a longer line
// (split every MaxLineSize bytes, or an unterminated line at the end of the
// stream) whose rest follows in later records of the same stream.
//
// The package holds the writer (Copy, and RunLogger: the `waggle
// container-logger` process the containerd shim starts for each container,
// which outlives kubelet restarts) and the reader (Read: the kubelet API's
// logs with follow, tail, limitBytes, since and timestamps; attach; the
// termination message's log fallback). It is not the runtime: which process
// writes which file is decided in kubelet/runtime.
package containerlog

import (
	"bytes"
	"errors"
	"fmt"
	"time"
)

// Stream is the stream a record came from.
type Stream string

// The streams of a container's log.
const (
	Stdout Stream = "stdout"
	Stderr Stream = "stderr"
)

// Tags of a record: a full line's end, or a partial line.
const (
	tagFull    = "F"
	tagPartial = "P"
)

// MaxLineSize is where a long line is split into partial records, as
// containerd's CRI plugin does (max_container_log_line_size, 16 KiB).
const MaxLineSize = 16 << 10

// TimeFormat is how the writer stamps records (containerd writes
// time.RFC3339Nano); TimeFormatOut is how --timestamps prints them
// (upstream's kubelet prints a fixed-width form).
const (
	TimeFormat    = time.RFC3339Nano
	TimeFormatOut = "2006-01-02T15:04:05.000000000Z07:00"
)

// Record is one line of a log file.
type Record struct {
	Time   time.Time
	Stream Stream
	// Partial is set on a piece of a line whose rest follows.
	Partial bool
	// Content is the record's text, without the line's newline.
	Content []byte
}

// ErrFormat is returned for a line that is not a CRI log record.
var ErrFormat = errors.New("not a CRI log record")

// Append appends the record's line, newline included, to b.
func (r Record) Append(b []byte) []byte {
	b = r.Time.AppendFormat(b, TimeFormat)
	b = append(b, ' ')
	b = append(b, r.Stream...)
	b = append(b, ' ')
	if r.Partial {
		b = append(b, tagPartial...)
	} else {
		b = append(b, tagFull...)
	}
	b = append(b, ' ')
	b = append(b, r.Content...)
	return append(b, '\n')
}

// Parse reads one line of a log file (with or without its newline). Content
// aliases line. As upstream, only the first of a ':'-separated tag list
// counts, so later tags stay compatible.
func Parse(line []byte) (Record, error) {
	line = bytes.TrimSuffix(line, []byte{'\n'})
	var r Record
	ts, rest, ok := bytes.Cut(line, []byte{' '})
	if !ok {
		return r, fmt.Errorf("%w: no timestamp", ErrFormat)
	}
	t, err := time.Parse(time.RFC3339Nano, string(ts))
	if err != nil {
		return r, fmt.Errorf("%w: timestamp %q", ErrFormat, ts)
	}
	stream, rest, ok := bytes.Cut(rest, []byte{' '})
	if !ok || (Stream(stream) != Stdout && Stream(stream) != Stderr) {
		return r, fmt.Errorf("%w: stream %q", ErrFormat, stream)
	}
	tags, content, ok := bytes.Cut(rest, []byte{' '})
	if !ok {
		return r, fmt.Errorf("%w: no tag", ErrFormat)
	}
	tag, _, _ := bytes.Cut(tags, []byte{':'})
	return Record{Time: t, Stream: Stream(stream), Partial: string(tag) == tagPartial, Content: content}, nil
}
