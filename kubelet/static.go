package kubelet

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// staticSource reads static pods from the manifest dir and keeps a mirror
// pod of each in the API. Deleting a mirror pod does not stop its static
// pod: the mirror is made again. A mirror pod on this node whose static pod
// is gone (its manifest removed while the kubelet was down, say) is deleted,
// as upstream's pod cleanup deletes orphaned mirror pods.
type staticSource struct {
	k    *Kubelet
	mu   sync.Mutex
	pods map[types.UID]*v1.Pod // by static UID
	// mirrors lists the mirror pods bound to this node (from the pod informer).
	mirrors func() []*v1.Pod
}

func newStaticSource(k *Kubelet, mirrors func() []*v1.Pod) *staticSource {
	return &staticSource{k: k, pods: map[types.UID]*v1.Pod{}, mirrors: mirrors}
}

// DecodeManifest decodes one static pod manifest (YAML or JSON) and gives
// it the name, namespace, UID and annotations Kubernetes gives static pods.
func DecodeManifest(data []byte, nodeName, source string) (*v1.Pod, error) {
	var pod v1.Pod
	if err := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096).Decode(&pod); err != nil {
		return nil, fmt.Errorf("decode manifest: %w", err)
	}
	if pod.Kind != "" && pod.Kind != "Pod" {
		return nil, fmt.Errorf("manifest kind is %q, want Pod", pod.Kind)
	}
	if pod.Name == "" {
		return nil, fmt.Errorf("manifest has no metadata.name")
	}
	if len(pod.Spec.Containers) == 0 {
		return nil, fmt.Errorf("pod %s has no containers", pod.Name)
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == "" || c.Image == "" {
			return nil, fmt.Errorf("pod %s: every container needs a name and an image", pod.Name)
		}
	}
	if pod.Namespace == "" {
		pod.Namespace = metav1.NamespaceDefault
	}
	pod.Name = pod.Name + "-" + nodeName
	sum := sha256.Sum256(append(append(append([]byte{}, data...), nodeName...), source...))
	hash := hex.EncodeToString(sum[:16])
	pod.UID = types.UID(hash)
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[AnnotationConfigHash] = hash
	pod.Annotations[AnnotationConfigSource] = "file"
	pod.Spec.NodeName = nodeName
	if pod.Spec.RestartPolicy == "" {
		pod.Spec.RestartPolicy = v1.RestartPolicyAlways
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		if c.TerminationMessagePath == "" {
			c.TerminationMessagePath = v1.TerminationMessagePathDefault
		}
	}
	return &pod, nil
}

func (s *staticSource) run(ctx context.Context) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.scan(ctx)
		}
	}
}

// scan reads the manifest dir, starts new static pods, stops removed or
// changed ones, and makes missing mirrors.
func (s *staticSource) scan(ctx context.Context) {
	k := s.k
	dir := k.cfg.PodManifestPath
	ents, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		k.log.Warn("read pod manifest dir", "dir", dir, "err", err)
		return
	}
	seen := map[types.UID]*v1.Pod{}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		if !e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	for _, n := range names {
		p := filepath.Join(dir, n)
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		pod, err := DecodeManifest(data, k.cfg.NodeName, p)
		if err != nil {
			k.log.Warn("bad static pod manifest; ignored", "file", p, "err", err)
			continue
		}
		seen[pod.UID] = pod
	}
	s.mu.Lock()
	var added, removed []*v1.Pod
	for uid, p := range seen {
		if _, ok := s.pods[uid]; !ok {
			added = append(added, p)
		}
	}
	for uid, p := range s.pods {
		if _, ok := seen[uid]; !ok {
			removed = append(removed, p)
		}
	}
	s.pods = seen
	s.mu.Unlock()
	for _, p := range added {
		k.log.Info("static pod", "pod", p.Namespace+"/"+p.Name)
		k.upsertWorker(p, true)
	}
	for _, p := range removed {
		k.mu.Lock()
		w := k.workers[p.UID]
		k.mu.Unlock()
		if w != nil {
			w.markGone()
		}
		s.deleteMirror(ctx, p)
	}
	for _, p := range seen {
		s.ensureMirror(ctx, p)
	}
	for _, m := range s.mirrors() {
		if m.DeletionTimestamp == nil && s.orphaned(m) {
			s.deleteOrphan(ctx, m)
		}
	}
}

