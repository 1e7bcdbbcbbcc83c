package main

import (
	"context"
	"errors"
)

// runBench is being built (see the issue for `waggle bench`).
func runBench(ctx context.Context, args []string) error {
	return errors.New("waggle bench is not built yet")
}
