//go:build !linux

package lab

import (
	"context"
	"errors"
	"io"
	"time"
)

var errLinuxOnly = errors.New("the lab needs Linux (network namespaces, cgroup v2, BPF)")

// Up is Linux-only.
func Up(context.Context, Config, io.Writer) error { return errLinuxOnly }

// Down is Linux-only.
func Down(context.Context, string, io.Writer) error { return errLinuxOnly }

// Status is Linux-only.
func Status(context.Context, string, io.Writer) error { return errLinuxOnly }

// Join is Linux-only.
func Join(context.Context, string, io.Writer) (string, error) { return "", errLinuxOnly }

// Stop is Linux-only.
func Stop(string, string, string) error { return errLinuxOnly }

// Restart is Linux-only.
func Restart(string, string, string) error { return errLinuxOnly }

// RunHAScenario is Linux-only.
func RunHAScenario(context.Context, string, string, time.Duration, time.Duration, io.Writer) (*HAResult, error) {
	return nil, errLinuxOnly
}

// Exec is Linux-only.
func Exec(context.Context, string, string, []string, io.Reader, io.Writer, io.Writer) error {
	return errLinuxOnly
}
