package ebpf

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/waggle-io/waggle/dataplane"
)

// Backend is the eBPF dataplane.Backend. It is safe for concurrent use;
// syncs are serialized.
type Backend struct {
	cfg  Config
	log  *slog.Logger
	mu   sync.Mutex
	objs *sockLBObjects
	rec  *reconciler
	m    *metrics
	// closed is set by Close and Cleanup.
	closed bool
	// sockets terminates sockets of removed backends, off the sync path.
	sockets *socketJanitor
	// np is the north-south half (nil when Config.NorthSouth is nil).
	np *northSouth
}

var (
	_ dataplane.IncrementalBackend = (*Backend)(nil)
	_ dataplane.FullResyncer       = (*Backend)(nil)
)

// progAttach lists the programs and their attach points, in attach order.
// The bind guards come first so no frontend can be bound while connects
// are already translated.
func progAttach(o *sockLBObjects) []struct {
	name string
	prog *ebpf.Program
	at   ebpf.AttachType
} {
	p := &o.sockLBPrograms
	return []struct {
		name string
		prog *ebpf.Program
		at   ebpf.AttachType
	}{
		{"waggle_bind4", p.WaggleBind4, ebpf.AttachCGroupInet4Bind},
		{"waggle_bind6", p.WaggleBind6, ebpf.AttachCGroupInet6Bind},
		{"waggle_recvmsg4", p.WaggleRecvmsg4, ebpf.AttachCGroupUDP4Recvmsg},
		{"waggle_recvmsg6", p.WaggleRecvmsg6, ebpf.AttachCGroupUDP6Recvmsg},
		{"waggle_getpeername4", p.WaggleGetpeername4, ebpf.AttachCgroupInet4GetPeername},
		{"waggle_getpeername6", p.WaggleGetpeername6, ebpf.AttachCgroupInet6GetPeername},
		{"waggle_connect4", p.WaggleConnect4, ebpf.AttachCGroupInet4Connect},
		{"waggle_connect6", p.WaggleConnect6, ebpf.AttachCGroupInet6Connect},
		{"waggle_sendmsg4", p.WaggleSendmsg4, ebpf.AttachCGroupUDP4Sendmsg},
		{"waggle_sendmsg6", p.WaggleSendmsg6, ebpf.AttachCGroupUDP6Sendmsg},
	}
}

