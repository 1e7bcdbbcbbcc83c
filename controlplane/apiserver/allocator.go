package apiserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"math/rand/v2"
	"net/netip"
	"slices"
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
	// family of an IP range ("" for ports).
	family corev1.IPFamily
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

// newIPAllocators parses --service-cluster-ip-range: one CIDR, or an IPv4
// and an IPv6 CIDR separated by a comma (dual-stack; the first is the
// primary family), as kube-apiserver takes it.
func newIPAllocators(ranges string, store *storage.Store, log *slog.Logger) ([]*allocator, error) {
	parts := strings.Split(ranges, ",")
	if len(parts) > 2 {
		return nil, fmt.Errorf("service cluster IP range %q: at most two CIDRs, one per IP family", ranges)
	}
	var out []*allocator
	for _, p := range parts {
		a, err := newIPAllocator(strings.TrimSpace(p), store, log)
		if err != nil {
			return nil, err
		}
		if len(out) == 1 && out[0].family == a.family {
			return nil, fmt.Errorf("service cluster IP range %q: a dual-stack range needs one IPv4 and one IPv6 CIDR", ranges)
		}
		out = append(out, a)
	}
	return out, nil
}

func newIPAllocator(cidr string, store *storage.Store, log *slog.Logger) (*allocator, error) {
	pfx, err := netip.ParsePrefix(cidr)
	if err != nil {
		return nil, fmt.Errorf("service cluster IP range %q: must be an IPv4 or IPv6 CIDR", cidr)
	}
	pfx = pfx.Masked()
	family, width, prefix := corev1.IPv4Protocol, 32, "/registry/ranges/serviceips/"
	if pfx.Addr().Is6() {
		family, width, prefix = corev1.IPv6Protocol, 128, "/registry/ranges/serviceips-ipv6/"
	}
	bits := width - pfx.Bits()
	if family == corev1.IPv6Protocol && (bits < 2 || bits > 20) {
		return nil, fmt.Errorf("service cluster IP range %q: an IPv6 prefix length must be between /108 and /126", cidr)
	}
	if bits < 2 || bits > 24 {
		return nil, fmt.Errorf("service cluster IP range %q: prefix length must be between /8 and /30", cidr)
	}
	base := new(big.Int).SetBytes(pfx.Addr().AsSlice())
	size := 1 << bits
	usable := size - 1 // not the network address
	if family == corev1.IPv4Protocol {
		usable-- // nor IPv4's broadcast address
	}
	a := &allocator{
		name: "serviceips", prefix: prefix, family: family, size: usable + 1, store: store, log: log,
		first: min(16, size/4) + 1, suspect: map[string]bool{},
	}
	if family == corev1.IPv6Protocol {
		a.name = "serviceips-ipv6"
	}
	a.value = func(off int) string {
		v := new(big.Int).Add(base, big.NewInt(int64(off))).Bytes()
		b := make([]byte, width/8)
		copy(b[len(b)-len(v):], v)
		ip, _ := netip.AddrFromSlice(b)
		return ip.String()
	}
	a.offset = func(s string) (int, bool) {
		ip, err := netip.ParseAddr(s)
		if err != nil || !pfx.Contains(ip) {
			return 0, false
		}
		off := int(new(big.Int).Sub(new(big.Int).SetBytes(ip.AsSlice()), base).Int64())
		return off, off >= 1 && off <= usable
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

// needsHealthCheckNodePort: a LoadBalancer Service with
// externalTrafficPolicy Local gets a node port for external load balancers'
// health checks (spec.healthCheckNodePort), as kube-apiserver allocates it.
func needsHealthCheckNodePort(s *corev1.Service) bool {
	return s.Spec.Type == corev1.ServiceTypeLoadBalancer && s.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
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
	if strings.Contains(strings.ToLower(p.String()), "nodeport") {
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
			srv.ipAllocFor(ipFamily(v)).Release(context.WithoutCancel(ctx), v)
		}
		for _, v := range ports {
			srv.portAlloc.Release(context.WithoutCancel(ctx), v)
		}
	}
	owner := svcOwner(s)
	if err := srv.resolveIPFamilies(s, old); err != nil {
		return nil, err
	}
	if wantsClusterIP(s) {
		var held []string
		if old != nil && wantsClusterIP(old) {
			held = old.Spec.ClusterIPs
		}
		want := s.Spec.ClusterIPs
		out := make([]string, len(s.Spec.IPFamilies))
		for i, fam := range s.Spec.IPFamilies {
			a := srv.ipAllocFor(fam)
			fp := field.NewPath("spec", "clusterIPs").Index(i)
			switch {
			case i < len(want) && want[i] != "" && i < len(held) && want[i] == held[i]:
				out[i] = want[i]
			case i < len(want) && want[i] != "":
				if err := a.AllocateSpecific(ctx, want[i], owner); err != nil {
					release()
					return nil, allocErr(s, fp, want[i], err)
				}
				ips = append(ips, want[i])
				out[i] = want[i]
			case i < len(held) && held[i] != "" && ipFamily(held[i]) == fam:
				out[i] = held[i]
			default:
				v, err := a.Allocate(ctx, owner)
				if err != nil {
					release()
					return nil, allocErr(s, fp, "", err)
				}
				ips = append(ips, v)
				out[i] = v
			}
		}
		s.Spec.ClusterIPs = out
		s.Spec.ClusterIP = out[0]
	} else if s.Spec.Type == corev1.ServiceTypeExternalName {
		s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil
	} else {
		s.Spec.ClusterIPs = []string{corev1.ClusterIPNone}
	}
	// takePort allocates node port want for fp, or any free one when want
	// is 0, and records it for release.
	takePort := func(fp *field.Path, want int32) (int32, error) {
		if want == 0 {
			v, err := srv.portAlloc.Allocate(ctx, owner)
			if err != nil {
				return 0, allocErr(s, fp, "", err)
			}
			ports = append(ports, v)
			n, _ := strconv.Atoi(v)
			return int32(n), nil
		}
		v := strconv.Itoa(int(want))
		if err := srv.portAlloc.AllocateSpecific(ctx, v, owner); err != nil {
			return 0, allocErr(s, fp, v, err)
		}
		ports = append(ports, v)
		return want, nil
	}
	var err error
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
				} else if p.NodePort, err = takePort(fp, 0); err != nil {
					release()
					return nil, err
				}
			} else if !heldSet[p.NodePort] && !seen[p.NodePort] {
				if _, err := takePort(fp, p.NodePort); err != nil {
					release()
					return nil, err
				}
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
	if needsHealthCheckNodePort(s) {
		var held int32
		if old != nil && needsHealthCheckNodePort(old) {
			held = old.Spec.HealthCheckNodePort
		}
		fp := field.NewPath("spec", "healthCheckNodePort")
		switch hc := s.Spec.HealthCheckNodePort; {
		case hc == 0 && held != 0:
			s.Spec.HealthCheckNodePort = held
		case hc == 0 || hc != held:
			if s.Spec.HealthCheckNodePort, err = takePort(fp, hc); err != nil {
				release()
				return nil, err
			}
		}
	}
	return release, nil
}

