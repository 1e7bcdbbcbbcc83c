// Package runtime is the kubelet's container runtime edge: a small interface
// (images, containers, exec, stats) with the real implementation on
// containerd (runc, its own containerd namespace, logs in files, every fact
// the kubelet needs after a restart kept in container labels) and an
// in-memory Hollow runtime for hollow nodes (--runtime=hollow); the test
// double lives in runtimetest.
//
// It is not the pod logic: sandboxes (network namespaces, CNI, which cgroup
// settings a pod gets) and restart policies belong to the kubelet's pod
// workers; the runtime writes the pod cgroups they decide.
package runtime

import (
	"context"
	"errors"
	"io"
	"strings"
	"time"
)

// Errors of the runtime, by category.
var (
	ErrNotFound      = errors.New("not found")
	ErrImageNotFound = errors.New("image not present")
	ErrNotSupported  = errors.New("not supported by this runtime")
)

// PullPolicy is Kubernetes' imagePullPolicy.
type PullPolicy string

// Pull policies.
const (
	PullAlways       PullPolicy = "Always"
	PullIfNotPresent PullPolicy = "IfNotPresent"
	PullNever        PullPolicy = "Never"
)

// Mount is a bind mount into a container.
type Mount struct {
	HostPath      string
	ContainerPath string
	ReadOnly      bool
}

// ContainerConfig is what the kubelet asks the runtime to run.
type ContainerConfig struct {
	PodUID, PodNamespace, PodName string
	// Name is the container's name in the pod spec.
	Name string
	// Attempt is the container's restart count when started.
	Attempt int
	// Init marks an init container.
	Init  bool
	Image string
	// Command replaces the image's entrypoint and Args its cmd, as in
	// Kubernetes.
	Command, Args []string
	Env           []string
	WorkingDir    string
	Mounts        []Mount
	// NetNSPath is the pod's network namespace ("" keeps the host's).
	NetNSPath string
	Hostname  string
	// CgroupParent is the pod's cgroup path (relative to the hierarchy
	// roots, e.g. /waggle/node1/pod<uid>); the container gets a child.
	CgroupParent string
	// Resources are the container's cgroup settings; ResourcesRecord is
	// the kubelet's record of what they stand for (its spec's resources,
	// opaque to the runtime), kept with the container and returned by
	// ListContainers.
	Resources
	ResourcesRecord string
	// LogPath receives the container's stdout and stderr.
	LogPath string
	// Security is how the container's process is confined: its user and
	// groups, root filesystem, privileges and kernel parameters.
	Security Security
	// Stdin gives the process a stdin fed through the FIFO StdinPath(LogPath)
	// (for attach); with StdinOnce it is closed once the first attach that
	// wrote to it ends (StdinDone).
	Stdin, StdinOnce bool
}

// Resources are a container's cgroup settings: CPUShares, CPUQuota and
// CPUPeriod (µs) and MemoryLimit (bytes). When a container is started, zero
// means unset; when it is updated, a zero quota or memory limit means
// unlimited.
type Resources struct {
	CPUShares   uint64
	CPUQuota    int64
	CPUPeriod   uint64
	MemoryLimit int64
}

// Security is a container's effective securityContext (the pod's merged
// with the container's, as Kubernetes merges them) in the runtime's terms.
// The zero value is the runtime's default: the image's user, a writable
// root filesystem, the default capabilities.
type Security struct {
	// RunAsUser and RunAsGroup override the image's user and its primary
	// group; a group without a user applies to the image's user.
	RunAsUser, RunAsGroup *int64
	// SupplementalGroups are added to the groups the image's /etc/group
	// gives the user (the pod's supplementalGroups and fsGroup).
	SupplementalGroups []int64
	// ReadOnlyRootfs mounts the container's root filesystem read-only.
	ReadOnlyRootfs bool
	// NoNewPrivileges sets the process's no_new_privs bit
	// (allowPrivilegeEscalation: false).
	NoNewPrivileges bool
	// Privileged gives every capability and device, unmasks /proc and
	// makes /sys writable.
	Privileged bool
	// AddCaps and DropCaps are capability names without the CAP_ prefix
	// ("NET_ADMIN", or "ALL"), as Kubernetes spells them.
	AddCaps, DropCaps []string
	// Sysctls are namespaced kernel parameters set in the container's
	// namespaces (the pod's securityContext.sysctls).
	Sysctls map[string]string
}

// StdinPath is the FIFO feeding the stdin of the container logging to
// logPath, when it was started with Stdin.
func StdinPath(logPath string) string { return strings.TrimSuffix(logPath, ".log") + ".stdin" }

// State of a container.
type State string

// Container states.
const (
	StateCreated State = "created"
	StateRunning State = "running"
	StateExited  State = "exited"
	StateUnknown State = "unknown"
)