// New loads the programs, opens or creates the pinned maps under
// cfg.PinDir, attaches (or atomically replaces, when pinned links exist) the
// programs on cfg.CgroupPath, and restores service and backend IDs from the
// maps, so that a restarted proxy continues where the last one stopped
// without a moment of unbalanced connects.
func New(cfg Config) (b *Backend, err error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("ebpf backend config: %w", err)
	}
	cfg = cfg.withDefaults()
	if cfg.CgroupPath == "" {
		root, err := cgroup2Root()
		if err != nil {
			return nil, fmt.Errorf("find the cgroup2 mount for --cgroup-root: %w", err)
		}
		cfg.CgroupPath = root
	}
	if err := Supported(); err != nil {
		return nil, err
	}
	if err := ensureBPFFS(cfg.PinDir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(cfg.PinDir, LinkDir), 0o700); err != nil {
		return nil, fmt.Errorf("create pin directory: %w", err)
	}
	defer func() {
		if err != nil { // leave no empty directories behind
			os.Remove(filepath.Join(cfg.PinDir, LinkDir))
			os.Remove(cfg.PinDir)
		}
	}()
	old, err := checkPinnedMeta(cfg.PinDir)
	if err != nil {
		return nil, err
	}
	spec, err := loadSockLB()
	if err != nil {
		return nil, err
	}
	sizes := map[string]int{
		MapServices: cfg.MaxServices, MapRevNat: cfg.MaxServices, MapServiceNames: cfg.MaxServices,
		MapBackends: backendsMapSize(cfg.MaxBackends), MapAffinity: cfg.MaxAffinity, MapReverseSockets: cfg.MaxReverseSockets,
	}
	for name, n := range sizes {
		spec.Maps[name].MaxEntries = uint32(n)
	}
	objs := &sockLBObjects{}
	var resized *resize
	err = spec.LoadAndAssign(objs, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: cfg.PinDir}})
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		// Map sizes changed, or layout 1's services map: copy into new
		// maps, which the new programs use from their link update on; the
		// pins move after that.
		objs, resized, err = loadResized(spec, cfg, old)
		if err != nil {
			return nil, err
		}
	}
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load eBPF programs: %+v", ve)
		}
		return nil, fmt.Errorf("load eBPF objects: %w", err)
	}
	b = &Backend{cfg: cfg, log: cfg.Log, objs: objs}
	if err := b.writeMeta(); err != nil {
		objs.Close()
		return nil, err
	}
	b.rec = newReconciler(tables{
		services: mapTable[sockLBLbServiceKey, sockLBLbService]{MapServices, objs.WaggleServices},
		backends: arrayTable[sockLBLbBackend]{mapTable[uint32, sockLBLbBackend]{MapBackends, objs.WaggleBackends}},
		revNat:   mapTable[uint32, sockLBLbRevNat]{MapRevNat, objs.WaggleRevNat},
		names:    mapTable[uint32, sockLBLbSvcName]{MapServiceNames, objs.WaggleSvcNames},
		affinity: mapTable[sockLBLbAffinityKey, sockLBLbAffinity]{MapAffinity, objs.WaggleAffinity},
		parallel: true,
	}, cfg.MaxServices, cfg.MaxBackends).withGrace(rcuGracePeriod)
	if err := b.rec.restore(); err != nil {
		objs.Close()
		return nil, fmt.Errorf("restore from pinned maps: %w", err)
	}
	if err := b.attach(); err != nil {
		objs.Close()
		return nil, err
	}
	if cfg.NorthSouth != nil {
		if old != 0 && old < 3 {
			// Layout 3's north-south affinity entries name the backend's
			// generation too; every migrated backend has generation 1.
			if err := stampNPAffinityGen(cfg.PinDir); err != nil {
				b.log.Warn("north-south affinity entries not converted: their clients choose again", "err", err)
			}
		}
		if err := b.loadNorthSouth(); err != nil {
			objs.Close()
			return nil, err
		}
	} else if err := removeNorthSouth(cfg.PinDir); err != nil {
		b.log.Warn("remove north-south state left by an earlier proxy", "err", err)
	}
	if resized != nil {
		if err := resized.repin(); err != nil {
			objs.Close()
			return nil, err
		}
		if old != 0 && old != LayoutVersion {
			b.log.Info("migrated pinned maps to this layout", "from", old, "to", LayoutVersion, "maps", resized.names)
		} else {
			b.log.Info("resized pinned maps", "maps", resized.names)
		}
	}
	b.sockets = newSocketJanitor(b)
	if cfg.Metrics != nil {
		b.m = newMetricsFor(b)
		if err := cfg.Metrics.Register(b.m); err != nil {
			b.Close()
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	b.log.Info("eBPF socket load balancer ready", "cgroup", cfg.CgroupPath, "pinDir", cfg.PinDir,
		"restoredFrontends", len(b.rec.fronts), "restoredBackends", len(b.rec.beIDs))
	return b, nil
}

// attach attaches every program to the cgroup, or swaps it into the
// pinned link left by a previous proxy (BPF_LINK_UPDATE: atomic, no
// window without a program).
func (b *Backend) attach() error {
	var st unix.Stat_t
	if err := unix.Stat(b.cfg.CgroupPath, &st); err != nil {
		return fmt.Errorf("cgroup %s: %w", b.cfg.CgroupPath, err)
	}
	cgID := st.Ino // a cgroup v2 directory's inode is its cgroup ID
	for _, p := range progAttach(b.objs) {
		path := filepath.Join(b.cfg.PinDir, LinkDir, p.name)
		old, err := link.LoadPinnedLink(path, nil)
		if err == nil {
			if sameCgroup(old, cgID) {
				err = old.Update(p.prog)
				old.Close()
				if err != nil {
					return fmt.Errorf("replace program %s in pinned link %s: %w", p.name, path, err)
				}
				b.log.Debug("replaced program in pinned link", "program", p.name)
				continue
			}
			// --cgroup-root changed: attach to the new cgroup before the
			// old link goes.
			b.log.Info("cgroup changed: moving program", "program", p.name, "cgroup", b.cfg.CgroupPath)
		} else if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("open pinned link %s: %w", path, err)
		}
		l, err := link.AttachCgroup(link.CgroupOptions{Path: b.cfg.CgroupPath, Attach: p.at, Program: p.prog})
		if err != nil {
			if old != nil {
				old.Close()
			}
			return fmt.Errorf("attach %s to cgroup %s: %w", p.name, b.cfg.CgroupPath, err)
		}
		if old != nil {
			old.Unpin()
			old.Detach()
			old.Close()
		}
		err = l.Pin(path)
		l.Close()
		if err != nil {
			return fmt.Errorf("pin link %s (the kernel needs bpf_link support for cgroups, Linux 5.7+): %w", path, err)
		}
		b.log.Debug("attached program", "program", p.name, "cgroup", b.cfg.CgroupPath)
	}
	return nil
}

