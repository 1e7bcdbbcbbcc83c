package runtime

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	cg1stats "github.com/containerd/cgroups/v3/cgroup1/stats"
	cg2stats "github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/containerd/containerd"
	apievents "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/cio"
	"github.com/containerd/containerd/containers"
	"github.com/containerd/containerd/errdefs"
	"github.com/containerd/containerd/namespaces"
	"github.com/containerd/containerd/oci"
	"github.com/containerd/containerd/remotes/docker"
	"github.com/containerd/typeurl/v2"
	"github.com/distribution/reference"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sync/singleflight"

	"github.com/waggle-io/waggle/internal/cgroupfs"
	"github.com/waggle-io/waggle/internal/procfs"
	"github.com/waggle-io/waggle/kubelet/containerlog"
)

// Labels the kubelet keeps on its containerd containers: everything it needs
// to rebuild pod status after a restart of itself or of containerd.
const (
	LabelPodUID       = "waggle.io/pod-uid"
	LabelPodName      = "waggle.io/pod-name"
	LabelPodNamespace = "waggle.io/pod-namespace"
	LabelContainer    = "waggle.io/container"
	LabelAttempt      = "waggle.io/attempt"
	LabelInit         = "waggle.io/init"
	LabelImage        = "waggle.io/image"
	LabelImageID      = "waggle.io/image-id"
	LabelLogPath      = "waggle.io/log-path"
	LabelStartedAt    = "waggle.io/started-at"
	LabelFinishedAt   = "waggle.io/finished-at"
	LabelExitCode     = "waggle.io/exit-code"
	LabelReason       = "waggle.io/reason"
	LabelCgroup       = "waggle.io/cgroup"
	LabelOOM          = "waggle.io/oom-killed"
	LabelStdinOnce    = "waggle.io/stdin-once"
	LabelResources    = "waggle.io/resources"
)

// oomGrace is how long an exit by SIGKILL waits for its OOM event before
// it is recorded as a plain error.
const oomGrace = 2 * time.Second

// ContainerdOptions configure the containerd runtime.
type ContainerdOptions struct {
	// Address of containerd's socket.
	Address string
	// Namespace is the containerd namespace of all the kubelet's images and
	// containers (per node in a lab, so nodes never see each other's).
	Namespace string
	// Snapshotter (default overlayfs).
	Snapshotter string
	// RuntimeName (default io.containerd.runc.v2).
	RuntimeName string
	// LocalRegistries are registries (as in the image reference, e.g.
	// registry.k8s.io) whose images this node has only from imports
	// (--image-dir), as it has those of LocalRegistry: never pulled, and
	// imagePullPolicy Always takes the node's copy. For nodes without
	// access to those registries (an air-gapped lab).
	LocalRegistries []string
	// Cgroup2Root and Cgroup1Root are where the cgroup hierarchies are
	// mounted, for OOM detection (defaults from /proc/self/mounts).
	Cgroup2Root, Cgroup1MemoryRoot string
	// Logger is the binary that writes containers' CRI-format logs: run as
	// `<Logger> container-logger ...` (default: DefaultLogger of this
	// executable: waggle-container-logger beside it, else the `waggle`
	// binary itself; a test binary answers it from its TestMain).
	Logger string
	Log    *slog.Logger
	// Observe, when set, receives the duration of each operation on
	// containerd under upstream's CRI operation names (image_status,
	// pull_image, create_container, start_container, list_containers,
	// stop_container, remove_container): the kubelet's
	// kubelet_runtime_operations_duration_seconds.
	Observe func(op string, d time.Duration)
}

// Containerd is the Runtime on containerd with runc.
type Containerd struct {
	opts ContainerdOptions
	// fsDir is the snapshotter's root (ImageFsDir), once known.
	fsMu   sync.Mutex
	fsDir  string
	client *containerd.Client
	log    *slog.Logger
	pulls  singleflight.Group
	// lookups are EnsureImage's lookups of present images in flight.
	lookups singleflight.Group
	// stopEvents ends the OOM event subscription.
	stopEvents context.CancelFunc
	// missing is when each container was first seen without a task.
	missingMu sync.Mutex
	missing   map[string]time.Time
	// images are the references EnsureImage found present and unpacked,
	// what StartContainer then creates from: a burst of pods of one image
	// asks containerd once, as a client starting them directly would, not
	// two GetImage and an IsUnpacked (manifest, config, snapshot) each.
	// Any image event (create, update, delete: a pull, a retag, a removal,
	// by us or anyone) and any gap in the event subscription forget them
	// all; imagesGen counts those, so that a lookup that raced one is not
	// kept. (An event in the moment a subscription is being set up can be
	// missed: StartContainer looks an image up again when creating from
	// the kept one fails.)
	imagesMu  sync.Mutex
	images    map[string]containerd.Image
	imagesGen uint64
	// started is when each running container was started: for one this
	// process started, when its task's Start returned; for one started
	// before (a restarted kubelet), when the kernel started its process.
	// The start time goes to the container's labels only with its exit
	// record: a label write right after each start was a second
	// containerd metadata transaction per container.
	startedMu sync.Mutex
	started   map[string]time.Time
}

