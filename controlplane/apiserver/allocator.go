package apiserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"math/rand/v2"
	"net/netip"
	"strconv"
	"strings"
	"sync"

	"github.com/waggle-io/waggle/controlplane/storage"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// allocator hands out the values of a range (service ClusterIPs, NodePorts)
// with one etcd key per allocated value under /registry/ranges/<name>/,
// created with a create-if-absent transaction: two API servers sharing etcd
// can never hand out the same value, and a crash between allocating and
// storing the Service leaves a key that the repair loop reclaims.
type allocator struct {
	name   string
	prefix string
	// size is the number of offsets; value/offset convert.
	size   int
	first  int // lowest offset handed out dynamically
	value  func(offset int) string
	offset func(v string) (int, bool)
	store  *storage.Store
	log    *slog.Logger

	mu      sync.Mutex
	suspect map[string]bool // keys without owner seen by the last repair
}

// ErrRangeFull: no free value is left.
var ErrRangeFull = errors.New("range is full")

func newIPAllocator(cidr string, store *storage.Store, log *slog.Logger) (*allocator, error) {
	pfx, err := netip.ParsePrefix(cidr)
	if err != nil || !pfx.Addr().Is4() {
		return nil, fmt.Errorf("service cluster IP range %q: must be an IPv4 CIDR", cidr)
	}
	pfx = pfx.Masked()
	bits := 32 - pfx.Bits()
	if bits < 2 || bits > 24 {
		return nil, fmt.Errorf("service cluster IP range %q: prefix length must be between /8 and /30", cidr)
	}
	base := new(big.Int).SetBytes(pfx.Addr().AsSlice())
	size := 1 << bits
	a := &allocator{
		name: "serviceips", prefix: "/registry/ranges/serviceips/", size: size - 1, store: store, log: log,
		first: min(16, size/4) + 1, suspect: map[string]bool{},
	}
	a.value = func(off int) string {
		v := new(big.Int).Add(base, big.NewInt(int64(off))).Bytes()
		var b [4]byte
		copy(b[4-len(v):], v)
		return netip.AddrFrom4(b).String()
	}
	a.offset = func(s string) (int, bool) {
		ip, err := netip.ParseAddr(s)
		if err != nil || !pfx.Contains(ip) {
			return 0, false
		}
		off := int(new(big.Int).Sub(new(big.Int).SetBytes(ip.AsSlice()), base).Int64())
		return off, off >= 1 && off < size-1 // not the network or broadcast address
	}
	return a, nil
}

func newPortAllocator(rng string, store *storage.Store, log *slog.Logger) (*allocator, error) {
	lo, hi, ok := strings.Cut(rng, "-")
	l, err1 := strconv.Atoi(strings.TrimSpace(lo))
	h, err2 := strconv.Atoi(strings.TrimSpace(hi))
	if !ok || err1 != nil || err2 != nil || l < 1 || h > 65535 || l > h {
		return nil, fmt.Errorf("service node port range %q: want FIRST-LAST within 1-65535", rng)
	}
	a := &allocator{
		name: "servicenodeports", prefix: "/registry/ranges/servicenodeports/", size: h - l + 1, store: store, log: log,
		suspect: map[string]bool{},
	}
	a.value = func(off int) string { return strconv.Itoa(l + off) }
	a.offset = func(s string) (int, bool) {
		p, err := strconv.Atoi(s)
		return p - l, err == nil && p >= l && p <= h
	}
	return a, nil
}

func (a *allocator) key(v string) string { return a.prefix + v }

// Allocate reserves a free value for owner.
func (a *allocator) Allocate(ctx context.Context, owner string) (string, error) {
	span := a.size - a.first
	if span <= 0 {
		return "", ErrRangeFull
	}
	start := rand.IntN(span)
	// Probe from a random point; give up scanning after a bounded number of
	// round-trips and fall back to a listing of what is taken.
	for i := 0; i < min(span, 64); i++ {
		v := a.value(a.first + (start+i)%span)
		if _, err := a.store.Create(ctx, a.key(v), []byte(owner)); err == nil {
			return v, nil
		} else if !errors.Is(err, storage.ErrExists) {
			return "", err
		}
	}
	taken, err := a.taken(ctx)
	if err != nil {
		return "", err
	}
	for i := 0; i < span; i++ {
		v := a.value(a.first + (start+i)%span)
		if _, ok := taken[v]; ok {
			continue
		}
		if _, err := a.store.Create(ctx, a.key(v), []byte(owner)); err == nil {
			return v, nil
		} else if !errors.Is(err, storage.ErrExists) {
			return "", err
		}
	}
	return "", ErrRangeFull
}

