package kubelet

import (
	"fmt"
	"sort"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/api/resource"
)

// mountTmpfs mounts a tmpfs (mode 0777, of size limit when set) on dir
// unless one is mounted there already (a kubelet restart), and reports
// whether it mounted one.
func mountTmpfs(dir string, limit *resource.Quantity) (bool, error) {
	if mounted, err := mountinfo.Mounted(dir); err != nil {
		return false, err
	} else if mounted {
		return false, nil
	}
	opts := "mode=0777"
	if limit != nil && limit.Sign() > 0 {
		opts += fmt.Sprintf(",size=%d", limit.Value())
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return false, fmt.Errorf("mount tmpfs on %s: %w", dir, err)
	}
	return true, nil
}

// unmountUnder detaches every mount at or below dir (a pod's tmpfs
// volumes), deepest first, so the directory can be removed.
func unmountUnder(dir string) error {
	ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return fmt.Errorf("mounts under %s: %w", dir, err)
	}
	sort.Slice(ms, func(i, j int) bool { return len(ms[i].Mountpoint) > len(ms[j].Mountpoint) })
	for _, m := range ms {
		if err := unix.Unmount(m.Mountpoint, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
			return fmt.Errorf("unmount %s: %w", m.Mountpoint, err)
		}
	}
	return nil
}