// fifoIO is the IO of a task with stdin: the shim reads stdin from a FIFO
// and copies stdout and stderr into two more FIFOs, read by a
// container-logger the runtime starts. (The shim's binary:// logging passes
// no stdin.) The shim holds the stdin FIFO open for writing itself, so the
// process's stdin stays open between attaches (and across kubelet
// restarts) until StdinDone closes it.
type fifoIO struct{ cfg cio.Config }

func (l *fifoIO) Config() cio.Config { return l.cfg }
func (l *fifoIO) Cancel()            {}
func (l *fifoIO) Wait()              {}
func (l *fifoIO) Close() error       { return nil }

// stdinIO makes the FIFOs of a container with stdin and starts the
// container-logger reading its output ones into logPath, in a session of
// its own so that it outlives the kubelet; it ends when the shim closes the
// streams (the container exited). stop kills it, for a container that did
// not start.
func (c *Containerd) stdinIO(logPath string) (cio.Creator, func(), error) {
	base := strings.TrimSuffix(logPath, ".log")
	stdin, stdout, stderr := StdinPath(logPath), base+".stdout", base+".stderr"
	for _, f := range []string{stdin, stdout, stderr} {
		os.Remove(f)
		if err := syscall.Mkfifo(f, 0o600); err != nil {
			return nil, nil, fmt.Errorf("FIFO %s: %w", f, err)
		}
	}
	cmd := exec.Command(c.opts.Logger, containerlog.LoggerCommand, "--stdout", stdout, "--stderr", stderr, logPath)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start container logger: %w", err)
	}
	// Reaped here while the kubelet runs; by init after it restarts.
	go func() {
		if err := cmd.Wait(); err != nil {
			c.log.Warn("container logger", "log", logPath, "err", err)
		}
	}()
	creator := func(string) (cio.IO, error) {
		return &fifoIO{cfg: cio.Config{Stdin: stdin, Stdout: stdout, Stderr: stderr}}, nil
	}
	return creator, func() { cmd.Process.Kill() }, nil
}

// missingTaskGrace is how long a started container may lack its task
// before it counts as exited.
const missingTaskGrace = 5 * time.Second

// missingFor records that id has no task and reports whether that has been
// so for at least d.
func (c *Containerd) missingFor(id string, d time.Duration) bool {
	c.missingMu.Lock()
	defer c.missingMu.Unlock()
	first, ok := c.missing[id]
	if !ok {
		c.missing[id] = time.Now()
		return false
	}
	return time.Since(first) >= d
}

var _ Runtime = (*Containerd)(nil)

// NewContainerd connects to containerd.
func NewContainerd(opts ContainerdOptions) (*Containerd, error) {
	if opts.Namespace == "" {
		opts.Namespace = "waggle"
	}
	if opts.Snapshotter == "" {
		opts.Snapshotter = "overlayfs"
	}
	if opts.RuntimeName == "" {
		opts.RuntimeName = "io.containerd.runc.v2"
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Logger == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("container logger: find this executable: %w", err)
		}
		opts.Logger = DefaultLogger(self)
	}
	if opts.Cgroup2Root == "" || opts.Cgroup1MemoryRoot == "" {
		v2, v1mem := cgroupMounts()
		if opts.Cgroup2Root == "" {
			opts.Cgroup2Root = v2
		}
		if opts.Cgroup1MemoryRoot == "" {
			opts.Cgroup1MemoryRoot = v1mem
		}
	}
	client, err := containerd.New(opts.Address,
		containerd.WithDefaultNamespace(opts.Namespace),
		containerd.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("connect to containerd at %s: %w", opts.Address, err)
	}
	c := &Containerd{opts: opts, client: client, log: opts.Log, missing: map[string]time.Time{}, started: map[string]time.Time{},
		images: map[string]containerd.Image{}}
	ctx, cancel := context.WithCancel(context.Background())
	c.stopEvents = cancel
	go c.watchEvents(ctx)
	return c, nil
}

