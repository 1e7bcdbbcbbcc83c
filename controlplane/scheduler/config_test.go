package scheduler

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/waggle-io/waggle/internal/leaderelect"
)

func TestRunRejectsBadConfigClearly(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte("this is not a kubeconfig: ["), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		cfg  Config
		want error
	}{
		{"no kubeconfig", Config{}, ErrConfig},
		{"unparsable kubeconfig", Config{Kubeconfig: kc}, ErrConfig},
		{"missing kubeconfig", Config{Kubeconfig: filepath.Join(t.TempDir(), "absent")}, ErrConfig},
		{"bad log level", Config{Kubeconfig: kc, LogLevel: "loud"}, ErrConfig},
		{"lease shorter than renew deadline", Config{Master: "https://127.0.0.1:1", LeaderElection: leaderelect.Config{
			Enabled: true, LeaseName: "s", LeaseNamespace: "kube-system", LeaseDuration: time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: time.Second,
		}}, leaderelect.ErrInvalidConfig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := Run(ctx, tt.cfg); !errors.Is(err, tt.want) {
				t.Fatalf("Run = %v, want %v", err, tt.want)
			}
		})
	}
}
