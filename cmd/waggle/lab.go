package main

import (
	"context"
	"errors"
)

// runLab is being built (see the issue for `waggle lab`).
func runLab(ctx context.Context, args []string) error {
	return errors.New("waggle lab is not built yet")
}