// watchEvents records containerd's OOM events in the containers' labels, so
// an OOM kill is known after restarts too, and forgets the images EnsureImage
// resolved at any image event. It reconnects after containerd restarts.
func (c *Containerd) watchEvents(ctx context.Context) {
	for ctx.Err() == nil {
		ch, errs := c.client.Subscribe(namespaces.WithNamespace(ctx, c.opts.Namespace),
			fmt.Sprintf(`namespace==%q,topic=="/tasks/oom"`, c.opts.Namespace),
			fmt.Sprintf(`namespace==%q,topic~="^/images/"`, c.opts.Namespace))
		// What was resolved before this subscription may have changed
		// unseen.
		c.forgetImages()
	loop:
		for {
			select {
			case <-ctx.Done():
				return
			case <-errs:
				c.forgetImages()
				break loop
			case env := <-ch:
				if env == nil || env.Event == nil {
					continue
				}
				if strings.HasPrefix(env.Topic, "/images/") {
					c.forgetImages()
					continue
				}
				v, err := typeurl.UnmarshalAny(env.Event)
				if err != nil {
					continue
				}
				if ev, ok := v.(*apievents.TaskOOM); ok {
					cctx := c.ctx(ctx)
					if ctr, err := c.client.LoadContainer(cctx, ev.ContainerID); err == nil {
						ctr.SetLabels(cctx, map[string]string{LabelOOM: "true"})
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// Client returns the containerd client (for image import at start).
func (c *Containerd) Client() *containerd.Client { return c.client }

// Namespace returns the containerd namespace in use.
func (c *Containerd) Namespace() string { return c.opts.Namespace }

func (c *Containerd) ctx(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, c.opts.Namespace)
}

// Close closes the client connection; containers keep running.
func (c *Containerd) Close() error {
	c.stopEvents()
	return c.client.Close()
}

// Version implements Runtime.
func (c *Containerd) Version(ctx context.Context) (string, string, error) {
	v, err := c.client.Version(c.ctx(ctx))
	if err != nil {
		return "", "", fmt.Errorf("containerd version: %w", err)
	}
	return "containerd", v.Version, nil
}

// NormalizeImage turns "nginx" into "docker.io/library/nginx:latest", as
// containerd's image store names images.
func NormalizeImage(image string) (string, error) {
	n, err := reference.ParseDockerRef(image)
	if err != nil {
		return "", fmt.Errorf("image reference %q: %w", image, err)
	}
	return n.String(), nil
}

// LocalRegistry is the registry name of images that exist only on the
// node (imported from --image-dir or `waggle images`): never resolved in
// DNS, never pulled.
const LocalRegistry = "waggle.local"

// LocalOnly reports whether a normalized reference names a node-local image.
func LocalOnly(ref string) bool { return localOnly(ref, nil) }

// localOnly reports whether ref is under LocalRegistry or one of others.
func localOnly(ref string, others []string) bool {
	n, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return false
	}
	d := reference.Domain(n)
	return d == LocalRegistry || slices.Contains(others, d)
}

// forgetImages empties the image cache (see Containerd.images).
func (c *Containerd) forgetImages() {
	c.imagesMu.Lock()
	defer c.imagesMu.Unlock()
	c.imagesGen++
	clear(c.images)
}

// cachedImage is the image EnsureImage resolved for ref, if any, and the
// cache's generation to pass to keepImage.
func (c *Containerd) cachedImage(ref string) (containerd.Image, uint64) {
	c.imagesMu.Lock()
	defer c.imagesMu.Unlock()
	return c.images[ref], c.imagesGen
}

// keepImage caches img for ref unless an image event came after gen.
func (c *Containerd) keepImage(ref string, img containerd.Image, gen uint64) {
	c.imagesMu.Lock()
	defer c.imagesMu.Unlock()
	if gen == c.imagesGen {
		c.images[ref] = img
	}
}

// forgetImage drops ref from the cache (its image failed a use).
func (c *Containerd) forgetImage(ref string) {
	c.imagesMu.Lock()
	defer c.imagesMu.Unlock()
	delete(c.images, ref)
}

// unpackError is an unpack's failure, told apart from the lookup's.
type unpackError struct{ error }

// EnsureImage implements Runtime.
func (c *Containerd) EnsureImage(ctx context.Context, image string, policy PullPolicy) (string, error) {
	ctx = c.ctx(ctx)
	ref, err := NormalizeImage(image)
	if err != nil {
		return "", err
	}
	local := localOnly(ref, c.opts.LocalRegistries)
	if local && policy == PullAlways {
		// There is no registry to ask: the node's copy is the image.
		policy = PullIfNotPresent
	}
	if policy != PullAlways {
		t0 := time.Now()
		// Pods of one image arriving together share one lookup.
		v, err, _ := c.lookups.Do(ref, func() (any, error) {
			img, gen := c.cachedImage(ref)
			if img != nil {
				return img, nil
			}
			img, err := c.client.GetImage(ctx, ref)
			if err != nil {
				return nil, err
			}
			if ok, _ := img.IsUnpacked(ctx, c.opts.Snapshotter); !ok {
				if err := img.Unpack(ctx, c.opts.Snapshotter); err != nil {
					return nil, unpackError{fmt.Errorf("unpack image %s: %w", ref, err)}
				}
			}
			c.keepImage(ref, img, gen)
			return img, nil
		})
		if err == nil {
			c.observe("image_status", t0)
			return v.(containerd.Image).Target().Digest.String(), nil
		}
		if ue := (unpackError{}); errors.As(err, &ue) {
			return "", ue.error
		}
		if !errdefs.IsNotFound(err) {
			return "", fmt.Errorf("look up image %s: %w", ref, err)
		}
		if policy == PullNever {
			return "", fmt.Errorf("%w: %s (imagePullPolicy is Never)", ErrImageNotFound, ref)
		}
		if local {
			return "", fmt.Errorf("pull image %s: %w: images under %s exist only where they were imported (--image-dir, waggle images) and are never looked up in DNS or pulled; check the name and tag",
				ref, ErrNotFound, strings.Join(append([]string{LocalRegistry}, c.opts.LocalRegistries...), ", "))
		}
	}
	v, err, _ := c.pulls.Do(ref, func() (any, error) {
		start := time.Now()
		defer c.observe("pull_image", start)
		resolver := docker.NewResolver(docker.ResolverOptions{
			Hosts: docker.ConfigureDefaultRegistries(docker.WithPlainHTTP(docker.MatchLocalhost)),
		})
		img, err := c.client.Pull(ctx, ref,
			containerd.WithPullUnpack,
			containerd.WithPullSnapshotter(c.opts.Snapshotter),
			containerd.WithResolver(resolver))
		if err != nil {
			return "", fmt.Errorf("pull image %s: %w", ref, err)
		}
		c.log.Info("pulled image", "image", ref, "took", time.Since(start).Round(time.Millisecond))
		return img.Target().Digest.String(), nil
	})
	if err != nil {
		return "", err
	}
	return v.(string), nil
}

// LoggerBinary is the small executable that writes container logs
// (cmd/waggle-container-logger), looked for beside the kubelet's own.
const LoggerBinary = "waggle-container-logger"

// DefaultLogger is the container logger for a kubelet running as self:
// LoggerBinary in self's directory when it is there, else self (the waggle
// binary answers `container-logger` too, at ~60 ms of CPU per container
// for its packages' init instead of ~2 ms).
func DefaultLogger(self string) string {
	small := filepath.Join(filepath.Dir(self), LoggerBinary)
	if fi, err := os.Stat(small); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
		return small
	}
	return self
}

// observe records an operation started at t0 (see ContainerdOptions.Observe).
func (c *Containerd) observe(op string, t0 time.Time) {
	if c.opts.Observe != nil {
		c.opts.Observe(op, time.Since(t0))
	}
}

func newID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// StartContainer implements Runtime.
func (c *Containerd) StartContainer(ctx context.Context, cfg ContainerConfig) (string, error) {
	ctx = c.ctx(ctx)
	tCreate := time.Now()
	ref, err := NormalizeImage(cfg.Image)
	if err != nil {
		return "", err
	}
	// The image EnsureImage resolved, else containerd's. A cached one that
	// fails (gone in a gap of the event subscription) is looked up again,
	// under a new ID (a failed create may leave its snapshot's key taken
	// until containerd's garbage collection).
	image, _ := c.cachedImage(ref)
	cached := image != nil
	for {
		id := newID()
		cgroup := ""
		if cfg.CgroupParent != "" {
			cgroup = filepath.Join(cfg.CgroupParent, id)
		}
		if !cached {
			var err error
			if image, err = c.client.GetImage(ctx, ref); err != nil {
				if errdefs.IsNotFound(err) {
					return "", fmt.Errorf("%w: %s", ErrImageNotFound, ref)
				}
				return "", fmt.Errorf("image %s: %w", ref, err)
			}
		}
		ctr, err := c.newContainer(ctx, id, cgroup, image, cfg)
		if err != nil && cached {
			c.forgetImage(ref)
			cached = false
			continue
		}
		if err != nil {
			return "", fmt.Errorf("create container %s: %w", cfg.Name, err)
		}
		c.observe("create_container", tCreate)
		return c.startTask(ctx, ctr, id, cfg)
	}
}

// newContainer creates container id of cfg from image: its snapshot, spec
// and labels.
func (c *Containerd) newContainer(ctx context.Context, id, cgroup string, image containerd.Image, cfg ContainerConfig) (containerd.Container, error) {
	// No tmpfs on /run: containerd's default spec has one, upstream's CRI
	// spec removes it (the image's /run is the container's), and it was a
	// mount more for runc per container.
	opts := []oci.SpecOpts{oci.WithImageConfig(image), oci.WithoutRunMount}
	switch {
	case len(cfg.Command) > 0:
		opts = append(opts, oci.WithProcessArgs(append(append([]string{}, cfg.Command...), cfg.Args...)...))
	case len(cfg.Args) > 0:
		opts = append(opts, oci.WithImageConfigArgs(image, cfg.Args))
	}
	if cfg.WorkingDir != "" {
		opts = append(opts, oci.WithProcessCwd(cfg.WorkingDir))
	}
	if len(cfg.Env) > 0 {
		opts = append(opts, oci.WithEnv(cfg.Env))
	}
	if cfg.Hostname != "" {
		opts = append(opts, oci.WithHostname(cfg.Hostname))
	}
	if cfg.NetNSPath != "" {
		opts = append(opts, oci.WithLinuxNamespace(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: cfg.NetNSPath}))
	} else {
		opts = append(opts, oci.WithHostNamespace(specs.NetworkNamespace))
	}
	if cgroup != "" {
		opts = append(opts, oci.WithCgroup(cgroup))
	}
	if len(cfg.Mounts) > 0 {
		var ms []specs.Mount
		for _, m := range cfg.Mounts {
			o := []string{"rbind", "rw"}
			if m.ReadOnly {
				o = []string{"rbind", "ro"}
			}
			ms = append(ms, specs.Mount{Destination: m.ContainerPath, Type: "bind", Source: m.HostPath, Options: o})
		}
		opts = append(opts, oci.WithMounts(ms))
	}
	opts = append(opts, withCgroupfs(cfg))
	opts = append(opts, securityOpts(cfg.Security)...)
	if cfg.MemoryLimit > 0 {
		opts = append(opts, oci.WithMemoryLimit(uint64(cfg.MemoryLimit)))
	}
	if cfg.CPUShares > 0 {
		opts = append(opts, oci.WithCPUShares(cfg.CPUShares))
	}
	if cfg.CPUQuota > 0 {
		period := cfg.CPUPeriod
		if period == 0 {
			period = 100000
		}
		opts = append(opts, oci.WithCPUCFS(cfg.CPUQuota, period))
	}
	labels := map[string]string{
		LabelPodUID:       cfg.PodUID,
		LabelPodName:      cfg.PodName,
		LabelPodNamespace: cfg.PodNamespace,
		LabelContainer:    cfg.Name,
		LabelAttempt:      strconv.Itoa(cfg.Attempt),
		LabelImage:        cfg.Image,
		LabelImageID:      image.Target().Digest.String(),
		LabelLogPath:      cfg.LogPath,
		LabelCgroup:       cgroup,
	}
	if cfg.ResourcesRecord != "" {
		labels[LabelResources] = cfg.ResourcesRecord
	}
	if cfg.Stdin && cfg.StdinOnce {
		labels[LabelStdinOnce] = "true"
	}
	if cfg.Init {
		labels[LabelInit] = "true"
	}
	return c.client.NewContainer(ctx, id,
		containerd.WithImage(image),
		containerd.WithSnapshotter(c.opts.Snapshotter),
		containerd.WithNewSnapshot(id, image),
		containerd.WithRuntime(c.opts.RuntimeName, nil),
		containerd.WithNewSpec(opts...),
		containerd.WithContainerLabels(labels))
}

// startTask starts the task of the new container ctr (id), its IO the log
// cfg names, and records the start time; on failure ctr is removed.
func (c *Containerd) startTask(ctx context.Context, ctr containerd.Container, id string, cfg ContainerConfig) (string, error) {
	tStart := time.Now()
	fail := func(err error) (string, error) {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		ctr.Delete(dctx, containerd.WithSnapshotCleanup)
		return "", err
	}
	creator := cio.NullIO
	if cfg.LogPath != "" {
		if err := os.MkdirAll(filepath.Dir(cfg.LogPath), 0o755); err != nil {
			return fail(fmt.Errorf("log dir: %w", err))
		}
		creator = cio.BinaryIO(c.opts.Logger, containerlog.LoggerArgs(cfg.LogPath))
		if cfg.Stdin {
			var stopLogger func()
			var err error
			creator, stopLogger, err = c.stdinIO(cfg.LogPath)
			if err != nil {
				return fail(err)
			}
			inner := fail
			fail = func(err error) (string, error) {
				stopLogger()
				return inner(err)
			}
		}
	}
	task, err := ctr.NewTask(ctx, creator)
	if err != nil {
		return fail(fmt.Errorf("create task of %s: %w", cfg.Name, err))
	}
	if err := task.Start(ctx); err != nil {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		task.Delete(dctx, containerd.WithProcessKill)
		cancel()
		return fail(fmt.Errorf("start %s: %w", cfg.Name, err))
	}
	c.startedMu.Lock()
	c.started[id] = time.Now()
	c.startedMu.Unlock()
	c.observe("start_container", tStart)
	return id, nil
}

// StopContainer implements Runtime.
func (c *Containerd) StopContainer(ctx context.Context, id string, grace time.Duration) error {
	ctx = c.ctx(ctx)
	defer c.observe("stop_container", time.Now())
	ctr, err := c.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("load container %s: %w", id, err)
	}
	task, err := ctr.Task(ctx, nil)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("task of %s: %w", id, err)
	}
	st, err := task.Status(ctx)
	if err == nil && st.Status == containerd.Stopped {
		return nil
	}
	waitCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	exited, err := task.Wait(waitCtx)
	if err != nil {
		return fmt.Errorf("wait for %s: %w", id, err)
	}
	if grace > 0 {
		if err := task.Kill(ctx, syscall.SIGTERM); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("SIGTERM %s: %w", id, err)
		}
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-exited:
			return nil
		case <-t.C:
		case <-ctx.Done():
		}
	}
	if err := task.Kill(context.WithoutCancel(ctx), syscall.SIGKILL, containerd.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("SIGKILL %s: %w", id, err)
	}
	select {
	case <-exited:
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("container %s did not exit 30 s after SIGKILL", id)
	}
}