// AllocateSpecific reserves v; ErrExists when someone holds it.
func (a *allocator) AllocateSpecific(ctx context.Context, v, owner string) error {
	if _, ok := a.offset(v); !ok {
		return errOutOfRange
	}
	_, err := a.store.Create(ctx, a.key(v), []byte(owner))
	return err
}

var errOutOfRange = errors.New("not in the valid range")

// Release frees v (idempotent).
func (a *allocator) Release(ctx context.Context, v string) {
	if v == "" {
		return
	}
	kv, _, err := a.store.Get(ctx, a.key(v))
	if err != nil {
		return
	}
	if _, _, err := a.store.OptimisticDelete(ctx, a.key(v), kv.ModRevision); err != nil && !errors.Is(err, storage.ErrNotFound) {
		a.log.Warn("release failed; the repair loop will reclaim it", "range", a.name, "value", v, "err", err)
	}
}

func (a *allocator) taken(ctx context.Context) (map[string]string, error) {
	out := map[string]string{}
	after := ""
	for {
		page, err := a.store.List(ctx, a.prefix, storage.ListOptions{Limit: 10000, After: after})
		if err != nil {
			return nil, err
		}
		for _, kv := range page.KVs {
			out[strings.TrimPrefix(kv.Key, a.prefix)] = string(kv.Value)
		}
		if !page.More || len(page.KVs) == 0 {
			return out, nil
		}
		after = page.KVs[len(page.KVs)-1].Key
	}
}

// repair makes the allocation keys match the Services: values a Service
// uses but that have no key get one (so they are never handed out twice);
// keys no Service uses are released once seen unowned by two consecutive
// runs (an allocation in flight has its Service written in between).
func (a *allocator) repair(ctx context.Context, used map[string]string) (created, released int, err error) {
	taken, err := a.taken(ctx)
	if err != nil {
		return 0, 0, err
	}
	for v, owner := range used {
		if _, ok := taken[v]; ok {
			continue
		}
		if _, ok := a.offset(v); !ok {
			a.log.Warn("service uses a value outside the configured range", "range", a.name, "value", v, "service", owner)
			continue
		}
		if _, err := a.store.Create(ctx, a.key(v), []byte(owner)); err == nil {
			created++
			a.log.Warn("repaired a missing allocation", "range", a.name, "value", v, "service", owner)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	next := map[string]bool{}
	for v := range taken {
		if _, ok := used[v]; ok {
			continue
		}
		if a.suspect[v] {
			a.Release(ctx, v)
			released++
			a.log.Info("reclaimed a leaked allocation", "range", a.name, "value", v)
			continue
		}
		next[v] = true
	}
	a.suspect = next
	return created, released, nil
}

// Service allocation hooks of the services strategy.

func svcOwner(s *corev1.Service) string { return s.Namespace + "/" + s.Name }

func wantsClusterIP(s *corev1.Service) bool {
	return s.Spec.Type != corev1.ServiceTypeExternalName && s.Spec.ClusterIP != corev1.ClusterIPNone
}

func wantsNodePorts(s *corev1.Service) bool {
	return s.Spec.Type == corev1.ServiceTypeNodePort ||
		(s.Spec.Type == corev1.ServiceTypeLoadBalancer && (s.Spec.AllocateLoadBalancerNodePorts == nil || *s.Spec.AllocateLoadBalancerNodePorts))
}

func allocErr(s *corev1.Service, p *field.Path, v string, err error) error {
	switch {
	case errors.Is(err, storage.ErrExists):
		return apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Service").GroupKind(), s.Name,
			field.ErrorList{field.Invalid(p, v, "provided "+what(p)+" is already allocated")})
	case errors.Is(err, errOutOfRange):
		return apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Service").GroupKind(), s.Name,
			field.ErrorList{field.Invalid(p, v, "provided "+what(p)+" is not in the valid range")})
	case errors.Is(err, ErrRangeFull):
		return apierrors.NewInternalError(fmt.Errorf("failed to allocate a %s: range is full", what(p)))
	}
	return err
}

