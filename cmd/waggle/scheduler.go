package main

import (
	"context"
	"errors"
)

// runScheduler is being built (see the issue for `waggle scheduler`).
func runScheduler(ctx context.Context, args []string) error {
	return errors.New("waggle scheduler is not built yet")
}
