package kubelet

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	securejoin "github.com/cyphar/filepath-securejoin"

	authv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"

	"github.com/waggle-io/waggle/kubelet/internal/atomicwriter"
	"github.com/waggle-io/waggle/kubelet/runtime"
)

// volumeRefresh is how often configMap, secret, downward API and projected
// volumes are rewritten from the API.
const volumeRefresh = 30 * time.Second

func (k *Kubelet) volumeDir(pod *v1.Pod, name string) string {
	return filepath.Join(k.podDir(pod.UID), "volumes", name)
}

// ensureVolumes materialises the pod's volumes under its dir (first sync,
// then every volumeRefresh for the API-backed ones).
func (w *podWorker) ensureVolumes(ctx context.Context, pod *v1.Pod) error {
	if !w.volumesAt.IsZero() && time.Since(w.volumesAt) < volumeRefresh {
		return nil
	}
	for _, v := range pod.Spec.Volumes {
		if err := w.k.setUpVolume(ctx, pod, v); err != nil {
			return fmt.Errorf("volume %q: %w", v.Name, err)
		}
	}
	w.volumesAt = time.Now()
	return nil
}

// file is one file of an API-backed volume.
type file struct {
	path string
	data []byte
	mode os.FileMode
}

func keyFiles(data map[string][]byte, items []v1.KeyToPath, defMode *int32, optional bool, what string) ([]file, error) {
	mode := os.FileMode(0o644)
	if defMode != nil {
		mode = os.FileMode(*defMode)
	}
	var out []file
	if len(items) == 0 {
		for key, v := range data {
			out = append(out, file{key, v, mode})
		}
		return out, nil
	}
	for _, it := range items {
		v, ok := data[it.Key]
		if !ok {
			if optional {
				continue
			}
			return nil, fmt.Errorf("%s has no key %q", what, it.Key)
		}
		m := mode
		if it.Mode != nil {
			m = os.FileMode(*it.Mode)
		}
		out = append(out, file{it.Path, v, m})
	}
	return out, nil
}

func (k *Kubelet) configMapFiles(ctx context.Context, ns string, src *v1.ConfigMapVolumeSource, items []v1.KeyToPath, name string, optional bool, defMode *int32) ([]file, error) {
	cm, err := k.client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if optional {
			return nil, nil
		}
		return nil, fmt.Errorf("configmap %q: %w", name, err)
	}
	data := map[string][]byte{}
	for key, v := range cm.Data {
		data[key] = []byte(v)
	}
	for key, v := range cm.BinaryData {
		data[key] = v
	}
	return keyFiles(data, items, defMode, optional, "configmap "+name)
}

func (k *Kubelet) secretFiles(ctx context.Context, ns, name string, items []v1.KeyToPath, optional bool, defMode *int32) ([]file, error) {
	s, err := k.client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if optional {
			return nil, nil
		}
		return nil, fmt.Errorf("secret %q: %w", name, err)
	}
	return keyFiles(s.Data, items, defMode, optional, "secret "+name)
}