// Container is one container as the runtime knows it.
type Container struct {
	ID                            string
	PodUID, PodNamespace, PodName string
	Name                          string
	Attempt                       int
	Init                          bool
	Image, ImageID                string
	State                         State
	PID                           uint32
	CreatedAt, StartedAt          time.Time
	FinishedAt                    time.Time
	ExitCode                      int32
	// Reason is set when exited: Completed, Error or OOMKilled.
	Reason  string
	LogPath string
	// ResourcesRecord is the record the container was started or last
	// updated with (ContainerConfig.ResourcesRecord).
	ResourcesRecord string
	// StdinOnce: started with Stdin and StdinOnce.
	StdinOnce bool
}

// TermSize is a terminal size for exec with a TTY.
type TermSize struct{ Width, Height uint16 }

// ExecOptions are an exec's streams; nil streams are not attached.
type ExecOptions struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	TTY            bool
	Resize         <-chan TermSize
}

// ContainerStats are a container's resource usage, as cgroups report it.
type ContainerStats struct {
	Time time.Time
	// CPUUsageNanos is cumulative CPU time.
	CPUUsageNanos uint64
	// Memory figures in bytes.
	MemoryUsage, MemoryWorkingSet, MemoryRSS uint64
	MemoryLimit                              uint64
	// Network counters of the container's network namespace (eth0).
	RxBytes, TxBytes, RxErrors, TxErrors uint64
}

// Runtime is the container runtime the kubelet drives.
type Runtime interface {
	// Version returns the runtime's name and version (for NodeInfo).
	Version(ctx context.Context) (name, version string, err error)
	// EnsureImage makes image present according to policy and returns its
	// ID (the config digest). With PullNever a missing image is
	// ErrImageNotFound.
	EnsureImage(ctx context.Context, image string, policy PullPolicy) (string, error)
	// StartContainer creates and starts a container and returns its ID.
	StartContainer(ctx context.Context, cfg ContainerConfig) (string, error)
	// StopContainer sends SIGTERM, waits up to grace, then SIGKILLs and
	// waits for the exit. Stopping an exited container is a no-op.
	StopContainer(ctx context.Context, id string, grace time.Duration) error
	// RemoveContainer removes an exited container and its writable layer.
	// Removing a missing container succeeds.
	RemoveContainer(ctx context.Context, id string) error
	// ListContainers returns every container the kubelet created (in its
	// namespace), running or exited.
	ListContainers(ctx context.Context) ([]Container, error)
	// Exec runs cmd in a running container and returns its exit code.
	Exec(ctx context.Context, id string, cmd []string, opts ExecOptions) (int, error)
	// Stats returns a running container's usage.
	Stats(ctx context.Context, id string) (*ContainerStats, error)
	// SetPodCgroup creates or updates a pod's cgroup (path, the parent of
	// its containers' cgroups) with r, the pod's aggregate settings.
	SetPodCgroup(ctx context.Context, path string, r Resources) error
	// RemovePodCgroup removes a pod's cgroup, empty once its containers are
	// gone (their own cgroups go with them).
	RemovePodCgroup(ctx context.Context, path string) error
	// UpdateResources changes a running container's cgroup settings in
	// place (in-place pod resize) and replaces its ResourcesRecord.
	UpdateResources(ctx context.Context, id string, r Resources, record string) error
	// StdinDone is told that an attach writing to the container's stdin
	// ended: a StdinOnce container's stdin is then closed, as upstream.
	StdinDone(ctx context.Context, id string) error
	// MountImage mounts the root filesystem of image (made present by
	// EnsureImage) read-only at target, for the pod podUID (an image
	// volume). It may be called again for a target already mounted.
	MountImage(ctx context.Context, podUID, image, target string) error
	// UnmountImages unmounts and releases every image MountImage mounted
	// for the pod. Releasing a pod without any succeeds.
	UnmountImages(ctx context.Context, podUID string) error
	// ImageMountPods lists the pods holding image mounts (to release those
	// of pods that are gone, after a restart).
	ImageMountPods(ctx context.Context) ([]string, error)
	// Close releases the runtime's connections (containers keep running).
	Close() error
}

// Image is one image of the runtime's store, as image garbage collection
// sees it: ID is what Container.ImageID holds (every name of the same image
// shares it), Size its bytes on disk.
type Image struct {
	ID       string
	RepoTags []string
	Size     int64
	// CreatedAt is when the store first held the image (its oldest name).
	CreatedAt time.Time
}

// Storage is the disk side of a runtime, for image garbage collection and
// disk-pressure eviction. Containerd implements it; a runtime without a
// disk (Hollow) does not, and the kubelet then collects no images.
type Storage interface {
	// ListImages lists the store's images, one per ID.
	ListImages(ctx context.Context) ([]Image, error)
	// RemoveImage removes every name of the image with id and waits for
	// its content and snapshots to be released. A missing image succeeds.
	RemoveImage(ctx context.Context, id string) error
	// ImageFsDir is a directory on the filesystem that holds the images'
	// unpacked layers (the snapshotter's root): the imagefs.
	ImageFsDir(ctx context.Context) (string, error)
	// WritableLayerUsage is the bytes and inodes a container's writable
	// layer uses.
	WritableLayerUsage(ctx context.Context, id string) (bytes, inodes uint64, err error)
}
