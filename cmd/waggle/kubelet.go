package main

import (
	"context"
	"errors"
)

// runKubelet is being built (see the issue for `waggle kubelet`).
func runKubelet(ctx context.Context, args []string) error {
	return errors.New("waggle kubelet is not built yet")
}