func (k *Kubelet) downwardFiles(pod *v1.Pod, items []v1.DownwardAPIVolumeFile, defMode *int32) ([]file, error) {
	mode := os.FileMode(0o644)
	if defMode != nil {
		mode = os.FileMode(*defMode)
	}
	var podIPs []string
	if len(pod.Status.PodIPs) > 0 {
		for _, ip := range pod.Status.PodIPs {
			podIPs = append(podIPs, ip.IP)
		}
	}
	var out []file
	for _, it := range items {
		var v string
		var err error
		switch {
		case it.FieldRef != nil:
			v, err = fieldValue(pod, it.FieldRef.FieldPath, podIPs, k.nodeIP)
		case it.ResourceFieldRef != nil:
			var c *v1.Container
			for i := range pod.Spec.Containers {
				if pod.Spec.Containers[i].Name == it.ResourceFieldRef.ContainerName {
					c = &pod.Spec.Containers[i]
				}
			}
			if c == nil && len(pod.Spec.Containers) > 0 {
				c = &pod.Spec.Containers[0]
			}
			if c != nil {
				v, err = k.resourceValue(c, it.ResourceFieldRef)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("downward API %s: %w", it.Path, err)
		}
		m := mode
		if it.Mode != nil {
			m = os.FileMode(*it.Mode)
		}
		out = append(out, file{it.Path, []byte(v), m})
	}
	return out, nil
}

// writeFiles makes dir hold exactly files, swapped in atomically (see
// package atomicwriter: ..data symlink to a versioned directory).
func writeFiles(dir string, files []file) error {
	payload := make(map[string]atomicwriter.File, len(files))
	for _, f := range files {
		payload[f.path] = atomicwriter.File{Data: f.data, Mode: f.mode}
	}
	_, err := atomicwriter.Write(dir, payload)
	return err
}

func (k *Kubelet) setUpVolume(ctx context.Context, pod *v1.Pod, v v1.Volume) error {
	dir := k.volumeDir(pod, v.Name)
	opt := func(b *bool) bool { return b != nil && *b }
	switch {
	case v.EmptyDir != nil:
		return setUpEmptyDir(dir, v.EmptyDir, pod.Spec.SecurityContext)
	case v.HostPath != nil:
		return setUpHostPath(v.HostPath)
	case v.PersistentVolumeClaim != nil:
		path, err := k.setUpClaim(ctx, pod, v.PersistentVolumeClaim)
		if err != nil {
			return err
		}
		k.claimPaths.Store(string(pod.UID)+"/"+v.Name, path)
		return nil
	case v.ConfigMap != nil:
		files, err := k.configMapFiles(ctx, pod.Namespace, v.ConfigMap, v.ConfigMap.Items, v.ConfigMap.Name, opt(v.ConfigMap.Optional), v.ConfigMap.DefaultMode)
		if err != nil {
			return err
		}
		return writeFiles(dir, files)
	case v.Secret != nil:
		files, err := k.secretFiles(ctx, pod.Namespace, v.Secret.SecretName, v.Secret.Items, opt(v.Secret.Optional), v.Secret.DefaultMode)
		if err != nil {
			return err
		}
		return writeFiles(dir, files)
	case v.DownwardAPI != nil:
		files, err := k.downwardFiles(pod, v.DownwardAPI.Items, v.DownwardAPI.DefaultMode)
		if err != nil {
			return err
		}
		return writeFiles(dir, files)
	case v.Image != nil:
		return nil // pulled and mounted as its containers start (imageVolumes)
	case v.Projected != nil:
		var all []file
		for i, s := range v.Projected.Sources {
			var files []file
			var err error
			switch {
			case s.ConfigMap != nil:
				files, err = k.configMapFiles(ctx, pod.Namespace, nil, s.ConfigMap.Items, s.ConfigMap.Name, opt(s.ConfigMap.Optional), v.Projected.DefaultMode)
			case s.Secret != nil:
				files, err = k.secretFiles(ctx, pod.Namespace, s.Secret.Name, s.Secret.Items, opt(s.Secret.Optional), v.Projected.DefaultMode)
			case s.DownwardAPI != nil:
				files, err = k.downwardFiles(pod, s.DownwardAPI.Items, v.Projected.DefaultMode)
			case s.ServiceAccountToken != nil:
				files, err = k.tokenFile(pod, s.ServiceAccountToken, v.Projected.DefaultMode)
			case s.ClusterTrustBundle != nil:
				files, err = k.trustBundleFile(ctx, s.ClusterTrustBundle, v.Projected.DefaultMode)
			case s.PodCertificate != nil:
				files, err = k.podCertificateFiles(ctx, pod, v.Name, i, s.PodCertificate, v.Projected.DefaultMode)
			}
			if err != nil {
				return err
			}
			all = append(all, files...)
		}
		return writeFiles(dir, all)
	}
	return fmt.Errorf("volume type not supported by this kubelet (supported: emptyDir, hostPath, persistentVolumeClaim of hostPath or local volumes, configMap, secret, downwardAPI, projected, image)")
}

// imageVolumes makes ready the image volumes container c mounts, as
// upstream's kubelet and containerd: each volume's image is pulled per its
// pullPolicy (events on the pod, back-off per pod and image) and its root
// filesystem mounted read-only under the pod's dir, one mount per volume
// and image (a re-pull that brings a new image mounts it beside the one
// running containers hold). It returns the host path of each by volume
// name; nil means c must not start now, with the waiting reason to show
// (ErrImagePull, ImagePullBackOff, ErrImageNeverPull, CreateContainerError)
// and the error.
func (w *podWorker) imageVolumes(ctx context.Context, pod *v1.Pod, c *v1.Container) (map[string]string, *waitReason, error) {
	k := w.k
	out := map[string]string{}
	podEvent := func(eventType, reason, format string, args ...any) {
		k.event(pod, eventType, reason, format, args...)
	}
	for _, m := range c.VolumeMounts {
		var src *v1.ImageVolumeSource
		for _, v := range pod.Spec.Volumes {
			if v.Name == m.Name {
				src = v.Image
			}
		}
		if src == nil || out[m.Name] != "" {
			continue
		}
		if src.Reference == "" {
			err := fmt.Errorf("image volume %q has no image reference", m.Name)
			k.containerEvent(pod, c.Name, v1.EventTypeWarning, EventFailed, "Error: %v", err)
			return nil, &waitReason{"CreateContainerConfigError", err.Error()}, err
		}
		key := "pull/" + string(pod.UID) + "/" + src.Reference
		id, wait, err := w.pullImage(ctx, src.Reference, pullPolicyOf(src.PullPolicy, src.Reference), key, w.waiting[c.Name], podEvent)
		if id == "" {
			if err != nil {
				k.containerEvent(pod, c.Name, v1.EventTypeWarning, EventFailed, "Error: %v", err)
			}
			return nil, wait, err
		}
		target := filepath.Join(k.podDir(pod.UID), "image-volumes", m.Name, fmt.Sprintf("%x", sha256.Sum256([]byte(id)))[:16])
		if err := k.rt.MountImage(ctx, string(pod.UID), src.Reference, target); err != nil {
			err = fmt.Errorf("mount image volume %q: %w", m.Name, err)
			k.containerEvent(pod, c.Name, v1.EventTypeWarning, EventFailed, "Error: %v", err)
			return nil, &waitReason{"CreateContainerError", err.Error()}, err
		}
		out[m.Name] = target
	}
	return out, nil, nil
}

// setUpEmptyDir makes an emptyDir volume's directory, as upstream's
// emptyDir plugin does: mode 0777 whatever the umask, on a tmpfs of
// sizeLimit for medium Memory, and with the pod's fsGroup owning it
// (setgid, so files made in it belong to the group). Only a directory it
// creates (or mounts) is set up: a later sync keeps what the pod changed.
func setUpEmptyDir(dir string, src *v1.EmptyDirVolumeSource, psc *v1.PodSecurityContext) error {
	switch src.Medium {
	case v1.StorageMediumDefault, v1.StorageMediumMemory:
	default:
		return fmt.Errorf("emptyDir medium %q is not supported by this kubelet (supported: \"\", Memory)", src.Medium)
	}
	fresh := false
	if _, err := os.Stat(dir); os.IsNotExist(err) {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
		fresh = true
	} else if err != nil {
		return err
	}
	if src.Medium == v1.StorageMediumMemory {
		mounted, err := mountTmpfs(dir, src.SizeLimit)
		if err != nil {
			return fmt.Errorf("tmpfs for emptyDir: %w", err)
		}
		fresh = fresh || mounted
	}
	if !fresh {
		return nil
	}
	mode := os.FileMode(0o777)
	if psc != nil && psc.FSGroup != nil {
		if err := os.Lchown(dir, -1, int(*psc.FSGroup)); err != nil {
			return fmt.Errorf("fsGroup %d on emptyDir: %w", *psc.FSGroup, err)
		}
		mode |= os.ModeSetgid
	}
	// Mkdir's mode is masked by the umask; chmod is not.
	return os.Chmod(dir, mode)
}

// provisionedBy is the annotation naming a volume's provisioner, and
// localPathProvisioner Waggle's built-in one (controlplane/controllers/localpath).
const (
	provisionedBy        = "pv.kubernetes.io/provisioned-by"
	localPathProvisioner = "waggle.io/local-path"
)

// setUpClaim resolves a PersistentVolumeClaim volume to its host
// directory: the claim must be bound, its volume a hostPath or local one
// (the kinds a node-local kubelet without CSI can mount). A local-path
// volume's directory is created here on first use, world-writable as
// rancher's provisioner makes it; with the pod's fsGroup it is handed to
// that group (setgid, group-writable), as the kubelet does for local
// volumes.
func (k *Kubelet) setUpClaim(ctx context.Context, pod *v1.Pod, src *v1.PersistentVolumeClaimVolumeSource) (string, error) {
	claim, err := k.client.CoreV1().PersistentVolumeClaims(pod.Namespace).Get(ctx, src.ClaimName, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("persistentvolumeclaim %q: %w", src.ClaimName, err)
	}
	if claim.Status.Phase != v1.ClaimBound || claim.Spec.VolumeName == "" {
		return "", fmt.Errorf("persistentvolumeclaim %q is not bound (phase %s)", src.ClaimName, claim.Status.Phase)
	}
	pv, err := k.client.CoreV1().PersistentVolumes().Get(ctx, claim.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("persistentvolume %q of claim %q: %w", claim.Spec.VolumeName, src.ClaimName, err)
	}
	var path string
	switch {
	case pv.Spec.HostPath != nil:
		path = pv.Spec.HostPath.Path
		if pv.Annotations[provisionedBy] == localPathProvisioner {
			if err := os.MkdirAll(path, 0o777); err != nil {
				return "", fmt.Errorf("local-path volume %s: %w", pv.Name, err)
			}
			// MkdirAll's mode is masked by the umask.
			if err := os.Chmod(path, 0o777); err != nil {
				return "", fmt.Errorf("local-path volume %s: %w", pv.Name, err)
			}
		} else if err := setUpHostPath(pv.Spec.HostPath); err != nil {
			return "", fmt.Errorf("persistentvolume %s: %w", pv.Name, err)
		}
	case pv.Spec.Local != nil:
		path = pv.Spec.Local.Path
		if st, err := os.Stat(path); err != nil || !st.IsDir() {
			return "", fmt.Errorf("local volume %s: path %s is not a directory on this node", pv.Name, path)
		}
	default:
		return "", fmt.Errorf("persistentvolume %s: only hostPath and local volumes can be mounted by this kubelet", pv.Name)
	}
	if sc := pod.Spec.SecurityContext; sc != nil && sc.FSGroup != nil && (pv.Spec.Local != nil || pv.Annotations[provisionedBy] == localPathProvisioner) {
		gid := int(*sc.FSGroup)
		if err := os.Lchown(path, -1, gid); err != nil {
			return "", fmt.Errorf("fsGroup %d on %s: %w", gid, path, err)
		}
		if err := os.Chmod(path, 0o777|os.ModeSetgid); err != nil {
			return "", fmt.Errorf("fsGroup %d on %s: %w", gid, path, err)
		}
	}
	return path, nil
}

// tokenFile asks the API, as the node, for a token of the pod's
// ServiceAccount bound to the pod (the Node authorizer and NodeRestriction
// allow exactly that), through upstream's token manager: tokens are
// cached and renewed once 80 % of their lifetime or 24 h has passed, so
// the 30 s volume refresh rotates them in time.
func (k *Kubelet) tokenFile(pod *v1.Pod, src *v1.ServiceAccountTokenProjection, defMode *int32) ([]file, error) {
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	tr := &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{
		ExpirationSeconds: src.ExpirationSeconds,
		BoundObjectRef:    &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}
	if src.Audience != "" {
		tr.Spec.Audiences = []string{src.Audience}
	}
	out, err := k.tokens.GetServiceAccountToken(pod.Namespace, sa, tr)
	if err != nil {
		return nil, fmt.Errorf("service account token of %s/%s: %w", pod.Namespace, sa, err)
	}
	mode := os.FileMode(v1.ProjectedVolumeSourceDefaultMode)
	if defMode != nil {
		mode = os.FileMode(*defMode)
	}
	return []file{{src.Path, []byte(out.Status.Token), mode}}, nil
}

// trustBundleFile writes the trust anchors of one ClusterTrustBundle (by
// name) or of all a signer's bundles that the label selector picks, as
// upstream's projected volume does, through the kubelet's own
// clustertrustbundle manager (an informer on the newest served version of
// certificates.k8s.io ClusterTrustBundles, deduplicated and sorted PEM).
// Optional sources write an empty file when nothing matches.
func (k *Kubelet) trustBundleFile(ctx context.Context, src *v1.ClusterTrustBundleProjection, defMode *int32) ([]file, error) {
	allowMissing := src.Optional != nil && *src.Optional
	var pem []byte
	var err error
	switch {
	case src.Name != nil:
		pem, err = k.trustBundles().GetTrustAnchorsByName(ctx, *src.Name, allowMissing)
	case src.SignerName != nil:
		pem, err = k.trustBundles().GetTrustAnchorsBySigner(ctx, *src.SignerName, src.LabelSelector, allowMissing)
	default:
		err = fmt.Errorf("ClusterTrustBundle projection requires either name or signerName to be set")
	}
	if err != nil {
		return nil, fmt.Errorf("clusterTrustBundle %s: %w", src.Path, err)
	}
	mode := os.FileMode(v1.ProjectedVolumeSourceDefaultMode)
	if defMode != nil {
		mode = os.FileMode(*defMode)
	}
	return []file{{src.Path, pem, mode}}, nil
}

func setUpHostPath(h *v1.HostPathVolumeSource) error {
	t := v1.HostPathUnset
	if h.Type != nil {
		t = *h.Type
	}
	st, err := os.Stat(h.Path)
	switch t {
	case v1.HostPathDirectoryOrCreate:
		if os.IsNotExist(err) {
			return os.MkdirAll(h.Path, 0o755)
		}
	case v1.HostPathFileOrCreate:
		if os.IsNotExist(err) {
			if err := os.MkdirAll(filepath.Dir(h.Path), 0o755); err != nil {
				return err
			}
			return os.WriteFile(h.Path, nil, 0o644)
		}
	case v1.HostPathDirectory:
		if err != nil || !st.IsDir() {
			return fmt.Errorf("hostPath %s is not a directory", h.Path)
		}
	case v1.HostPathFile:
		if err != nil || !st.Mode().IsRegular() {
			return fmt.Errorf("hostPath %s is not a file", h.Path)
		}
	}
	return nil
}

// makeMounts turns the container's volumeMounts into bind mounts. A
// subPathExpr is expanded with the container's env (a variable that is
// unset or empty fails, as upstream's kubelet fails it, so the container
// waits in CreateContainerConfigError until the pod is changed). A subPath
// must be relative, without "..", and resolve (symlinks included) inside
// its volume; a missing one is created as a directory, except in an image
// volume (mounted from images, by volume name: read-only, and a subPath
// must be a directory of the image, as containerd requires).
func (k *Kubelet) makeMounts(pod *v1.Pod, c *v1.Container, env []string, images map[string]string) ([]runtime.Mount, error) {
	vols := map[string]v1.Volume{}
	for _, v := range pod.Spec.Volumes {
		vols[v.Name] = v
	}
	var out []runtime.Mount
	for _, m := range c.VolumeMounts {
		v, ok := vols[m.Name]
		if !ok {
			return nil, fmt.Errorf("volumeMount %q names no volume of the pod", m.Name)
		}
		src := k.volumeDir(pod, m.Name)
		if v.HostPath != nil {
			src = v.HostPath.Path
		}
		if v.PersistentVolumeClaim != nil {
			p, ok := k.claimPaths.Load(string(pod.UID) + "/" + v.Name)
			if !ok {
				return nil, fmt.Errorf("volumeMount %q: persistentvolumeclaim %q is not set up", m.Name, v.PersistentVolumeClaim.ClaimName)
			}
			src = p.(string)
		}
		if v.Image != nil {
			p, ok := images[m.Name]
			if !ok {
				return nil, fmt.Errorf("volumeMount %q: image volume %q is not mounted", m.Name, v.Image.Reference)
			}
			src = p
		}
		subPath := m.SubPath
		if m.SubPathExpr != "" {
			var err error
			if subPath, err = expandSubPath(m.SubPathExpr, env); err != nil {
				return nil, fmt.Errorf("volumeMount %q: subPathExpr %q: %w", m.Name, m.SubPathExpr, err)
			}
		}
		if subPath != "" {
			p, err := subPathSource(src, subPath, v.Image == nil)
			if err != nil {
				return nil, fmt.Errorf("volumeMount %q: %w", m.Name, err)
			}
			src = p
		}
		ro := m.ReadOnly || (v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.ReadOnly) || v.ConfigMap != nil || v.Secret != nil || v.DownwardAPI != nil || v.Projected != nil || v.Image != nil
		out = append(out, runtime.Mount{HostPath: src, ContainerPath: m.MountPath, ReadOnly: ro})
	}
	return out, nil
}

// expandSubPath expands $(VAR) in a subPathExpr with the container's env
// ("NAME=value" entries), as upstream's kubelet does: every variable it
// names must be set and non-empty.
func expandSubPath(expr string, env []string) (string, error) {
	vars := make(map[string]string, len(env))
	for _, e := range env {
		if name, val, ok := strings.Cut(e, "="); ok {
			vars[name] = val
		}
	}
	var missing []string
	out := expansion.Expand(expr, func(name string) string {
		v := vars[name]
		if v == "" && !slices.Contains(missing, name) {
			missing = append(missing, name)
		}
		return v
	})
	if len(missing) > 0 {
		return "", fmt.Errorf("missing value for %s", strings.Join(missing, ", "))
	}
	return out, nil
}

// subPathSource is the host path of subPath inside the volume at root:
// relative, no ".." component, and resolved within root even through
// symlinks the pod's containers made in the volume (which must not lead a
// bind mount out of it). A missing directory is created when create is
// set; otherwise (a read-only image) it must exist and be a directory.
func subPathSource(root, subPath string, create bool) (string, error) {
	if filepath.IsAbs(subPath) {
		return "", fmt.Errorf("subPath %q must be a relative path", subPath)
	}
	for _, part := range strings.Split(filepath.ToSlash(subPath), "/") {
		if part == ".." {
			return "", fmt.Errorf("subPath %q must not contain '..'", subPath)
		}
	}
	p, err := securejoin.SecureJoin(root, subPath)
	if err != nil {
		return "", fmt.Errorf("subPath %q: %w", subPath, err)
	}
	if !create {
		if st, err := os.Stat(p); err != nil || !st.IsDir() {
			return "", fmt.Errorf("subPath %q: only a directory of the image can be mounted", subPath)
		}
		return p, nil
	}
	if _, err := os.Lstat(p); os.IsNotExist(err) {
		// Made with the volume's own mode (0777 for an emptyDir), as
		// upstream's kubelet makes missing subpaths.
		perm := os.FileMode(0o755)
		if st, err := os.Stat(root); err == nil {
			perm = st.Mode().Perm()
		}
		if err := os.MkdirAll(p, perm); err != nil {
			return "", fmt.Errorf("subPath %q: %w", subPath, err)
		}
		if err := os.Chmod(p, perm); err != nil {
			return "", fmt.Errorf("subPath %q: %w", subPath, err)
		}
	} else if err != nil {
		return "", fmt.Errorf("subPath %q: %w", subPath, err)
	}
	return p, nil
}
