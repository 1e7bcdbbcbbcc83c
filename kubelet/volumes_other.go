//go:build !linux

package kubelet

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
)

func mountTmpfs(dir string, _ *resource.Quantity) (bool, error) {
	return false, fmt.Errorf("emptyDir medium Memory on %s: tmpfs volumes are supported on Linux only", dir)
}

func unmountUnder(string) error { return nil }
