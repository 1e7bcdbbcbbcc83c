package storage

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// etcdLogger returns a zap logger for etcd that passes entries of level min
// and above to log, so they are seen where Waggle's own logs are: for the
// embedded server its warnings and errors (disk-quota alarms, slow fsyncs,
// lost leaders, apply timeouts), for the client its errors (its warnings are
// one line per retried call during an outage). etcd's info chatter stays
// out. A nil log keeps etcd quiet.
func etcdLogger(log *slog.Logger, component string, min zapcore.Level) *zap.Logger {
	if log == nil {
		return zap.NewNop()
	}
	return zap.New(&slogCore{log: log.With("component", component), min: min})
}

// slogCore is a zapcore.Core writing entries to a slog.Logger.
type slogCore struct {
	log    *slog.Logger
	min    zapcore.Level
	fields []zapcore.Field
}

func (c *slogCore) Enabled(l zapcore.Level) bool { return l >= c.min }

func (c *slogCore) With(fields []zapcore.Field) zapcore.Core {
	return &slogCore{log: c.log, min: c.min, fields: append(append([]zapcore.Field(nil), c.fields...), fields...)}
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fields {
		f.AddTo(enc)
	}
	attrs := make([]slog.Attr, 0, len(enc.Fields)+1)
	if e.LoggerName != "" {
		attrs = append(attrs, slog.String("logger", e.LoggerName))
	}
	for k, v := range enc.Fields {
		attrs = append(attrs, slog.Any(k, v))
	}
	level := slog.LevelWarn
	if e.Level >= zapcore.ErrorLevel {
		level = slog.LevelError
	}
	c.log.LogAttrs(context.Background(), level, e.Message, attrs...)
	return nil
}

func (c *slogCore) Sync() error { return nil }

// expectedWarning tells the warnings that etcd gives about Waggle's own,
// deliberate configuration: the local client socket (plain gRPC on a unix
// socket in the 0700 data dir) beside certificate files meant for the TCP
// listeners.
func expectedWarning(msg string) bool {
	return strings.HasPrefix(msg, "scheme is http or unix while")
}

// silenced drops every entry once off is set, and the expected warnings.
type silenced struct {
	zapcore.Core
	off *atomic.Bool
}

func (s silenced) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if s.off.Load() || expectedWarning(e.Message) {
		return ce
	}
	return s.Core.Check(e, ce)
}

func (s silenced) With(fields []zapcore.Field) zapcore.Core {
	return silenced{Core: s.Core.With(fields), off: s.off}
}