// withCgroupfs gives the container its own cgroups at /sys/fs/cgroup, as a
// CRI runtime does (containerd's default spec has no such mount): read-only
// (a privileged container's is made writable by oci.WithPrivileged), its
// own cgroup as the root — on cgroup v1 runc binds it per hierarchy, on a
// unified host a private cgroup namespace does it — unless the pod mounts
// something there itself.
func withCgroupfs(cfg ContainerConfig) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		for _, m := range cfg.Mounts {
			if filepath.Clean(m.ContainerPath) == "/sys/fs/cgroup" {
				return nil
			}
		}
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup",
			Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}})
		if _, v1 := cgroupfs.V1Controller("cpu"); !v1 && !cfg.Security.Privileged {
			if s.Linux == nil {
				s.Linux = &specs.Linux{}
			}
			s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.CgroupNamespace})
		}
		return nil
	}
}

// SetPodCgroup implements Runtime: the cgroup files, written directly.
func (c *Containerd) SetPodCgroup(_ context.Context, path string, r Resources) error {
	return writePodCgroup(path, r)
}

// RemovePodCgroup implements Runtime: the directory in every hierarchy.
func (c *Containerd) RemovePodCgroup(_ context.Context, path string) error {
	return removePodCgroup(path)
}

// UpdateResources implements Runtime: the task's cgroups change in place
// (runc update), then the container's record label.
func (c *Containerd) UpdateResources(ctx context.Context, id string, r Resources, record string) error {
	ctx = c.ctx(ctx)
	ctr, err := c.client.LoadContainer(ctx, id)
	if err != nil {
		return fmt.Errorf("%w: container %s", ErrNotFound, id)
	}
	task, err := ctr.Task(ctx, nil)
	if err != nil {
		return fmt.Errorf("task of %s: %w", id, err)
	}
	if err := task.Update(ctx, containerd.WithResources(linuxResources(r))); err != nil {
		return fmt.Errorf("update resources of %s: %w", id, err)
	}
	if _, err := ctr.SetLabels(ctx, map[string]string{LabelResources: record}); err != nil {
		return fmt.Errorf("record resources of %s: %w", id, err)
	}
	return nil
}

