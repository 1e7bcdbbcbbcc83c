package main

import (
	"context"
	"errors"
)

// runControllerManager is being built (see the issue for `waggle controller-manager`).
func runControllerManager(ctx context.Context, args []string) error {
	return errors.New("waggle controller-manager is not built yet")
}