// orphaned tells whether a mirror pod has no static pod of its name.
func (s *staticSource) orphaned(m *v1.Pod) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.pods {
		if p.Namespace == m.Namespace && p.Name == m.Name {
			return false
		}
	}
	return true
}

// deleteOrphan deletes a mirror pod whose static pod is gone; the UID
// precondition spares a mirror made again meanwhile.
func (s *staticSource) deleteOrphan(ctx context.Context, m *v1.Pod) {
	s.k.log.Info("deleting orphaned mirror pod", "pod", m.Namespace+"/"+m.Name)
	err := s.k.client.CoreV1().Pods(m.Namespace).Delete(ctx, m.Name, metav1.DeleteOptions{
		GracePeriodSeconds: new(int64), Preconditions: metav1.NewUIDPreconditions(string(m.UID))})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		s.k.log.Warn("delete orphaned mirror pod", "pod", m.Namespace+"/"+m.Name, "err", err)
	}
}

// mirrorFor returns the mirror pod of a static pod.
func (s *staticSource) mirrorFor(p *v1.Pod) *v1.Pod {
	m := &v1.Pod{ObjectMeta: *p.ObjectMeta.DeepCopy(), Spec: *p.Spec.DeepCopy()}
	m.UID = ""
	m.ResourceVersion = ""
	m.Annotations[AnnotationConfigMirror] = p.Annotations[AnnotationConfigHash]
	if n := s.k.node(); n != nil {
		m.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: n.Name, UID: n.UID, Controller: ptrTrue()}}
	}
	return m
}

func ptrTrue() *bool { b := true; return &b }

func (s *staticSource) ensureMirror(ctx context.Context, p *v1.Pod) {
	pods := s.k.client.CoreV1().Pods(p.Namespace)
	cur, err := pods.Get(ctx, p.Name, metav1.GetOptions{})
	if err == nil {
		if cur.Annotations[AnnotationConfigMirror] == p.Annotations[AnnotationConfigHash] && cur.DeletionTimestamp == nil {
			return
		}
		if cur.DeletionTimestamp == nil {
			// An outdated mirror (or a pod squatting the name): replace.
			pods.Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64), Preconditions: metav1.NewUIDPreconditions(string(cur.UID))})
		}
		return
	}
	// The Node authorizer refuses a get of a pod not (yet) bound to this
	// node, so a missing mirror reads as 403, not 404.
	if !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err) {
		return
	}
	if _, err := pods.Create(ctx, s.mirrorFor(p), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		s.k.log.Warn("create mirror pod", "pod", p.Name, "err", err)
		return
	}
	// A new mirror needs the status again.
	s.k.mu.Lock()
	w := s.k.workers[p.UID]
	s.k.mu.Unlock()
	if w != nil {
		w.mu.Lock()
		w.mu.Unlock()
		w.resetStatus()
	}
}

func (s *staticSource) deleteMirror(ctx context.Context, p *v1.Pod) {
	err := s.k.client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	if err != nil && !apierrors.IsNotFound(err) {
		s.k.log.Warn("delete mirror pod", "pod", p.Name, "err", err)
	}
}

// mirrorSeen is told of every mirror pod event; a mirror being deleted is
// finished off so it can be made again, and one without a static pod is
// deleted.
func (s *staticSource) mirrorSeen(m *v1.Pod) {
	if m.DeletionTimestamp == nil && s.orphaned(m) && s.k.ctx != nil {
		go s.deleteOrphan(s.k.ctx, m)
		return
	}
	if m.DeletionTimestamp != nil {
		s.k.client.CoreV1().Pods(m.Namespace).Delete(context.Background(), m.Name, metav1.DeleteOptions{
			GracePeriodSeconds: new(int64), Preconditions: metav1.NewUIDPreconditions(string(m.UID))})
	}
}

// mirrorGone makes the mirror of a still-present static pod again.
func (s *staticSource) mirrorGone(m *v1.Pod) {
	s.mu.Lock()
	var p *v1.Pod
	for _, sp := range s.pods {
		if sp.Namespace == m.Namespace && sp.Name == m.Name {
			p = sp
		}
	}
	s.mu.Unlock()
	if p != nil && s.k.ctx != nil {
		go s.ensureMirror(s.k.ctx, p)
	}
}
