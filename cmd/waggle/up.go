package main

import (
	"context"
	"errors"
)

// runUp is being built (see the issue for `waggle up`).
func runUp(ctx context.Context, args []string) error {
	return errors.New("waggle up is not built yet")
}