// linuxResources are r as an update (Resources.limits).
func linuxResources(r Resources) *specs.LinuxResources {
	shares, quota, period, mem := r.limits()
	return &specs.LinuxResources{
		CPU:    &specs.LinuxCPU{Shares: &shares, Quota: &quota, Period: &period},
		Memory: &specs.LinuxMemory{Limit: &mem},
	}
}

// StdinDone implements Runtime.
func (c *Containerd) StdinDone(ctx context.Context, id string) error {
	ctx = c.ctx(ctx)
	ctr, err := c.client.LoadContainer(ctx, id)
	if err != nil {
		return fmt.Errorf("%w: container %s", ErrNotFound, id)
	}
	l, err := ctr.Labels(ctx)
	if err != nil || l[LabelStdinOnce] != "true" {
		return err
	}
	task, err := ctr.Task(ctx, nil)
	if err != nil {
		return fmt.Errorf("%w: task of %s", ErrNotFound, id)
	}
	return task.CloseIO(ctx, containerd.WithStdinCloser)
}

// RemoveContainer implements Runtime.
func (c *Containerd) RemoveContainer(ctx context.Context, id string) error {
	ctx = c.ctx(ctx)
	defer c.observe("remove_container", time.Now())
	ctr, err := c.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("load container %s: %w", id, err)
	}
	if task, err := ctr.Task(ctx, nil); err == nil {
		if _, err := task.Delete(ctx, containerd.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("delete task of %s: %w", id, err)
		}
	}
	if err := ctr.Delete(ctx, containerd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("delete container %s: %w", id, err)
	}
	c.forgetStarted(id)
	return nil
}

