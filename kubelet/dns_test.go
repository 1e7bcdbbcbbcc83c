package kubelet

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

func dnsKubelet(t *testing.T, clusterDNS ...string) *Kubelet {
	host := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(host, []byte("# host\nnameserver 192.0.2.53\nsearch corp.example lab.example\noptions edns0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return &Kubelet{cfg: Config{ClusterDNS: clusterDNS, ClusterDomain: "cluster.local", ResolvConf: host}, log: slog.New(slog.DiscardHandler)}
}

func TestPodResolvConfPerDNSPolicy(t *testing.T) {
	k := dnsKubelet(t, "10.96.0.10")
	pod := func(mut func(*v1.Pod)) *v1.Pod {
		p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "prod"}}
		mut(p)
		return p
	}
	cluster := "search prod.svc.cluster.local svc.cluster.local cluster.local corp.example lab.example\nnameserver 10.96.0.10\noptions ndots:5\n"
	host := "search corp.example lab.example\nnameserver 192.0.2.53\noptions edns0\n"
	for _, tc := range []struct {
		name string
		k    *Kubelet
		pod  *v1.Pod
		want string
	}{
		{"default policy is ClusterFirst", k, pod(func(*v1.Pod) {}), cluster},
		{"ClusterFirst", k, pod(func(p *v1.Pod) { p.Spec.DNSPolicy = v1.DNSClusterFirst }), cluster},
		{"ClusterFirst with hostNetwork is Default", k, pod(func(p *v1.Pod) { p.Spec.HostNetwork = true }), host},
		{"ClusterFirstWithHostNet", k, pod(func(p *v1.Pod) { p.Spec.HostNetwork, p.Spec.DNSPolicy = true, v1.DNSClusterFirstWithHostNet }), cluster},
		{"Default", k, pod(func(p *v1.Pod) { p.Spec.DNSPolicy = v1.DNSDefault }), host},
		{"no --cluster-dns falls back to Default", dnsKubelet(t), pod(func(*v1.Pod) {}), host},
		{"None with dnsConfig", k, pod(func(p *v1.Pod) {
			p.Spec.DNSPolicy = v1.DNSNone
			p.Spec.DNSConfig = &v1.PodDNSConfig{Nameservers: []string{"1.1.1.1"}, Searches: []string{"a.example"},
				Options: []v1.PodDNSConfigOption{{Name: "ndots", Value: ptr.To("2")}, {Name: "rotate"}}}
		}), "search a.example\nnameserver 1.1.1.1\noptions ndots:2 rotate\n"},
		{"ClusterFirst merged with dnsConfig", k, pod(func(p *v1.Pod) {
			p.Spec.DNSConfig = &v1.PodDNSConfig{Nameservers: []string{"10.96.0.10", "1.1.1.1"}, Searches: []string{"svc.cluster.local", "x.example"},
				Options: []v1.PodDNSConfigOption{{Name: "ndots", Value: ptr.To("1")}, {Name: "edns0"}}}
		}), "search prod.svc.cluster.local svc.cluster.local cluster.local corp.example lab.example x.example\nnameserver 10.96.0.10\nnameserver 1.1.1.1\noptions ndots:1 edns0\n"},
		{"at most three nameservers", k, pod(func(p *v1.Pod) {
			p.Spec.DNSConfig = &v1.PodDNSConfig{Nameservers: []string{"1.1.1.1", "8.8.8.8", "9.9.9.9"}}
		}), "search prod.svc.cluster.local svc.cluster.local cluster.local corp.example lab.example\nnameserver 10.96.0.10\nnameserver 1.1.1.1\nnameserver 8.8.8.8\noptions ndots:5\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.k.podDNS(tc.pod).String(); got != tc.want {
				t.Errorf("resolv.conf\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

func TestPodHostsFile(t *testing.T) {
	k := dnsKubelet(t, "10.96.0.10")
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "prod"}, Spec: v1.PodSpec{
		Hostname: "web-0", Subdomain: "web",
		HostAliases: []v1.HostAlias{{IP: "192.0.2.9", Hostnames: []string{"foo.local", "bar.local"}}}}}
	got := string(k.hostsFile(p, []string{"10.244.0.7"}))
	for _, want := range []string{"# Kubernetes-managed hosts file.\n", "127.0.0.1\tlocalhost\n",
		"10.244.0.7\tweb-0.web.prod.svc.cluster.local\tweb-0\n", "# Entries added by HostAliases.\n192.0.2.9\tfoo.local\tbar.local\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("hosts file lacks %q:\n%s", want, got)
		}
	}
	p.Spec.Subdomain = ""
	if got := string(k.hostsFile(p, []string{"10.244.0.7"})); !strings.Contains(got, "10.244.0.7\tweb-0\n") {
		t.Errorf("hosts without subdomain:\n%s", got)
	}
}

func services(t *testing.T, svcs ...*v1.Service) corelisters.ServiceLister {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, s := range svcs {
		if err := idx.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	return corelisters.NewServiceLister(idx)
}

func TestServiceEnvironmentVariables(t *testing.T) {
	l := services(t,
		&v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: "default"}, Spec: v1.ServiceSpec{ClusterIP: "10.96.0.1",
			Ports: []v1.ServicePort{{Name: "https", Port: 443, Protocol: v1.ProtocolTCP}}}},
		&v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "redis-primary", Namespace: "prod"}, Spec: v1.ServiceSpec{ClusterIP: "10.96.3.4",
			Ports: []v1.ServicePort{{Name: "redis", Port: 6379}, {Name: "metrics-udp", Port: 9121, Protocol: v1.ProtocolUDP}}}},
		&v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "headless", Namespace: "prod"}, Spec: v1.ServiceSpec{ClusterIP: v1.ClusterIPNone,
			Ports: []v1.ServicePort{{Port: 80}}}},
		&v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: "dev"}, Spec: v1.ServiceSpec{ClusterIP: "10.96.9.9",
			Ports: []v1.ServicePort{{Port: 80}}}},
	)
	env, _ := serviceEnv(l, "prod", true, "default")
	for k, v := range map[string]string{
		"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443", "KUBERNETES_SERVICE_PORT_HTTPS": "443",
		"KUBERNETES_PORT": "tcp://10.96.0.1:443", "KUBERNETES_PORT_443_TCP": "tcp://10.96.0.1:443",
		"KUBERNETES_PORT_443_TCP_PROTO": "tcp", "KUBERNETES_PORT_443_TCP_PORT": "443", "KUBERNETES_PORT_443_TCP_ADDR": "10.96.0.1",
		"REDIS_PRIMARY_SERVICE_HOST": "10.96.3.4", "REDIS_PRIMARY_SERVICE_PORT": "6379", "REDIS_PRIMARY_SERVICE_PORT_REDIS": "6379",
		"REDIS_PRIMARY_SERVICE_PORT_METRICS_UDP": "9121", "REDIS_PRIMARY_PORT": "tcp://10.96.3.4:6379",
		"REDIS_PRIMARY_PORT_9121_UDP": "udp://10.96.3.4:9121", "REDIS_PRIMARY_PORT_9121_UDP_PROTO": "udp",
	} {
		if env[k] != v {
			t.Errorf("%s = %q, want %q", k, env[k], v)
		}
	}
	for k := range env {
		if strings.HasPrefix(k, "HEADLESS_") || strings.HasPrefix(k, "OTHER_") {
			t.Errorf("unexpected %s", k)
		}
	}
	// enableServiceLinks: false keeps only the API server's variables.
	env, _ = serviceEnv(l, "prod", false, "default")
	if env["KUBERNETES_SERVICE_HOST"] != "10.96.0.1" || env["REDIS_PRIMARY_SERVICE_HOST"] != "" {
		t.Errorf("links disabled: %v", env)
	}
}

func TestPodEnvServiceVariablesLoseToOwnAndExpand(t *testing.T) {
	k := dnsKubelet(t)
	k.services = services(t, &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "prod"},
		Spec: v1.ServiceSpec{ClusterIP: "10.96.3.5", Ports: []v1.ServicePort{{Port: 5432}}}})
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "prod"}}
	c := &v1.Container{Env: []v1.EnvVar{{Name: "DB_SERVICE_PORT", Value: "1"}, {Name: "URL", Value: "pg://$(DB_SERVICE_HOST):5432"}}}
	env, err := k.makeEnv(t.Context(), p, c, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(env, "\n")
	for _, want := range []string{"DB_SERVICE_PORT=1", "URL=pg://10.96.3.5:5432", "DB_SERVICE_HOST=10.96.3.5"} {
		if !strings.Contains(got+"\n", want+"\n") {
			t.Errorf("env lacks %s:\n%s", want, got)
		}
	}
	if strings.Count(got, "DB_SERVICE_PORT=") != 1 {
		t.Errorf("DB_SERVICE_PORT set twice:\n%s", got)
	}
}
