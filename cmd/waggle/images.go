package main

import (
	"context"
	"errors"
)

// runImages is being built (see the issue for `waggle images`).
func runImages(ctx context.Context, args []string) error {
	return errors.New("waggle images is not built yet")
}