// sameCgroup reports whether a pinned cgroup link is attached to the
// cgroup with ID id (true when the kernel does not say).
func sameCgroup(l link.Link, id uint64) bool {
	info, err := l.Info()
	if err != nil {
		return true
	}
	if cg := info.Cgroup(); cg != nil {
		return cg.CgroupId == id
	}
	return true
}

func (b *Backend) writeMeta() error {
	var m sockLBLbMeta
	if err := b.objs.WaggleMeta.Lookup(uint32(0), &m); err != nil {
		return fmt.Errorf("read %s: %w", MapMeta, err)
	}
	if m.Magic == Magic && m.LayoutVersion == LayoutVersion {
		return nil
	}
	if m.Magic != Magic { // else a migrated layout: keep its creation time
		m.CreatedUnix = uint64(time.Now().Unix())
	}
	m.Magic, m.LayoutVersion = Magic, LayoutVersion
	if err := b.objs.WaggleMeta.Update(uint32(0), &m, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write %s: %w", MapMeta, err)
	}
	return nil
}

// migratableLayouts are the older layouts a starting proxy converts (layout
// 1: every backend in a slot entry; layout 2: the backends map a hash map;
// see loadResized).
var migratableLayouts = []uint32{1, 2}

// backendsMapSize is the backends array's max_entries for n backends: ID 0
// is never used.
func backendsMapSize(n int) int { return n + 1 }

// membarrierCmdGlobal is MEMBARRIER_CMD_GLOBAL (linux/membarrier.h).
const membarrierCmdGlobal = 1

// rcuGracePeriod waits until every BPF program run that started before it
// was called has finished: membarrier(MEMBARRIER_CMD_GLOBAL) returns after
// synchronize_rcu(), and the programs run under rcu_read_lock. Where
// membarrier cannot (nohz_full CPUs), a second is far longer than any run.
func rcuGracePeriod() {
	if _, _, errno := unix.Syscall(unix.SYS_MEMBARRIER, membarrierCmdGlobal, 0, 0); errno != 0 {
		time.Sleep(time.Second)
	}
}

// checkPinnedMeta refuses pinned state from another layout version
// before anything is loaded over it, except migratableLayout, which the
// proxy converts; it returns the pinned layout (0: none yet).
func checkPinnedMeta(dir string) (uint32, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, MapMeta), &ebpf.LoadPinOptions{ReadOnly: true})
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("open pinned %s: %w", MapMeta, err)
	}
	defer m.Close()
	return checkMeta(m, dir, migratableLayouts...)
}

// checkMeta returns the layout version of the pinned state, refusing any
// but LayoutVersion and the migratable ones listed.
func checkMeta(m *ebpf.Map, dir string, migratable ...uint32) (uint32, error) {
	if m.ValueSize() != 16 {
		return 0, fmt.Errorf("%s: meta value size %d, want 16: %w", dir, m.ValueSize(), ErrLayoutMismatch)
	}
	var raw [16]byte
	if err := m.Lookup(uint32(0), &raw); err != nil {
		return 0, fmt.Errorf("read pinned %s: %w", MapMeta, err)
	}
	magic, ver := binary.LittleEndian.Uint32(raw[0:]), binary.LittleEndian.Uint32(raw[4:])
	if magic == 0 {
		return 0, nil // created but never stamped: ours, stamped on load
	}
	if magic == Magic && slices.Contains(migratable, ver) {
		return ver, nil
	}
	if magic != Magic || ver != LayoutVersion {
		if magic == Magic && slices.Contains(migratableLayouts, ver) {
			return 0, fmt.Errorf("%s holds map layout %d; this Waggle uses layout %d: "+
				"a starting proxy converts it: %w", dir, ver, LayoutVersion, ErrLayoutMismatch)
		}
		return 0, fmt.Errorf("%s holds map layout %d (magic %#x); this Waggle uses layout %d: "+
			"clean the old state up with the Waggle that wrote it: %w", dir, ver, magic, LayoutVersion, ErrLayoutMismatch)
	}
	return ver, nil
}

// Name is "ebpf".
func (b *Backend) Name() string { return "ebpf" }

// Sync programs state; see the package documentation for the write order.
// Frontends that do not fit the maps are left out and each is named in a
// dataplane.FrontendError wrapping dataplane.ErrMapFull; the rest is
// programmed.
func (b *Backend) Sync(ctx context.Context, state *dataplane.State) error {
	return b.program(ctx, len(state.Frontends), func() (syncResult, error) { return b.rec.sync(state) })
}

// Apply programs a change on top of the maps, touching only the frontends it
// names (O(change)); errors as Sync's.
func (b *Backend) Apply(ctx context.Context, ch *dataplane.Change) error {
	return b.program(ctx, len(ch.Upsert)+len(ch.Remove), func() (syncResult, error) { return b.rec.applyChange(ch) })
}

