package main

import (
	"context"
	"errors"
)

// runBPF is being built (see the issue for `waggle bpf`).
func runBPF(ctx context.Context, args []string) error {
	return errors.New("waggle bpf is not built yet")
}
