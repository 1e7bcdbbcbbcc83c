package kubelet

import (
	v1 "k8s.io/api/core/v1"
	"k8s.io/kubernetes/pkg/securitycontext"

	"github.com/waggle-io/waggle/kubelet/runtime"
)

// containerSecurity is the container's effective securityContext (the
// pod's, overridden field by field by the container's, through upstream's
// merge) in the runtime's terms, as the kubelet hands it to a CRI runtime:
// the pod's supplementalGroups and fsGroup become supplemental groups,
// allowPrivilegeEscalation: false sets no_new_privs, and the pod's sysctls
// apply to every container.
func containerSecurity(pod *v1.Pod, c *v1.Container) runtime.Security {
	var sec runtime.Security
	if sc := securitycontext.DetermineEffectiveSecurityContext(pod, c); sc != nil {
		sec.RunAsUser = sc.RunAsUser
		sec.RunAsGroup = sc.RunAsGroup
		sec.ReadOnlyRootfs = sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem
		sec.Privileged = sc.Privileged != nil && *sc.Privileged
		sec.NoNewPrivileges = securitycontext.AddNoNewPrivileges(sc)
		if caps := sc.Capabilities; caps != nil {
			for _, c := range caps.Add {
				sec.AddCaps = append(sec.AddCaps, string(c))
			}
			for _, c := range caps.Drop {
				sec.DropCaps = append(sec.DropCaps, string(c))
			}
		}
	}
	if psc := pod.Spec.SecurityContext; psc != nil {
		sec.SupplementalGroups = append(sec.SupplementalGroups, psc.SupplementalGroups...)
		if psc.FSGroup != nil {
			sec.SupplementalGroups = append(sec.SupplementalGroups, *psc.FSGroup)
		}
		if len(psc.Sysctls) > 0 {
			sec.Sysctls = make(map[string]string, len(psc.Sysctls))
			for _, s := range psc.Sysctls {
				sec.Sysctls[s.Name] = s.Value
			}
		}
	}
	return sec
}