func what(p *field.Path) string {
	if strings.Contains(p.String(), "nodePort") {
		return "port"
	}
	return "IP"
}

func allocateService(ctx context.Context, srv *Server, obj, oldObj runtime.Object, dryRun bool) (func(), error) {
	s := obj.(*corev1.Service)
	var old *corev1.Service
	if oldObj != nil {
		old = oldObj.(*corev1.Service)
	}
	var ips, ports []string
	release := func() {
		for _, v := range ips {
			srv.ipAlloc.Release(context.WithoutCancel(ctx), v)
		}
		for _, v := range ports {
			srv.portAlloc.Release(context.WithoutCancel(ctx), v)
		}
	}
	owner := svcOwner(s)
	if wantsClusterIP(s) {
		held := ""
		if old != nil && wantsClusterIP(old) {
			held = old.Spec.ClusterIP
		}
		switch {
		case s.Spec.ClusterIP == "" && held != "":
			s.Spec.ClusterIP = held
		case s.Spec.ClusterIP == "":
			v, err := srv.ipAlloc.Allocate(ctx, owner)
			if err != nil {
				return nil, allocErr(s, field.NewPath("spec", "clusterIP"), "", err)
			}
			ips = append(ips, v)
			s.Spec.ClusterIP = v
		case s.Spec.ClusterIP != held:
			if err := srv.ipAlloc.AllocateSpecific(ctx, s.Spec.ClusterIP, owner); err != nil {
				return nil, allocErr(s, field.NewPath("spec", "clusterIP"), s.Spec.ClusterIP, err)
			}
			ips = append(ips, s.Spec.ClusterIP)
		}
	} else if s.Spec.Type == corev1.ServiceTypeExternalName {
		s.Spec.ClusterIP = ""
	}
	if s.Spec.ClusterIP != "" {
		s.Spec.ClusterIPs = []string{s.Spec.ClusterIP}
	} else {
		s.Spec.ClusterIPs = nil
	}
	if wantsNodePorts(s) {
		heldPorts := map[string]int32{} // by protocol/port
		heldSet := map[int32]bool{}
		if old != nil && wantsNodePorts(old) {
			for _, p := range old.Spec.Ports {
				heldPorts[string(p.Protocol)+"/"+strconv.Itoa(int(p.Port))] = p.NodePort
				heldSet[p.NodePort] = true
			}
		}
		seen := map[int32]bool{}
		for i := range s.Spec.Ports {
			p := &s.Spec.Ports[i]
			fp := field.NewPath("spec", "ports").Index(i).Child("nodePort")
			if p.NodePort == 0 {
				if h := heldPorts[string(p.Protocol)+"/"+strconv.Itoa(int(p.Port))]; h != 0 && !seen[h] {
					p.NodePort = h
				} else {
					v, err := srv.portAlloc.Allocate(ctx, owner)
					if err != nil {
						release()
						return nil, allocErr(s, fp, "", err)
					}
					ports = append(ports, v)
					n, _ := strconv.Atoi(v)
					p.NodePort = int32(n)
				}
			} else if !heldSet[p.NodePort] && !seen[p.NodePort] {
				v := strconv.Itoa(int(p.NodePort))
				if err := srv.portAlloc.AllocateSpecific(ctx, v, owner); err != nil {
					release()
					return nil, allocErr(s, fp, v, err)
				}
				ports = append(ports, v)
			}
			seen[p.NodePort] = true
		}
	} else {
		for i := range s.Spec.Ports {
			if s.Spec.Type != corev1.ServiceTypeLoadBalancer {
				s.Spec.Ports[i].NodePort = 0
			}
		}
	}
	return release, nil
}