func (c *Containerd) forgetStarted(id string) {
	c.startedMu.Lock()
	delete(c.started, id)
	c.startedMu.Unlock()
}

// startedAt is when container id, whose task is proc (nil: none), was
// started, as far as this process knows (see started); zero if unknown.
func (c *Containerd) startedAt(id string, proc *task.Process) time.Time {
	c.startedMu.Lock()
	defer c.startedMu.Unlock()
	if t, ok := c.started[id]; ok {
		return t
	}
	// Only a live process: a stopped task's PID may belong to another
	// process by now.
	if proc == nil || proc.Pid == 0 || (proc.Status != task.Status_RUNNING && proc.Status != task.Status_PAUSED && proc.Status != task.Status_PAUSING) {
		return time.Time{}
	}
	t, err := procfs.StartedAt(int(proc.Pid))
	if err != nil {
		return time.Time{}
	}
	c.started[id] = t
	return t
}

// ListContainers implements Runtime. An exited container's task is deleted
// once its exit is recorded in the container's labels (so its shim goes
// away), and its OOM kill is read from its cgroup before that. The tasks'
// states come from one ListTasks call, not two calls per container: the
// kubelet relists every second and after starts, and 100 containers made
// that 200 round trips to containerd (and as many to the shims) each time.
func (c *Containerd) ListContainers(ctx context.Context) ([]Container, error) {
	ctx = c.ctx(ctx)
	defer c.observe("list_containers", time.Now())
	ctrs, err := c.client.Containers(ctx, fmt.Sprintf("labels.%q", LabelPodUID))
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	// Listed after the containers: a task created meanwhile is seen.
	resp, err := c.client.TaskService().List(ctx, &tasks.ListTasksRequest{})
	if err != nil {
		return nil, fmt.Errorf("list tasks: %w", errdefs.FromGRPC(err))
	}
	procs := make(map[string]*task.Process, len(resp.Tasks))
	for _, p := range resp.Tasks {
		procs[p.ID] = p
	}
	out := make([]Container, 0, len(ctrs))
	for _, ctr := range ctrs {
		info, err := ctr.Info(ctx, containerd.WithoutRefreshedMetadata)
		if err != nil {
			if errdefs.IsNotFound(err) {
				continue
			}
			return nil, fmt.Errorf("container %s: %w", ctr.ID(), err)
		}
		rc := fromLabels(info)
		if rc.StartedAt.IsZero() {
			rc.StartedAt = c.startedAt(ctr.ID(), procs[ctr.ID()])
			if p := procs[ctr.ID()]; rc.StartedAt.IsZero() && p != nil && p.Status == task.Status_STOPPED {
				// Started and exited while no kubelet ran: its start is
				// known nowhere; the container was made right before it
				// (each instance is a container of its own).
				rc.StartedAt = info.CreatedAt
			}
		}
		c.fillState(ctx, ctr, &info, &rc, procs[ctr.ID()])
		out = append(out, rc)
	}
	return out, nil
}

func fromLabels(info containers.Container) Container {
	l := info.Labels
	attempt, _ := strconv.Atoi(l[LabelAttempt])
	rc := Container{
		ID: info.ID, PodUID: l[LabelPodUID], PodName: l[LabelPodName], PodNamespace: l[LabelPodNamespace],
		Name: l[LabelContainer], Attempt: attempt, Init: l[LabelInit] == "true",
		Image: l[LabelImage], ImageID: l[LabelImageID], LogPath: l[LabelLogPath], CreatedAt: info.CreatedAt,
		ResourcesRecord: l[LabelResources], StdinOnce: l[LabelStdinOnce] == "true",
	}
	rc.StartedAt, _ = time.Parse(time.RFC3339Nano, l[LabelStartedAt])
	return rc
}