// serviceValues lists what a Service holds in each range.
func serviceValues(s *corev1.Service) (ips []string, ports []string) {
	if wantsClusterIP(s) {
		for _, ip := range s.Spec.ClusterIPs {
			if ip != "" && ip != corev1.ClusterIPNone {
				ips = append(ips, ip)
			}
		}
		if len(ips) == 0 && s.Spec.ClusterIP != "" {
			ips = []string{s.Spec.ClusterIP}
		}
	}
	for _, p := range s.Spec.Ports {
		if p.NodePort != 0 {
			ports = append(ports, strconv.Itoa(int(p.NodePort)))
		}
	}
	if needsHealthCheckNodePort(s) && s.Spec.HealthCheckNodePort != 0 {
		ports = append(ports, strconv.Itoa(int(s.Spec.HealthCheckNodePort)))
	}
	return ips, ports
}

func releaseUnusedService(ctx context.Context, srv *Server, obj, oldObj runtime.Object) {
	nips, nports := serviceValues(obj.(*corev1.Service))
	oips, oports := serviceValues(oldObj.(*corev1.Service))
	keep := map[string]bool{}
	for _, v := range append(nips, nports...) {
		keep[v] = true
	}
	for _, ip := range oips {
		if !keep[ip] {
			srv.ipAllocFor(ipFamily(ip)).Release(ctx, ip)
		}
	}
	for _, p := range oports {
		if !keep[p] {
			srv.portAlloc.Release(ctx, p)
		}
	}
}

func releaseService(ctx context.Context, srv *Server, obj runtime.Object) {
	ips, ports := serviceValues(obj.(*corev1.Service))
	for _, ip := range ips {
		srv.ipAllocFor(ipFamily(ip)).Release(ctx, ip)
	}
	for _, p := range ports {
		srv.portAlloc.Release(ctx, p)
	}
}

