package main

import (
	"context"
	"errors"
)

// runAPIServer is being built (see the issue for `waggle apiserver`).
func runAPIServer(ctx context.Context, args []string) error {
	return errors.New("waggle apiserver is not built yet")
}