// WaitSocketsTerminated waits until the sockets of every backend removed by
// the syncs so far have been terminated (that job runs off the sync path).
func (b *Backend) WaitSocketsTerminated(ctx context.Context) error {
	return b.sockets.wait(ctx)
}

// RequestFullSync makes the next Sync re-read every map first, so that it
// rewrites whatever drifted from the mirror (the proxy's periodic full
// reconcile).
func (b *Backend) RequestFullSync() {
	b.mu.Lock()
	b.rec.dirty = true
	b.mu.Unlock()
}

func (b *Backend) program(ctx context.Context, n int, fn func() (syncResult, error)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	start := time.Now()
	res, err := fn()
	if b.m != nil {
		b.m.observeSync(time.Since(start), res, len(b.rec.fronts), len(b.rec.beIDs), err)
	}
	if err != nil && errors.Is(err, dataplane.ErrMapFull) {
		b.log.Error("eBPF maps full: frontends not programmed", "frontends", len(res.rejected), "err", err)
	}
	if len(res.lost) > 0 {
		b.sockets.enqueue(res.lost)
	}
	b.log.Debug("synced eBPF maps", "frontends", n, "writes", res.writes,
		"deletes", res.deletes, "took", time.Since(start))
	return err
}

// Close releases the backend's file descriptors and leaves the programs
// attached and the maps pinned: load balancing goes on while no proxy runs,
// and the next New takes over.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	b.sockets.stop()
	if b.cfg.Metrics != nil && b.m != nil {
		b.cfg.Metrics.Unregister(b.m)
	}
	b.np.close()
	return b.objs.Close()
}

// Cleanup detaches the programs and removes every pinned map and link of
// this node, then closes the backend.
func (b *Backend) Cleanup(ctx context.Context) error {
	b.Close()
	return CleanupPinned(b.cfg.PinDir)
}

// CleanupPinned removes the pinned state in dir: links first (which
// detaches the programs), then maps. A missing dir is not an error.
func CleanupPinned(dir string) error {
	errs := []error{detachTCFilters(nil)} // north-south as tc filters (no pins)
	links, _ := filepath.Glob(filepath.Join(dir, LinkDir, "*"))
	for _, p := range links {
		// Detach first (synchronous); unpinning alone lets the kernel
		// release the link only after an RCU grace period.
		if l, err := link.LoadPinnedLink(p, nil); err == nil {
			if err := l.Detach(); err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
				errs = append(errs, fmt.Errorf("detach %s: %w", filepath.Base(p), err))
			}
			l.Close()
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unpin link: %w", err))
		}
	}
	for _, name := range []string{MapServices, MapBackends, MapRevNat, MapReverseSockets, MapAffinity,
		MapServiceNames, MapMeta, MapStats, MapNPConntrack, MapNPAffinity, MapNPDevices, MapNPConfig, MapNPStats, MapNPServices, MapNPMaglev, MapNPSourceRanges, MapNPFragments, MapNPLBMode} {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unpin map: %w", err))
		}
	}
	for _, d := range []string{filepath.Join(dir, LinkDir), dir} {
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// Supported reports whether this kernel can run the eBPF backend: cgroup
// sock_addr programs with the helpers they use, a cgroup v2 hierarchy, and
// a BPF filesystem (mounted, or mountable).
func Supported() error {
	if err := probeKernel(); err != nil {
		return fmt.Errorf("eBPF socket load balancing: %w: %w", err, dataplane.ErrNotSupported)
	}
	return nil
}

var errNoBPFFS = errors.New("no BPF filesystem")

// ensureBPFFS mounts bpffs on /sys/fs/bpf when dir lies under it and it is
// not mounted yet (as Cilium does).
func ensureBPFFS(dir string) error {
	const root = "/sys/fs/bpf"
	if isBPFFS(dir) || isBPFFS(filepath.Dir(dir)) {
		return nil
	}
	if isBPFFS(root) {
		return nil
	}
	rel, err := filepath.Rel(root, dir)
	if err != nil || rel == ".." || filepath.IsAbs(rel) || len(rel) >= 2 && rel[:2] == ".." {
		return fmt.Errorf("pin directory %s is not on a BPF filesystem: %w", dir, errNoBPFFS)
	}
	if err := unix.Mount("bpf", root, "bpf", 0, ""); err != nil {
		return fmt.Errorf("mount bpffs on %s: %w", root, err)
	}
	return nil
}

func isBPFFS(path string) bool {
	for p := path; ; p = filepath.Dir(p) {
		var st unix.Statfs_t
		if err := unix.Statfs(p, &st); err == nil {
			return st.Type == unix.BPF_FS_MAGIC
		}
		if p == "/" || p == "." {
			return false
		}
	}
}