// ipFamily is the family of an IP address ("" if it is none).
func ipFamily(ip string) corev1.IPFamily {
	a, err := netip.ParseAddr(ip)
	switch {
	case err != nil:
		return ""
	case a.Is4():
		return corev1.IPv4Protocol
	}
	return corev1.IPv6Protocol
}

// ipAllocFor returns the allocator of a family; the primary one when the
// cluster does not serve the family (its range check then refuses it).
func (s *Server) ipAllocFor(f corev1.IPFamily) *allocator {
	for _, a := range s.ipAllocs {
		if a.family == f {
			return a
		}
	}
	return s.ipAlloc
}

// clusterFamilies are the served IP families, primary first.
func (s *Server) clusterFamilies() []corev1.IPFamily {
	out := make([]corev1.IPFamily, len(s.ipAllocs))
	for i, a := range s.ipAllocs {
		out[i] = a.family
	}
	return out
}

// resolveIPFamilies settles spec.ipFamilyPolicy, spec.ipFamilies and the
// shape of spec.clusterIPs as kube-apiserver does before allocating:
// families follow given clusterIPs; the policy defaults to SingleStack, or
// RequireDualStack when two families or addresses are asked for;
// PreferDualStack and RequireDualStack get the cluster's other family; what
// the cluster cannot serve is Invalid. A headless Service without a selector
// is RequireDualStack over both families whatever the cluster serves.
func (srv *Server) resolveIPFamilies(s, old *corev1.Service) error {
	sp := field.NewPath("spec")
	invalid := func(errs ...*field.Error) error {
		return apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Service").GroupKind(), s.Name, errs)
	}
	if s.Spec.Type == corev1.ServiceTypeExternalName {
		s.Spec.IPFamilies, s.Spec.IPFamilyPolicy, s.Spec.ClusterIPs = nil, nil, nil
		return nil
	}
	cluster := srv.clusterFamilies()
	if s.Spec.ClusterIP != "" && len(s.Spec.ClusterIPs) == 0 {
		s.Spec.ClusterIPs = []string{s.Spec.ClusterIP}
	}
	if len(s.Spec.ClusterIPs) > 0 && s.Spec.ClusterIP == "" {
		s.Spec.ClusterIP = s.Spec.ClusterIPs[0]
	}
	if len(s.Spec.ClusterIPs) > 0 && s.Spec.ClusterIPs[0] != s.Spec.ClusterIP {
		return invalid(field.Invalid(sp.Child("clusterIPs").Index(0), s.Spec.ClusterIPs[0], "must match `spec.clusterIP`"))
	}
	if len(s.Spec.ClusterIPs) > 2 {
		return invalid(field.TooMany(sp.Child("clusterIPs"), len(s.Spec.ClusterIPs), 2))
	}
	if len(s.Spec.IPFamilies) > 2 {
		return invalid(field.TooMany(sp.Child("ipFamilies"), len(s.Spec.IPFamilies), 2))
	}
	headless := s.Spec.ClusterIP == corev1.ClusterIPNone
	if old != nil && old.Spec.Type != corev1.ServiceTypeExternalName {
		// An update that leaves the families out keeps them; a downgrade
		// to SingleStack drops the secondary family and address.
		if len(s.Spec.IPFamilies) == 0 {
			s.Spec.IPFamilies = append([]corev1.IPFamily(nil), old.Spec.IPFamilies...)
		}
		if s.Spec.IPFamilyPolicy == nil {
			s.Spec.IPFamilyPolicy = old.Spec.IPFamilyPolicy
		}
		if p := s.Spec.IPFamilyPolicy; p != nil && *p == corev1.IPFamilyPolicySingleStack &&
			old.Spec.IPFamilyPolicy != nil && *old.Spec.IPFamilyPolicy != corev1.IPFamilyPolicySingleStack {
			if len(s.Spec.IPFamilies) > 1 {
				s.Spec.IPFamilies = s.Spec.IPFamilies[:1]
			}
			if len(s.Spec.ClusterIPs) > 1 {
				s.Spec.ClusterIPs = s.Spec.ClusterIPs[:1]
			}
		}
		if len(old.Spec.IPFamilies) > 0 && len(s.Spec.IPFamilies) > 0 && s.Spec.IPFamilies[0] != old.Spec.IPFamilies[0] {
			return invalid(field.Invalid(sp.Child("ipFamilies").Index(0), s.Spec.IPFamilies[0], "may not change once set"))
		}
	}
	if headless && len(s.Spec.Selector) == 0 {
		if s.Spec.IPFamilyPolicy == nil {
			s.Spec.IPFamilyPolicy = ptr(corev1.IPFamilyPolicyRequireDualStack)
		}
		if len(s.Spec.IPFamilies) == 0 {
			s.Spec.IPFamilies = []corev1.IPFamily{cluster[0]}
			if *s.Spec.IPFamilyPolicy != corev1.IPFamilyPolicySingleStack {
				s.Spec.IPFamilies = append(s.Spec.IPFamilies, otherFamily(cluster[0]))
			}
		}
		s.Spec.ClusterIPs = []string{corev1.ClusterIPNone}
		return nil
	}
	var ipFams []corev1.IPFamily // families of the given addresses
	if !headless {
		for i, ip := range s.Spec.ClusterIPs {
			f := ipFamily(ip)
			if f == "" {
				return invalid(field.Invalid(sp.Child("clusterIPs").Index(i), ip, "must be a valid IP address"))
			}
			if i == 1 && f == ipFams[0] {
				return invalid(field.Invalid(sp.Child("clusterIPs").Index(1), ip, "may not have the same family as `spec.clusterIPs[0]`"))
			}
			ipFams = append(ipFams, f)
		}
	}
	for i, f := range ipFams {
		if i < len(s.Spec.IPFamilies) && s.Spec.IPFamilies[i] != f {
			return invalid(field.Invalid(sp.Child("ipFamilies").Index(i), s.Spec.IPFamilies[i], fmt.Sprintf("must match the family of `spec.clusterIPs[%d]`", i)))
		}
		if i >= len(s.Spec.IPFamilies) {
			s.Spec.IPFamilies = append(s.Spec.IPFamilies, f)
		}
	}
	for i, f := range s.Spec.IPFamilies {
		if f != corev1.IPv4Protocol && f != corev1.IPv6Protocol {
			return invalid(field.NotSupported(sp.Child("ipFamilies").Index(i), f, []string{"IPv4", "IPv6"}))
		}
		if i == 1 && f == s.Spec.IPFamilies[0] {
			return invalid(field.Duplicate(sp.Child("ipFamilies").Index(1), f))
		}
	}
	if s.Spec.IPFamilyPolicy == nil {
		policy := corev1.IPFamilyPolicySingleStack
		if len(s.Spec.IPFamilies) == 2 || len(s.Spec.ClusterIPs) == 2 {
			policy = corev1.IPFamilyPolicyRequireDualStack
		}
		s.Spec.IPFamilyPolicy = &policy
	}
	switch p := *s.Spec.IPFamilyPolicy; p {
	case corev1.IPFamilyPolicySingleStack:
		if len(s.Spec.IPFamilies) > 1 || len(s.Spec.ClusterIPs) > 1 {
			return invalid(field.Invalid(sp.Child("ipFamilies"), s.Spec.IPFamilies, "must be a single family when `spec.ipFamilyPolicy` is SingleStack"))
		}
	case corev1.IPFamilyPolicyRequireDualStack:
		if len(cluster) < 2 {
			return invalid(field.Invalid(sp.Child("ipFamilyPolicy"), p, "this cluster is not configured for dual-stack services"))
		}
	case corev1.IPFamilyPolicyPreferDualStack:
	default:
		return invalid(field.NotSupported(sp.Child("ipFamilyPolicy"), p, []string{"PreferDualStack", "RequireDualStack", "SingleStack"}))
	}
	served := map[corev1.IPFamily]bool{}
	for _, f := range cluster {
		served[f] = true
	}
	for i, f := range s.Spec.IPFamilies {
		if !served[f] {
			return invalid(field.Invalid(sp.Child("ipFamilies").Index(i), f, "not configured on this cluster"))
		}
	}
	if len(s.Spec.IPFamilies) == 0 {
		s.Spec.IPFamilies = []corev1.IPFamily{cluster[0]}
	}
	if *s.Spec.IPFamilyPolicy != corev1.IPFamilyPolicySingleStack && len(s.Spec.IPFamilies) == 1 && len(cluster) == 2 {
		s.Spec.IPFamilies = append(s.Spec.IPFamilies, otherFamily(s.Spec.IPFamilies[0]))
	}
	if headless {
		s.Spec.ClusterIPs = []string{corev1.ClusterIPNone}
	}
	return nil
}

