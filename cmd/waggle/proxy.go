package main

import (
	"context"
	"errors"
)

// runProxy is being built (see the issue for `waggle proxy`).
func runProxy(ctx context.Context, args []string) error {
	return errors.New("waggle proxy is not built yet")
}
