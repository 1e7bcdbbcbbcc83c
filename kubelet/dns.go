package kubelet

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
)

// Upstream's limits on a pod's resolver configuration.
const (
	maxDNSNameservers     = 3
	maxDNSSearchPaths     = 32
	maxDNSSearchListChars = 2048
)

// resolvConf is a parsed or generated resolv.conf.
type resolvConf struct {
	nameservers, searches, options []string
}

func parseResolvConf(data []byte) resolvConf {
	var rc resolvConf
	for _, line := range strings.Split(string(data), "\n") {
		if i := strings.IndexAny(line, "#;"); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "nameserver":
			if len(f) > 1 {
				rc.nameservers = append(rc.nameservers, f[1])
			}
		case "search", "domain":
			rc.searches = f[1:] // the last search/domain line wins, as in glibc
		case "options":
			rc.options = append(rc.options, f[1:]...)
		}
	}
	return rc
}

func (rc resolvConf) String() string {
	var b strings.Builder
	if len(rc.searches) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(rc.searches, " "))
	}
	for _, ns := range rc.nameservers {
		fmt.Fprintf(&b, "nameserver %s\n", ns)
	}
	if len(rc.options) > 0 {
		fmt.Fprintf(&b, "options %s\n", strings.Join(rc.options, " "))
	}
	return b.String()
}

// hostResolvConf reads the node's resolver configuration (--resolv-conf);
// a systemd-resolved stub (127.0.0.53, unreachable from a pod) is replaced
// by the upstreams resolved uses, as kubeadm points the kubelet at them.
func (k *Kubelet) hostResolvConf() resolvConf {
	path := k.cfg.ResolvConf
	if path == "" {
		return resolvConf{}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		k.log.Warn("read --resolv-conf", "path", path, "err", err)
		return resolvConf{}
	}
	rc := parseResolvConf(b)
	if slices.Contains(rc.nameservers, "127.0.0.53") {
		if real, err := os.ReadFile("/run/systemd/resolve/resolv.conf"); err == nil {
			rc.nameservers = parseResolvConf(real).nameservers
		}
	}
	return rc
}

// podDNS is the resolv.conf of pod per its dnsPolicy and dnsConfig, as the
// upstream kubelet writes it.
func (k *Kubelet) podDNS(pod *v1.Pod) resolvConf {
	policy := pod.Spec.DNSPolicy
	if policy == "" {
		policy = v1.DNSClusterFirst
	}
	if policy == v1.DNSClusterFirst && pod.Spec.HostNetwork {
		policy = v1.DNSDefault
	}
	if (policy == v1.DNSClusterFirst || policy == v1.DNSClusterFirstWithHostNet) && len(k.cfg.ClusterDNS) == 0 {
		k.log.Warn("no --cluster-dns: pod falls back to the node's resolvers", "pod", pod.Namespace+"/"+pod.Name)
		policy = v1.DNSDefault
	}
	var rc resolvConf
	switch policy {
	case v1.DNSClusterFirst, v1.DNSClusterFirstWithHostNet:
		host := k.hostResolvConf()
		d := strings.TrimSuffix(k.cfg.ClusterDomain, ".")
		rc.nameservers = append([]string(nil), k.cfg.ClusterDNS...)
		rc.searches = append([]string{pod.Namespace + ".svc." + d, "svc." + d, d}, host.searches...)
		rc.options = []string{"ndots:5"}
	case v1.DNSDefault:
		rc = k.hostResolvConf()
	case v1.DNSNone:
	}
	if c := pod.Spec.DNSConfig; c != nil {
		rc.nameservers = dedupe(append(rc.nameservers, c.Nameservers...))
		rc.searches = dedupe(append(rc.searches, c.Searches...))
		rc.options = mergeOptions(rc.options, c.Options)
	}
	if len(rc.nameservers) > maxDNSNameservers {
		rc.nameservers = rc.nameservers[:maxDNSNameservers]
	}
	if len(rc.searches) > maxDNSSearchPaths {
		rc.searches = rc.searches[:maxDNSSearchPaths]
	}
	for len(strings.Join(rc.searches, " ")) > maxDNSSearchListChars {
		rc.searches = rc.searches[:len(rc.searches)-1]
	}
	return rc
}