func otherFamily(f corev1.IPFamily) corev1.IPFamily {
	if f == corev1.IPv4Protocol {
		return corev1.IPv6Protocol
	}
	return corev1.IPv4Protocol
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
			ips, ports := serviceValues(svc)
			for _, ip := range ips {
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
	for _, a := range s.ipAllocs {
		mine := map[string]string{}
		for ip, owner := range usedIPs {
			if ipFamily(ip) == a.family || len(s.ipAllocs) == 1 {
				mine[ip] = owner
			}
		}
		if _, _, err := a.repair(ctx, mine); err != nil {
			return fmt.Errorf("repair cluster IPs: %w", err)
		}
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
	if wantsClusterIP(s) && wantsClusterIP(old) && s.Spec.ClusterIP == "" && len(s.Spec.ClusterIPs) == 0 {
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
	if needsHealthCheckNodePort(s) && needsHealthCheckNodePort(old) && s.Spec.HealthCheckNodePort == 0 {
		s.Spec.HealthCheckNodePort = old.Spec.HealthCheckNodePort
	}
}

// dropTypeDependentFields is upstream's service update rule: a change of
// type wipes what the old type needed and the new one does not (cluster
// IPs and families, node ports, the health check node port,
// allocateLoadBalancerNodePorts, loadBalancerClass,
// externalTrafficPolicy), but only where the update left the old value
// unchanged: a value the client changed is its own and is validated.
func dropTypeDependentFields(s, old *corev1.Service) {
	needsClusterIP := func(v *corev1.Service) bool { return v.Spec.Type != corev1.ServiceTypeExternalName }
	needsNodePort := func(v *corev1.Service) bool {
		return v.Spec.Type == corev1.ServiceTypeNodePort || v.Spec.Type == corev1.ServiceTypeLoadBalancer
	}
	needsHCNodePort := needsHealthCheckNodePort
	externallyAccessible := func(v *corev1.Service) bool {
		return needsNodePort(v) || (v.Spec.Type == corev1.ServiceTypeClusterIP && len(v.Spec.ExternalIPs) > 0)
	}
	if needsClusterIP(old) && !needsClusterIP(s) {
		// Unset counts as unchanged: a PUT that leaves them out.
		if (s.Spec.ClusterIP == "" || s.Spec.ClusterIP == old.Spec.ClusterIP) &&
			(len(s.Spec.ClusterIPs) == 0 || slices.Equal(s.Spec.ClusterIPs, old.Spec.ClusterIPs)) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = "", nil
		}
		if len(s.Spec.IPFamilies) == 0 || slices.Equal(s.Spec.IPFamilies, old.Spec.IPFamilies) {
			s.Spec.IPFamilies = nil
		}
		if s.Spec.IPFamilyPolicy == nil || (old.Spec.IPFamilyPolicy != nil && *s.Spec.IPFamilyPolicy == *old.Spec.IPFamilyPolicy) {
			s.Spec.IPFamilyPolicy = nil
		}
	}
	if needsNodePort(old) && !needsNodePort(s) && sameNodePorts(s, old) {
		for i := range s.Spec.Ports {
			s.Spec.Ports[i].NodePort = 0
		}
	}
	if needsHCNodePort(old) && !needsHCNodePort(s) && (s.Spec.HealthCheckNodePort == 0 || s.Spec.HealthCheckNodePort == old.Spec.HealthCheckNodePort) {
		s.Spec.HealthCheckNodePort = 0
	}
	if old.Spec.Type == corev1.ServiceTypeLoadBalancer && s.Spec.Type != corev1.ServiceTypeLoadBalancer {
		if a, b := s.Spec.AllocateLoadBalancerNodePorts, old.Spec.AllocateLoadBalancerNodePorts; a != nil && b != nil && *a == *b {
			s.Spec.AllocateLoadBalancerNodePorts = nil
		}
		if s.Spec.LoadBalancerClass == nil || (old.Spec.LoadBalancerClass != nil && *s.Spec.LoadBalancerClass == *old.Spec.LoadBalancerClass) {
			s.Spec.LoadBalancerClass = nil
		}
	}
	if externallyAccessible(old) && !externallyAccessible(s) && s.Spec.ExternalTrafficPolicy == old.Spec.ExternalTrafficPolicy {
		s.Spec.ExternalTrafficPolicy = ""
	}
	if s.Spec.Type != corev1.ServiceTypeLoadBalancer {
		s.Status.LoadBalancer = corev1.LoadBalancerStatus{}
	}
}

// sameNodePorts: s adds no node port old did not have (ports may be added,
// removed or changed), upstream's test that the client set none itself.
func sameNodePorts(s, old *corev1.Service) bool {
	held := map[int32]bool{}
	for _, p := range old.Spec.Ports {
		held[p.NodePort] = true
	}
	for _, p := range s.Spec.Ports {
		if p.NodePort != 0 && !held[p.NodePort] {
			return false
		}
	}
	return true
}
