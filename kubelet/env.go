package kubelet

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podresource "k8s.io/kubernetes/pkg/api/v1/resource"
)

// fieldValue resolves a downward-API field path of pod.
func fieldValue(pod *v1.Pod, path string, podIPs []string, hostIP string) (string, error) {
	if k, ok := strings.CutPrefix(path, "metadata.labels['"); ok {
		return pod.Labels[strings.TrimSuffix(k, "']")], nil
	}
	if k, ok := strings.CutPrefix(path, "metadata.annotations['"); ok {
		return pod.Annotations[strings.TrimSuffix(k, "']")], nil
	}
	switch path {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "metadata.labels":
		return formatMap(pod.Labels), nil
	case "metadata.annotations":
		return formatMap(pod.Annotations), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP", "status.hostIPs":
		return hostIP, nil
	case "status.podIP":
		if len(podIPs) > 0 {
			return podIPs[0], nil
		}
		return "", nil
	case "status.podIPs":
		return strings.Join(podIPs, ","), nil
	}
	return "", fmt.Errorf("unsupported fieldRef %q", path)
}

// formatMap renders labels or annotations as the downward API does.
func formatMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sortStrings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s\n", k, strconv.Quote(m[k]))
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// resourceValue resolves a resourceFieldRef of container c as upstream's
// kubelet does: a limit the container does not set is the node's
// allocatable amount, the value is rounded up to a whole divisor.
func (k *Kubelet) resourceValue(c *v1.Container, ref *v1.ResourceFieldSelector) (string, error) {
	alloc := machineCapacity(k.cfg.RootDir, k.cfg.MaxPods)
	if n := k.node(); n != nil && len(n.Status.Allocatable) > 0 {
		alloc = n.Status.Allocatable
	}
	cc := c.DeepCopy()
	podresource.MergeContainerResourceLimits(cc, alloc)
	return podresource.ExtractContainerResourceValue(ref, cc)
}

// expand replaces $(VAR) with earlier variables' values, $$ with $, as
// Kubernetes expands env values, command and args.
func expand(s string, vars map[string]string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := vars[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// makeEnv resolves a container's env and envFrom.
func (k *Kubelet) makeEnv(ctx context.Context, pod *v1.Pod, c *v1.Container, sb *sandboxState) ([]string, error) {
	var podIPs []string
	if sb != nil {
		podIPs = sb.IPs
	}
	vars := map[string]string{}
	var order []string
	set := func(name, v string) {
		if _, ok := vars[name]; !ok {
			order = append(order, name)
		}
		vars[name] = v
	}
	cms := map[string]*v1.ConfigMap{}
	secrets := map[string]*v1.Secret{}
	getCM := func(name string) (*v1.ConfigMap, error) {
		if cm, ok := cms[name]; ok {
			return cm, nil
		}
		cm, err := k.client.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		cms[name] = cm
		return cm, nil
	}
	getSecret := func(name string) (*v1.Secret, error) {
		if s, ok := secrets[name]; ok {
			return s, nil
		}
		s, err := k.client.CoreV1().Secrets(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		secrets[name] = s
		return s, nil
	}
	optional := func(b *bool) bool { return b != nil && *b }
	links := pod.Spec.EnableServiceLinks == nil || *pod.Spec.EnableServiceLinks
	svcEnv, svcOrder := serviceEnv(k.services, pod.Namespace, links, metav1.NamespaceDefault)
	// $(VAR) may name a Service variable; the pod's own variables win.
	lookup := func() map[string]string {
		m := make(map[string]string, len(svcEnv)+len(vars))
		for n, v := range svcEnv {
			m[n] = v
		}
		for n, v := range vars {
			m[n] = v
		}
		return m
	}
	for _, ef := range c.EnvFrom {
		switch {
		case ef.ConfigMapRef != nil:
			cm, err := getCM(ef.ConfigMapRef.Name)
			if err != nil {
				if optional(ef.ConfigMapRef.Optional) {
					continue
				}
				return nil, fmt.Errorf("configmap %q: %w", ef.ConfigMapRef.Name, err)
			}
			for key, v := range cm.Data {
				set(ef.Prefix+key, v)
			}
		case ef.SecretRef != nil:
			s, err := getSecret(ef.SecretRef.Name)
			if err != nil {
				if optional(ef.SecretRef.Optional) {
					continue
				}
				return nil, fmt.Errorf("secret %q: %w", ef.SecretRef.Name, err)
			}
			for key, v := range s.Data {
				set(ef.Prefix+key, string(v))
			}
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			v := e.Value
			if strings.Contains(v, "$") {
				v = expand(v, lookup())
			}
			set(e.Name, v)
			continue
		}
		vf := e.ValueFrom
		switch {
		case vf.FieldRef != nil:
			v, err := fieldValue(pod, vf.FieldRef.FieldPath, podIPs, k.nodeIP)
			if err != nil {
				return nil, fmt.Errorf("env %s: %w", e.Name, err)
			}
			set(e.Name, v)
		case vf.ResourceFieldRef != nil:
			v, err := k.resourceValue(c, vf.ResourceFieldRef)
			if err != nil {
				return nil, fmt.Errorf("env %s: %w", e.Name, err)
			}
			set(e.Name, v)
		case vf.ConfigMapKeyRef != nil:
			ref := vf.ConfigMapKeyRef
			cm, err := getCM(ref.Name)
			if err != nil {
				if optional(ref.Optional) {
					continue
				}
				return nil, fmt.Errorf("env %s: configmap %q: %w", e.Name, ref.Name, err)
			}
			v, ok := cm.Data[ref.Key]
			if !ok {
				if optional(ref.Optional) {
					continue
				}
				return nil, fmt.Errorf("env %s: configmap %q has no key %q", e.Name, ref.Name, ref.Key)
			}
			set(e.Name, v)
		case vf.SecretKeyRef != nil:
			ref := vf.SecretKeyRef
			s, err := getSecret(ref.Name)
			if err != nil {
				if optional(ref.Optional) {
					continue
				}
				return nil, fmt.Errorf("env %s: secret %q: %w", e.Name, ref.Name, err)
			}
			v, ok := s.Data[ref.Key]
			if !ok {
				if optional(ref.Optional) {
					continue
				}
				return nil, fmt.Errorf("env %s: secret %q has no key %q", e.Name, ref.Name, ref.Key)
			}
			set(e.Name, string(v))
		}
	}
	for _, n := range svcOrder {
		if _, own := vars[n]; !own {
			set(n, svcEnv[n])
		}
	}
	out := make([]string, 0, len(order))
	for _, n := range order {
		out = append(out, n+"="+vars[n])
	}
	// Command and args are expanded too (Kubernetes does it at start).
	for i := range c.Command {
		c.Command[i] = expand(c.Command[i], vars)
	}
	for i := range c.Args {
		c.Args[i] = expand(c.Args[i], vars)
	}
	return out, nil
}