func dedupe(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range in {
		if s != "" && !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// mergeOptions applies dnsConfig options over the generated ones: one option
// per name, the pod's value winning.
func mergeOptions(base []string, extra []v1.PodDNSConfigOption) []string {
	var names []string
	vals := map[string]string{}
	add := func(name, val string) {
		if _, ok := vals[name]; !ok {
			names = append(names, name)
		}
		vals[name] = val
	}
	for _, o := range base {
		name, val, _ := strings.Cut(o, ":")
		add(name, val)
	}
	for _, o := range extra {
		val := ""
		if o.Value != nil {
			val = *o.Value
		}
		add(o.Name, val)
	}
	out := make([]string, 0, len(names))
	for _, n := range names {
		if vals[n] == "" {
			out = append(out, n)
		} else {
			out = append(out, n+":"+vals[n])
		}
	}
	return out
}

// hostsFile is the pod's /etc/hosts, as the upstream kubelet manages it.
func (k *Kubelet) hostsFile(pod *v1.Pod, podIPs []string) []byte {
	var b bytes.Buffer
	if pod.Spec.HostNetwork {
		b.WriteString("# Kubernetes-managed hosts file (host network).\n")
		if host, err := os.ReadFile("/etc/hosts"); err == nil {
			b.Write(host)
			if len(host) > 0 && host[len(host)-1] != '\n' {
				b.WriteByte('\n')
			}
		}
	} else {
		b.WriteString("# Kubernetes-managed hosts file.\n")
		b.WriteString("127.0.0.1\tlocalhost\n")
		b.WriteString("::1\tlocalhost ip6-localhost ip6-loopback\n")
		b.WriteString("fe00::0\tip6-localnet\n")
		b.WriteString("fe00::0\tip6-mcastprefix\n")
		b.WriteString("fe00::1\tip6-allnodes\n")
		b.WriteString("fe00::2\tip6-allrouters\n")
		host := podHostname(pod)
		for _, ip := range podIPs {
			if pod.Spec.Subdomain != "" {
				fmt.Fprintf(&b, "%s\t%s.%s.%s.svc.%s\t%s\n", ip, host, pod.Spec.Subdomain, pod.Namespace, strings.TrimSuffix(k.cfg.ClusterDomain, "."), host)
			} else {
				fmt.Fprintf(&b, "%s\t%s\n", ip, host)
			}
		}
	}
	if len(pod.Spec.HostAliases) > 0 {
		b.WriteString("\n# Entries added by HostAliases.\n")
		for _, a := range pod.Spec.HostAliases {
			fmt.Fprintf(&b, "%s\t%s\n", a.IP, strings.Join(a.Hostnames, "\t"))
		}
	}
	return b.Bytes()
}

// writePodNetworkFiles writes the pod's hosts and resolv.conf under its
// directory and returns the mounts that put them in a container (unless the
// container mounts something of its own there).
func (k *Kubelet) writePodNetworkFiles(pod *v1.Pod, c *v1.Container, podIPs []string) ([]mountFile, error) {
	dir := k.podDir(pod.UID)
	files := []mountFile{
		{host: filepath.Join(dir, "etc-hosts"), container: "/etc/hosts", data: k.hostsFile(pod, podIPs)},
		{host: filepath.Join(dir, "resolv.conf"), container: "/etc/resolv.conf", data: []byte(k.podDNS(pod).String())},
	}
	var out []mountFile
	for _, f := range files {
		if slices.ContainsFunc(c.VolumeMounts, func(m v1.VolumeMount) bool { return filepath.Clean(m.MountPath) == f.container }) {
			continue
		}
		if err := writeFileAtomic(f.host, f.data, 0o644); err != nil {
			return nil, fmt.Errorf("write %s: %w", f.container, err)
		}
		out = append(out, f)
	}
	return out, nil
}

type mountFile struct {
	host, container string
	data            []byte
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, data) {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// serviceEnv returns the Service environment variables of a pod in ns:
// every Service of its namespace with a ClusterIP when links are enabled,
// and the API server's `kubernetes` Service always, in docker-link style
// as the upstream kubelet does.
func serviceEnv(lister corelisters.ServiceLister, ns string, enableLinks bool, masterNS string) (map[string]string, []string) {
	env := map[string]string{}
	var order []string
	if lister == nil {
		return env, nil
	}
	byName := map[string]*v1.Service{}
	if enableLinks {
		list, _ := lister.Services(ns).List(labels.Everything())
		for _, s := range list {
			byName[s.Name] = s
		}
	}
	if s, err := lister.Services(masterNS).Get("kubernetes"); err == nil {
		if _, taken := byName["kubernetes"]; !taken || ns == masterNS {
			byName["kubernetes"] = s
		}
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)
	set := func(k, v string) {
		if _, ok := env[k]; !ok {
			order = append(order, k)
		}
		env[k] = v
	}
	for _, n := range names {
		s := byName[n]
		ip := s.Spec.ClusterIP
		if ip == "" || ip == v1.ClusterIPNone || s.Spec.Type == v1.ServiceTypeExternalName || len(s.Spec.Ports) == 0 {
			continue
		}
		prefix := envName(s.Name)
		set(prefix+"_SERVICE_HOST", ip)
		set(prefix+"_SERVICE_PORT", strconv.Itoa(int(s.Spec.Ports[0].Port)))
		for _, p := range s.Spec.Ports {
			if p.Name != "" {
				set(prefix+"_SERVICE_PORT_"+envName(p.Name), strconv.Itoa(int(p.Port)))
			}
		}
		first := s.Spec.Ports[0]
		hostPort := ip
		if strings.Contains(ip, ":") {
			hostPort = "[" + ip + "]"
		}
		set(prefix+"_PORT", fmt.Sprintf("%s://%s:%d", strings.ToLower(string(proto(first.Protocol))), hostPort, first.Port))
		for _, p := range s.Spec.Ports {
			pr := strings.ToLower(string(proto(p.Protocol)))
			base := fmt.Sprintf("%s_PORT_%d_%s", prefix, p.Port, strings.ToUpper(pr))
			set(base, fmt.Sprintf("%s://%s:%d", pr, hostPort, p.Port))
			set(base+"_PROTO", pr)
			set(base+"_PORT", strconv.Itoa(int(p.Port)))
			set(base+"_ADDR", ip)
		}
	}
	return env, order
}

func proto(p v1.Protocol) v1.Protocol {
	if p == "" {
		return v1.ProtocolTCP
	}
	return p
}

func envName(s string) string {
	return strings.ToUpper(strings.ReplaceAll(s, "-", "_"))
}