// fillState sets rc's state from its labels (a recorded exit) or its task,
// proc (nil: the container had no task when the tasks were listed).
func (c *Containerd) fillState(ctx context.Context, ctr containerd.Container, info *containers.Container, rc *Container, proc *task.Process) {
	l := info.Labels
	if code, ok := l[LabelExitCode]; ok {
		n, _ := strconv.Atoi(code)
		rc.State, rc.ExitCode, rc.Reason = StateExited, int32(n), l[LabelReason]
		rc.FinishedAt, _ = time.Parse(time.RFC3339Nano, l[LabelFinishedAt])
		return
	}
	if proc != nil {
		c.missingMu.Lock()
		delete(c.missing, rc.ID)
		c.missingMu.Unlock()
	} else {
		// Another lister may have just recorded the exit and deleted the
		// task: look at the labels again.
		if fresh, err := ctr.Info(ctx); err == nil {
			if _, ok := fresh.Labels[LabelExitCode]; ok {
				c.fillState(ctx, ctr, &fresh, rc, nil)
				return
			}
		}
		// No task. Right after containerd restarts, tasks reappear as
		// their shims are reloaded: only a task missing for a while is
		// gone (a start that failed half-way, or a shim that died).
		if !c.missingFor(rc.ID, missingTaskGrace) {
			rc.State = StateUnknown
			return
		}
		rc.State, rc.ExitCode, rc.Reason = StateExited, 128, "ContainerCannotRun"
		rc.FinishedAt = info.UpdatedAt
		return
	}
	rc.PID = proc.Pid
	switch proc.Status {
	case task.Status_RUNNING, task.Status_PAUSED, task.Status_PAUSING:
		rc.State = StateRunning
	case task.Status_CREATED:
		rc.State = StateCreated
	case task.Status_STOPPED:
		rc.State = StateExited
		rc.ExitCode = int32(proc.ExitStatus)
		if proc.ExitedAt != nil {
			rc.FinishedAt = proc.ExitedAt.AsTime()
		}
		rc.Reason = "Completed"
		if rc.ExitCode != 0 {
			rc.Reason = "Error"
		}
		if l[LabelOOM] == "true" || c.oomKilled(l[LabelCgroup]) {
			rc.Reason = "OOMKilled"
		} else if rc.ExitCode == 137 && time.Since(rc.FinishedAt) < oomGrace {
			// Killed: the OOM event may be on its way. Report the exit, but
			// record it only on a later look.
			return
		}
		labels := map[string]string{
			LabelExitCode:   strconv.Itoa(int(rc.ExitCode)),
			LabelFinishedAt: rc.FinishedAt.UTC().Format(time.RFC3339Nano),
			LabelReason:     rc.Reason,
		}
		if !rc.StartedAt.IsZero() {
			labels[LabelStartedAt] = rc.StartedAt.UTC().Format(time.RFC3339Nano)
		}
		if _, err := ctr.SetLabels(ctx, labels); err != nil {
			c.log.Warn("record container exit", "container", rc.ID, "err", err)
			return
		}
		c.forgetStarted(rc.ID)
		t, err := ctr.Task(ctx, nil)
		if err == nil {
			_, err = t.Delete(ctx)
		}
		if err != nil && !errdefs.IsNotFound(err) {
			c.log.Warn("delete exited task", "container", rc.ID, "err", err)
		}
	default:
		rc.State = StateUnknown
	}
}

// oomKilled reads the OOM-kill counter of a (stopped, not yet deleted)
// container's cgroup, in whichever hierarchy holds the memory controller.
func (c *Containerd) oomKilled(cgroup string) bool {
	if cgroup == "" {
		return false
	}
	for _, f := range []string{
		filepath.Join(c.opts.Cgroup2Root, cgroup, "memory.events"),
		filepath.Join(c.opts.Cgroup1MemoryRoot, cgroup, "memory.oom_control"),
	} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == "oom_kill" && f[1] != "0" {
				return true
			}
		}
	}
	return false
}

// cgroupMounts returns the cgroup2 mount and the cgroup v1 memory
// controller's mount (either may be "").
func cgroupMounts() (v2, v1mem string) {
	v2, _ = cgroupfs.V2Root()
	v1mem, _ = cgroupfs.V1Controller("memory")
	return v2, v1mem
}

// stdinCloser tells the process its stdin ended once the reader does.
type stdinCloser struct {
	r      interface{ Read([]byte) (int, error) }
	closed func()
	once   sync.Once
}

func (s *stdinCloser) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil {
		s.once.Do(s.closed)
	}
	return n, err
}

