package storage

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

func TestEtcdWarningsReachSlogAndInfoDoesNot(t *testing.T) {
	var buf bytes.Buffer
	zl := etcdLogger(slog.New(slog.NewJSONHandler(&buf, nil)), "etcd", zapcore.WarnLevel).With(zap.String("member", "waggle"))
	zl.Info("ready to serve client requests")
	zl.Warn("slow fdatasync", zap.Duration("took", 1500e6), zap.String("expected-duration", "1s"))
	zl.Error("alarm raised", zap.String("alarm", "NOSPACE"))
	out := buf.String()
	if strings.Contains(out, "ready to serve") {
		t.Errorf("info line passed through:\n%s", out)
	}
	for _, want := range []string{`"level":"WARN"`, `"msg":"slow fdatasync"`, `"took":1500000000`, `"member":"waggle"`, `"component":"etcd"`, `"level":"ERROR"`, `"alarm":"NOSPACE"`} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %s in:\n%s", want, out)
		}
	}
}

// The embedded etcd's listeners report their own shutdown as errors; a
// closed Embedded logs nothing of that.
func TestClosingEmbeddedEtcdLogsNoErrors(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ec, _ := embeddedTLS(t, t.TempDir())
	ec.Log = log
	e, err := StartEmbedded(context.Background(), ec)
	if err != nil {
		t.Fatal(err)
	}
	e.Close()
	if strings.Contains(buf.String(), "level=ERROR") {
		t.Fatalf("errors logged while closing:\n%s", buf.String())
	}
}
