package runtime

import (
	"context"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// securityOpts turns a container's Security into OCI spec options, applied
// after the image's config (which set the image's user and its groups), in
// the order containerd's CRI plugin applies a CRI security context: user,
// the user's groups from the image's /etc/group, supplemental groups,
// then privileges, capabilities, root filesystem and sysctls.
func securityOpts(sec Security) []oci.SpecOpts {
	var opts []oci.SpecOpts
	switch {
	case sec.RunAsUser != nil:
		uid := strconv.FormatInt(*sec.RunAsUser, 10)
		user := uid
		if sec.RunAsGroup != nil {
			user += ":" + strconv.FormatInt(*sec.RunAsGroup, 10)
		}
		// A bare uid takes its primary group from the image's /etc/passwd
		// (0 when the image has no entry), as a CRI runtime does.
		opts = append(opts, oci.WithUser(user), oci.WithAdditionalGIDs(uid))
	case sec.RunAsGroup != nil:
		// The image's user, with this primary group (the kubelet fills in
		// the image's user when only the group is set).
		gid := uint32(*sec.RunAsGroup)
		opts = append(opts, func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
			s.Process.User.GID = gid
			return nil
		})
	}
	if len(sec.SupplementalGroups) > 0 {
		groups := sec.SupplementalGroups
		opts = append(opts, func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
			for _, g := range groups {
				if gid := uint32(g); !slices.Contains(s.Process.User.AdditionalGids, gid) {
					s.Process.User.AdditionalGids = append(s.Process.User.AdditionalGids, gid)
				}
			}
			return nil
		})
	}
	if sec.Privileged {
		opts = append(opts, oci.WithPrivileged, oci.WithAllDevicesAllowed, oci.WithHostDevices)
	} else {
		opts = append(opts, capabilityOpts(sec.AddCaps, sec.DropCaps)...)
	}
	if sec.NoNewPrivileges {
		opts = append(opts, oci.WithNoNewPrivileges)
	}
	if sec.ReadOnlyRootfs {
		opts = append(opts, oci.WithRootFSReadonly())
	}
	if len(sec.Sysctls) > 0 {
		sysctls := sec.Sysctls
		opts = append(opts, func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
			if s.Linux == nil {
				s.Linux = &specs.Linux{}
			}
			if s.Linux.Sysctl == nil {
				s.Linux.Sysctl = map[string]string{}
			}
			for k, v := range sysctls {
				s.Linux.Sysctl[k] = v
			}
			return nil
		})
	}
	return opts
}

// capabilityOpts adds and drops capabilities as a CRI runtime does: "ALL"
// first (every capability the runtime has, or none), then the named ones,
// so add ALL + drop CHOWN is everything but CAP_CHOWN.
func capabilityOpts(add, drop []string) []oci.SpecOpts {
	if len(add) == 0 && len(drop) == 0 {
		return nil
	}
	isAll := func(c string) bool { return strings.EqualFold(c, "ALL") }
	var opts []oci.SpecOpts
	if slices.ContainsFunc(add, isAll) {
		opts = append(opts, oci.WithAllCurrentCapabilities)
	}
	if slices.ContainsFunc(drop, isAll) {
		opts = append(opts, oci.WithCapabilities(nil))
	}
	named := func(cs []string) []string {
		var out []string
		for _, c := range cs {
			if !isAll(c) {
				out = append(out, "CAP_"+strings.ToUpper(strings.TrimPrefix(strings.ToUpper(c), "CAP_")))
			}
		}
		return out
	}
	if a := named(add); len(a) > 0 {
		opts = append(opts, oci.WithAddedCapabilities(a))
	}
	if d := named(drop); len(d) > 0 {
		opts = append(opts, oci.WithDroppedCapabilities(d))
	}
	return opts
}