// serviceValues lists what a Service holds in each range.
func serviceValues(s *corev1.Service) (ip string, ports []string) {
	if wantsClusterIP(s) {
		ip = s.Spec.ClusterIP
	}
	for _, p := range s.Spec.Ports {
		if p.NodePort != 0 {
			ports = append(ports, strconv.Itoa(int(p.NodePort)))
		}
	}
	return ip, ports
}

func releaseUnusedService(ctx context.Context, srv *Server, obj, oldObj runtime.Object) {
	nip, nports := serviceValues(obj.(*corev1.Service))
	oip, oports := serviceValues(oldObj.(*corev1.Service))
	if oip != "" && oip != nip {
		srv.ipAlloc.Release(ctx, oip)
	}
	keep := map[string]bool{}
	for _, p := range nports {
		keep[p] = true
	}
	for _, p := range oports {
		if !keep[p] {
			srv.portAlloc.Release(ctx, p)
		}
	}
}

func releaseService(ctx context.Context, srv *Server, obj runtime.Object) {
	ip, ports := serviceValues(obj.(*corev1.Service))
	srv.ipAlloc.Release(ctx, ip)
	for _, p := range ports {
		srv.portAlloc.Release(ctx, p)
	}
}

// repairAllocations runs one repair of both ranges against the stored
// Services.
func (s *Server) repairAllocations(ctx context.Context) error {
	reg := s.registries["services"]
	usedIPs, usedPorts := map[string]string{}, map[string]string{}
	after := ""
	for {
		page, err := s.store.List(ctx, reg.prefix(""), storage.ListOptions{Limit: 1000, After: after})
		if err != nil {
			return err
		}
		for _, kv := range page.KVs {
			o, err := reg.codec.Decode(kv.Key, kv.Value, kv.ModRevision)
			if err != nil {
				continue
			}
			svc := o.Obj.(*corev1.Service)
			ip, ports := serviceValues(svc)
			if ip != "" {
				if other, dup := usedIPs[ip]; dup {
					s.log.Error("cluster IP is used by two services", "ip", ip, "services", []string{other, svcOwner(svc)})
				}
				usedIPs[ip] = svcOwner(svc)
			}
			for _, p := range ports {
				if other, dup := usedPorts[p]; dup && other != svcOwner(svc) {
					s.log.Error("node port is used by two services", "port", p, "services", []string{other, svcOwner(svc)})
				}
				usedPorts[p] = svcOwner(svc)
			}
		}
		if !page.More || len(page.KVs) == 0 {
			break
		}
		after = page.KVs[len(page.KVs)-1].Key
	}
	if _, _, err := s.ipAlloc.repair(ctx, usedIPs); err != nil {
		return fmt.Errorf("repair cluster IPs: %w", err)
	}
	if _, _, err := s.portAlloc.repair(ctx, usedPorts); err != nil {
		return fmt.Errorf("repair node ports: %w", err)
	}
	return nil
}

// patchAllocatedValues keeps the allocated ClusterIP and NodePorts of a
// Service whose update leaves them unset (kubectl replace of a manifest), as
// kube-apiserver does.
func patchAllocatedValues(s, old *corev1.Service) {
	if wantsClusterIP(s) && wantsClusterIP(old) && s.Spec.ClusterIP == "" {
		s.Spec.ClusterIP = old.Spec.ClusterIP
		s.Spec.ClusterIPs = old.Spec.ClusterIPs
	}
	if wantsNodePorts(s) && wantsNodePorts(old) {
		held := map[string]int32{}
		for _, p := range old.Spec.Ports {
			held[string(p.Protocol)+"/"+strconv.Itoa(int(p.Port))] = p.NodePort
		}
		for i := range s.Spec.Ports {
			p := &s.Spec.Ports[i]
			proto := p.Protocol
			if proto == "" {
				proto = corev1.ProtocolTCP
			}
			if p.NodePort == 0 {
				p.NodePort = held[string(proto)+"/"+strconv.Itoa(int(p.Port))]
			}
		}
	}
}
