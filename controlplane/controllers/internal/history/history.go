// Package history keeps ControllerRevisions for the StatefulSet and
// DaemonSet controllers as Kubernetes' controller history does: a revision
// holds a strategic-merge patch that replaces the owner's pod template, is
// named <owner>-<hash> (FNV-32 of the data and the collision count), carries
// the controller.kubernetes.io/hash label, and has a revision number that
// grows with each new (or re-used) template. `kubectl rollout
// history/undo` read and apply these revisions unmodified.
//
// It holds no controller logic; it only reads and writes revisions.
package history

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"sort"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrlutil"
)

// HashLabel is the label a revision's hash is written to.
const HashLabel = "controller.kubernetes.io/hash"

// TemplatePatch returns the revision data of obj (a StatefulSet or
// DaemonSet): {"spec":{"template":{...,"$patch":"replace"}}}, with keys
// sorted as encoding/json writes maps, as upstream's getPatch produces.
func TemplatePatch(obj any) ([]byte, error) {
	data, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	var raw map[string]any
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, err
	}
	spec, _ := raw["spec"].(map[string]any)
	tmpl, _ := spec["template"].(map[string]any)
	if tmpl == nil {
		return nil, fmt.Errorf("object has no spec.template")
	}
	tmpl["$patch"] = "replace"
	return json.Marshal(map[string]any{"spec": map[string]any{"template": tmpl}})
}

// Hash is upstream's HashControllerRevision: FNV-32 over the data and the
// collision count, safe-encoded.
func Hash(data []byte, collisionCount *int32) string {
	h := fnv.New32()
	h.Write(data)
	if collisionCount != nil {
		h.Write([]byte(strconv.FormatInt(int64(*collisionCount), 10)))
	}
	return rand.SafeEncodeString(fmt.Sprint(h.Sum32()))
}

// Name is <prefix>-<hash>, the prefix cut so the name stays a valid label
// value.
func Name(prefix, hash string) string {
	if len(prefix) > 223 {
		prefix = prefix[:223]
	}
	return prefix + "-" + hash
}

// New returns a revision of owner (apiVersion/kind) holding data.
func New(owner metav1.Object, apiVersion, kind string, templateLabels map[string]string, data []byte, revision int64, collisionCount *int32) *appsv1.ControllerRevision {
	labels := map[string]string{}
	for k, v := range templateLabels {
		labels[k] = v
	}
	hash := Hash(data, collisionCount)
	labels[HashLabel] = hash
	return &appsv1.ControllerRevision{
		ObjectMeta: metav1.ObjectMeta{
			Name: Name(owner.GetName(), hash), Namespace: owner.GetNamespace(), Labels: labels,
			OwnerReferences: []metav1.OwnerReference{ctrlutil.NewControllerRef(owner, apiVersion, kind)},
		},
		Data:     runtime.RawExtension{Raw: data},
		Revision: revision,
	}
}

// Sort orders revisions by revision number, then creation, then name.
func Sort(revs []*appsv1.ControllerRevision) {
	sort.SliceStable(revs, func(i, j int) bool {
		a, b := revs[i], revs[j]
		if a.Revision != b.Revision {
			return a.Revision < b.Revision
		}
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Name < b.Name
	})
}

// Equal reports whether two revisions hold the same template.
func Equal(a, b *appsv1.ControllerRevision) bool {
	if bytes.Equal(a.Data.Raw, b.Data.Raw) {
		return true
	}
	var x, y any
	if json.Unmarshal(a.Data.Raw, &x) != nil || json.Unmarshal(b.Data.Raw, &y) != nil {
		return false
	}
	return apiequality.Semantic.DeepEqual(x, y)
}

// NextRevision is one more than the highest revision number.
func NextRevision(revs []*appsv1.ControllerRevision) int64 {
	var n int64
	for _, r := range revs {
		n = max(n, r.Revision)
	}
	return n + 1
}

// Create writes rev, and on a name collision with a different template
// bumps *collisionCount and tries the next name; a revision of the same
// name and data is returned as it is.
func Create(ctx context.Context, client kubernetes.Interface, owner metav1.Object, apiVersion, kind string, templateLabels map[string]string, data []byte, revision int64, collisionCount *int32) (*appsv1.ControllerRevision, error) {
	for range 100 {
		rev := New(owner, apiVersion, kind, templateLabels, data, revision, collisionCount)
		created, err := client.AppsV1().ControllerRevisions(owner.GetNamespace()).Create(ctx, rev, metav1.CreateOptions{})
		if err == nil {
			return created, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create controllerrevision %s: %w", rev.Name, err)
		}
		existing, gerr := client.AppsV1().ControllerRevisions(owner.GetNamespace()).Get(ctx, rev.Name, metav1.GetOptions{})
		if gerr != nil {
			return nil, gerr
		}
		if ref := metav1.GetControllerOf(existing); ref != nil && ref.UID == owner.GetUID() && Equal(existing, rev) {
			return existing, nil
		}
		*collisionCount++
	}
	return nil, fmt.Errorf("controllerrevision of %s: too many hash collisions", owner.GetName())
}

// Bump gives an existing revision a new revision number (its template came
// back).
func Bump(ctx context.Context, client kubernetes.Interface, rev *appsv1.ControllerRevision, revision int64) (*appsv1.ControllerRevision, error) {
	if rev.Revision == revision {
		return rev, nil
	}
	cp := rev.DeepCopy()
	cp.Revision = revision
	out, err := client.AppsV1().ControllerRevisions(cp.Namespace).Update(ctx, cp, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("update controllerrevision %s: %w", cp.Name, err)
	}
	return out, nil
}

// Truncate deletes the oldest revisions that are not live beyond limit.
func Truncate(ctx context.Context, client kubernetes.Interface, revs []*appsv1.ControllerRevision, live map[string]bool, limit int) error {
	var old []*appsv1.ControllerRevision
	for _, r := range revs {
		if !live[r.Name] {
			old = append(old, r)
		}
	}
	Sort(old)
	for i := 0; i < len(old)-limit; i++ {
		err := client.AppsV1().ControllerRevisions(old[i].Namespace).Delete(ctx, old[i].Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete controllerrevision %s: %w", old[i].Name, err)
		}
	}
	return nil
}