// Exec implements Runtime.
func (c *Containerd) Exec(ctx context.Context, id string, cmd []string, o ExecOptions) (int, error) {
	ctx = c.ctx(ctx)
	if len(cmd) == 0 {
		return -1, errors.New("exec: empty command")
	}
	ctr, err := c.client.LoadContainer(ctx, id)
	if err != nil {
		if errdefs.IsNotFound(err) {
			return -1, fmt.Errorf("%w: container %s", ErrNotFound, id)
		}
		return -1, err
	}
	task, err := ctr.Task(ctx, nil)
	if err != nil {
		return -1, fmt.Errorf("container %s is not running: %w", id, err)
	}
	spec, err := ctr.Spec(ctx)
	if err != nil {
		return -1, fmt.Errorf("spec of %s: %w", id, err)
	}
	pspec := *spec.Process
	pspec.Args = cmd
	pspec.Terminal = o.TTY
	var proc containerd.Process
	// started is closed once proc is set and started (or failed to): the
	// end of stdin may come before, and must then wait for it.
	started := make(chan struct{})
	var startOnce sync.Once
	markStarted := func() { startOnce.Do(func() { close(started) }) }
	defer markStarted()
	var ioOpts []cio.Opt
	var stdin interface{ Read([]byte) (int, error) }
	if o.Stdin != nil {
		stdin = &stdinCloser{r: o.Stdin, closed: func() {
			go func() {
				<-started
				if proc != nil {
					proc.CloseIO(context.WithoutCancel(ctx), containerd.WithStdinCloser)
				}
			}()
		}}
	}
	stdout, stderr := o.Stdout, o.Stderr
	if stdout == nil {
		stdout = discard{}
	}
	if stderr == nil {
		stderr = discard{}
	}
	if stdin != nil {
		ioOpts = append(ioOpts, cio.WithStreams(stdin, stdout, stderr))
	} else {
		ioOpts = append(ioOpts, cio.WithStreams(nil, stdout, stderr))
	}
	if o.TTY {
		ioOpts = append(ioOpts, cio.WithTerminal)
	}
	execID := "exec-" + newID()[:12]
	p, err := task.Exec(ctx, execID, &pspec, cio.NewCreator(ioOpts...))
	if err != nil {
		return -1, fmt.Errorf("exec in %s: %w", id, err)
	}
	defer p.Delete(context.WithoutCancel(ctx), containerd.WithProcessKill)
	statusC, err := p.Wait(ctx)
	if err != nil {
		return -1, fmt.Errorf("wait for exec: %w", err)
	}
	if err := p.Start(ctx); err != nil {
		return -1, fmt.Errorf("start exec in %s: %w", id, err)
	}
	proc = p
	markStarted()
	if o.Resize != nil {
		go func() {
			for sz := range o.Resize {
				p.Resize(ctx, uint32(sz.Width), uint32(sz.Height))
			}
		}()
	}
	select {
	case st := <-statusC:
		p.IO().Wait()
		code, _, err := st.Result()
		if err != nil {
			return -1, err
		}
		return int(code), nil
	case <-ctx.Done():
		p.Kill(context.WithoutCancel(ctx), syscall.SIGKILL)
		return -1, ctx.Err()
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// Stats implements Runtime.
func (c *Containerd) Stats(ctx context.Context, id string) (*ContainerStats, error) {
	ctx = c.ctx(ctx)
	ctr, err := c.client.LoadContainer(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("%w: container %s", ErrNotFound, id)
	}
	task, err := ctr.Task(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("%w: task of %s", ErrNotFound, id)
	}
	m, err := task.Metrics(ctx)
	if err != nil {
		return nil, fmt.Errorf("metrics of %s: %w", id, err)
	}
	data, err := typeurl.UnmarshalAny(m.Data)
	if err != nil {
		return nil, fmt.Errorf("decode metrics of %s: %w", id, err)
	}
	s := &ContainerStats{Time: time.Now()}
	switch v := data.(type) {
	case *cg1stats.Metrics:
		if v.CPU != nil && v.CPU.Usage != nil {
			s.CPUUsageNanos = v.CPU.Usage.Total
		}
		if v.Memory != nil && v.Memory.Usage != nil {
			s.MemoryUsage = v.Memory.Usage.Usage
			s.MemoryLimit = v.Memory.Usage.Limit
			s.MemoryRSS = v.Memory.RSS
			ws := v.Memory.Usage.Usage
			if v.Memory.TotalInactiveFile < ws {
				ws -= v.Memory.TotalInactiveFile
			} else {
				ws = 0
			}
			s.MemoryWorkingSet = ws
		}
	case *cg2stats.Metrics:
		if v.CPU != nil {
			s.CPUUsageNanos = v.CPU.UsageUsec * 1000
		}
		if v.Memory != nil {
			s.MemoryUsage = v.Memory.Usage
			s.MemoryLimit = v.Memory.UsageLimit
			s.MemoryRSS = v.Memory.Anon
			ws := v.Memory.Usage
			if v.Memory.InactiveFile < ws {
				ws -= v.Memory.InactiveFile
			} else {
				ws = 0
			}
			s.MemoryWorkingSet = ws
		}
	default:
		return nil, fmt.Errorf("metrics of %s: unknown type %T", id, data)
	}
	readNetDev(task.Pid(), s)
	return s, nil
}

// readNetDev fills the network counters from /proc/PID/net/dev (eth0).
func readNetDev(pid uint32, s *ContainerStats) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/dev", pid))
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(b), "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || name != "eth0" {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 11 {
			return
		}
		n := func(i int) uint64 { v, _ := strconv.ParseUint(f[i], 10, 64); return v }
		s.RxBytes, s.RxErrors, s.TxBytes, s.TxErrors = n(0), n(2), n(8), n(10)
	}
}
