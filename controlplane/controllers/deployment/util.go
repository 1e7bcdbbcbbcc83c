package deployment

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/waggle-io/waggle/controlplane/controllers/internal/ctrlutil"
)

// The annotations and label Kubernetes' deployment controller and kubectl
// share; `kubectl rollout history/undo` read them.
const (
	RevisionAnnotation        = "deployment.kubernetes.io/revision"
	RevisionHistoryAnnotation = "deployment.kubernetes.io/revision-history"
	DesiredReplicasAnnotation = "deployment.kubernetes.io/desired-replicas"
	MaxReplicasAnnotation     = "deployment.kubernetes.io/max-replicas"
	PodTemplateHashLabel      = appsv1.DefaultDeploymentUniqueLabelKey // pod-template-hash

	// Progressing condition reasons, as kubectl expects them.
	NewReplicaSetReason      = "NewReplicaSetCreated"
	FoundNewRSReason         = "FoundNewReplicaSet"
	FailedRSCreateReason     = "ReplicaSetCreateError"
	ReplicaSetUpdatedReason  = "ReplicaSetUpdated"
	NewRSAvailableReason     = "NewReplicaSetAvailable"
	TimedOutReason           = "ProgressDeadlineExceeded"
	PausedDeployReason       = "DeploymentPaused"
	ResumedDeployReason      = "DeploymentResumed"
	MinimumReplicasAvailable = "MinimumReplicasAvailable"
	MinimumReplicasUnavail   = "MinimumReplicasUnavailable"

	maxRevHistoryLengthInChars = 2000
	defaultProgressDeadline    = 600
	defaultRevisionHistory     = 10
)

// ComputeHash returns the pod-template-hash of a template, exactly as
// Kubernetes computes it, so Waggle's ReplicaSet names match a Kubernetes
// cluster's.
func ComputeHash(template *corev1.PodTemplateSpec, collisionCount *int32) string {
	return ctrlutil.ComputeHash(template, collisionCount)
}

// EqualIgnoreHash compares two templates ignoring the pod-template-hash label.
func EqualIgnoreHash(a, b *corev1.PodTemplateSpec) bool {
	a, b = a.DeepCopy(), b.DeepCopy()
	delete(a.Labels, PodTemplateHashLabel)
	delete(b.Labels, PodTemplateHashLabel)
	if len(a.Labels) == 0 {
		a.Labels = nil
	}
	if len(b.Labels) == 0 {
		b.Labels = nil
	}
	return apiequality.Semantic.DeepEqual(a, b)
}

func replicas(r *int32) int32 {
	if r == nil {
		return 1
	}
	return *r
}

func rsReplicas(rs *appsv1.ReplicaSet) int32 {
	if rs.Spec.Replicas == nil {
		return 1
	}
	return *rs.Spec.Replicas
}

func isRolling(d *appsv1.Deployment) bool {
	return d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType
}

// ResolveFenceposts turns maxSurge and maxUnavailable (25% each when unset,
// as the API defaults them) into pod counts for desired replicas; both zero
// becomes maxUnavailable 1, as Kubernetes does.
func ResolveFenceposts(maxSurge, maxUnavailable *intstr.IntOrString, desired int32) (int32, int32, error) {
	def := intstr.FromString("25%")
	if maxSurge == nil {
		maxSurge = &def
	}
	if maxUnavailable == nil {
		maxUnavailable = &def
	}
	surge, err := intstr.GetScaledValueFromIntOrPercent(maxSurge, int(desired), true)
	if err != nil {
		return 0, 0, fmt.Errorf("maxSurge: %w", err)
	}
	unavailable, err := intstr.GetScaledValueFromIntOrPercent(maxUnavailable, int(desired), false)
	if err != nil {
		return 0, 0, fmt.Errorf("maxUnavailable: %w", err)
	}
	if surge == 0 && unavailable == 0 {
		unavailable = 1
	}
	return int32(surge), int32(unavailable), nil
}

func rollingParams(d *appsv1.Deployment) (surge, unavail *intstr.IntOrString) {
	if ru := d.Spec.Strategy.RollingUpdate; ru != nil {
		return ru.MaxSurge, ru.MaxUnavailable
	}
	return nil, nil
}

// MaxSurge returns how many pods above spec.replicas a rolling update may run.
func MaxSurge(d *appsv1.Deployment) int32 {
	if !isRolling(d) {
		return 0
	}
	s, u := rollingParams(d)
	surge, _, _ := ResolveFenceposts(s, u, replicas(d.Spec.Replicas))
	return surge
}

// MaxUnavailable returns how many pods below spec.replicas a rolling update
// may leave unavailable.
func MaxUnavailable(d *appsv1.Deployment) int32 {
	r := replicas(d.Spec.Replicas)
	if !isRolling(d) || r == 0 {
		return 0
	}
	s, u := rollingParams(d)
	_, unavailable, _ := ResolveFenceposts(s, u, r)
	return min(unavailable, r)
}

// Revision returns the revision annotation of an object (0 if none).
func Revision(obj metav1.Object) int64 {
	v, err := strconv.ParseInt(obj.GetAnnotations()[RevisionAnnotation], 10, 64)
	if err != nil {
		return 0
	}
	return v
}

// MaxRevision returns the highest revision among rss.
func MaxRevision(rss []*appsv1.ReplicaSet) int64 {
	var m int64
	for _, rs := range rss {
		m = max(m, Revision(rs))
	}
	return m
}

func skipCopyAnnotation(k string) bool {
	switch k {
	case corev1.LastAppliedConfigAnnotation, RevisionAnnotation, RevisionHistoryAnnotation,
		DesiredReplicasAnnotation, MaxReplicasAnnotation, "deprecated.deployment.rollback.to":
		return true
	}
	return false
}

func copyDeploymentAnnotations(d *appsv1.Deployment, rs *appsv1.ReplicaSet) bool {
	changed := false
	if rs.Annotations == nil {
		rs.Annotations = map[string]string{}
	}
	for k, v := range d.Annotations {
		if skipCopyAnnotation(k) || rs.Annotations[k] == v {
			continue
		}
		rs.Annotations[k] = v
		changed = true
	}
	return changed
}

// SetNewReplicaSetAnnotations sets the new ReplicaSet's revision (keeping the
// revisions it had before in revision-history, which is how a rollback to an
// old template shows in `kubectl rollout history`) and, for a ReplicaSet
// being created, its desired/max replicas.
func SetNewReplicaSetAnnotations(d *appsv1.Deployment, rs *appsv1.ReplicaSet, newRevision string, exists bool) bool {
	changed := copyDeploymentAnnotations(d, rs)
	oldRevision, had := rs.Annotations[RevisionAnnotation]
	oldInt, err := strconv.ParseInt(oldRevision, 10, 64)
	if err != nil {
		if oldRevision != "" {
			return false
		}
		oldInt = 0
	}
	newInt, err := strconv.ParseInt(newRevision, 10, 64)
	if err != nil {
		return false
	}
	if oldInt < newInt {
		rs.Annotations[RevisionAnnotation] = newRevision
		changed = true
	}
	if had && oldInt < newInt {
		hist := rs.Annotations[RevisionHistoryAnnotation]
		old := strings.Split(hist, ",")
		if len(old[0]) == 0 {
			rs.Annotations[RevisionHistoryAnnotation] = oldRevision
		} else {
			total := len(hist) + len(oldRevision) + 1
			start := 0
			for total > maxRevHistoryLengthInChars && start < len(old) {
				total -= len(old[start]) + 1
				start++
			}
			if total <= maxRevHistoryLengthInChars {
				rs.Annotations[RevisionHistoryAnnotation] = strings.Join(append(old[start:], oldRevision), ",")
			}
		}
	}
	if !exists && SetReplicasAnnotations(rs, replicas(d.Spec.Replicas), replicas(d.Spec.Replicas)+MaxSurge(d)) {
		changed = true
	}
	return changed
}

// SetReplicasAnnotations records desired and max replicas on rs.
func SetReplicasAnnotations(rs *appsv1.ReplicaSet, desired, maxReplicas int32) bool {
	if rs.Annotations == nil {
		rs.Annotations = map[string]string{}
	}
	d, m := strconv.Itoa(int(desired)), strconv.Itoa(int(maxReplicas))
	changed := rs.Annotations[DesiredReplicasAnnotation] != d || rs.Annotations[MaxReplicasAnnotation] != m
	rs.Annotations[DesiredReplicasAnnotation] = d
	rs.Annotations[MaxReplicasAnnotation] = m
	return changed
}

func intAnnotation(rs *appsv1.ReplicaSet, key string) (int32, bool) {
	v, ok := rs.Annotations[key]
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil {
		return 0, false
	}
	return int32(n), true
}

// FilterActive returns the ReplicaSets with replicas > 0.
func FilterActive(rss []*appsv1.ReplicaSet) []*appsv1.ReplicaSet {
	var out []*appsv1.ReplicaSet
	for _, rs := range rss {
		if rs != nil && rsReplicas(rs) > 0 {
			out = append(out, rs)
		}
	}
	return out
}

func sumSpec(rss []*appsv1.ReplicaSet) int32 {
	var n int32
	for _, rs := range rss {
		if rs != nil {
			n += rsReplicas(rs)
		}
	}
	return n
}

func sumStatus(rss []*appsv1.ReplicaSet, f func(*appsv1.ReplicaSetStatus) int32) int32 {
	var n int32
	for _, rs := range rss {
		if rs != nil {
			n += f(&rs.Status)
		}
	}
	return n
}

func statusReplicas(s *appsv1.ReplicaSetStatus) int32  { return s.Replicas }
func statusReady(s *appsv1.ReplicaSetStatus) int32     { return s.ReadyReplicas }
func statusAvailable(s *appsv1.ReplicaSetStatus) int32 { return s.AvailableReplicas }

func olderFirst(a, b *appsv1.ReplicaSet) bool {
	if a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.Name < b.Name
	}
	return a.CreationTimestamp.Before(&b.CreationTimestamp)
}

// sortByCreation sorts oldest first.
func sortByCreation(rss []*appsv1.ReplicaSet) {
	sort.SliceStable(rss, func(i, j int) bool { return olderFirst(rss[i], rss[j]) })
}

// sortBySize sorts largest first, ties broken by age (newer first when
// newerFirst, as for scaling up; older first for scaling down).
func sortBySize(rss []*appsv1.ReplicaSet, newerFirst bool) {
	sort.SliceStable(rss, func(i, j int) bool {
		if rsReplicas(rss[i]) != rsReplicas(rss[j]) {
			return rsReplicas(rss[i]) > rsReplicas(rss[j])
		}
		if newerFirst {
			return olderFirst(rss[j], rss[i])
		}
		return olderFirst(rss[i], rss[j])
	})
}

func sortByRevision(rss []*appsv1.ReplicaSet) {
	sort.SliceStable(rss, func(i, j int) bool {
		ri, rj := Revision(rss[i]), Revision(rss[j])
		if ri == rj {
			return olderFirst(rss[i], rss[j])
		}
		return ri < rj
	})
}

// FindNewReplicaSet returns the oldest ReplicaSet whose template equals the
// deployment's (ignoring the hash label).
func FindNewReplicaSet(d *appsv1.Deployment, rss []*appsv1.ReplicaSet) *appsv1.ReplicaSet {
	s := append([]*appsv1.ReplicaSet(nil), rss...)
	sortByCreation(s)
	for _, rs := range s {
		if EqualIgnoreHash(&rs.Spec.Template, &d.Spec.Template) {
			return rs
		}
	}
	return nil
}

// FindOldReplicaSets returns every ReplicaSet but the new one.
func FindOldReplicaSets(d *appsv1.Deployment, rss []*appsv1.ReplicaSet) []*appsv1.ReplicaSet {
	newRS := FindNewReplicaSet(d, rss)
	var old []*appsv1.ReplicaSet
	for _, rs := range rss {
		if newRS != nil && rs.UID == newRS.UID {
			continue
		}
		old = append(old, rs)
	}
	return old
}

// NewRSNewReplicas returns the replicas the new ReplicaSet may have now:
// for a rolling update, as many as maxSurge allows on top of all pods.
func NewRSNewReplicas(d *appsv1.Deployment, all []*appsv1.ReplicaSet, newRS *appsv1.ReplicaSet) int32 {
	want := replicas(d.Spec.Replicas)
	if !isRolling(d) {
		return want
	}
	current := sumSpec(all)
	maxTotal := want + MaxSurge(d)
	if current >= maxTotal {
		return rsReplicas(newRS)
	}
	up := min(maxTotal-current, want-rsReplicas(newRS))
	return rsReplicas(newRS) + up
}

// IsSaturated reports whether rs alone runs the deployment's full size.
func IsSaturated(d *appsv1.Deployment, rs *appsv1.ReplicaSet) bool {
	if rs == nil {
		return false
	}
	desired, ok := intAnnotation(rs, DesiredReplicasAnnotation)
	want := replicas(d.Spec.Replicas)
	return ok && rsReplicas(rs) == want && desired == want && rs.Status.AvailableReplicas == want
}

// FindActiveOrLatest returns the only active ReplicaSet, or the latest when
// none is active, or nil when several are.
func FindActiveOrLatest(newRS *appsv1.ReplicaSet, old []*appsv1.ReplicaSet) *appsv1.ReplicaSet {
	if newRS == nil && len(old) == 0 {
		return nil
	}
	o := append([]*appsv1.ReplicaSet(nil), old...)
	sort.SliceStable(o, func(i, j int) bool { return olderFirst(o[j], o[i]) })
	active := FilterActive(append(o, newRS))
	switch len(active) {
	case 0:
		if newRS != nil {
			return newRS
		}
		return o[0]
	case 1:
		return active[0]
	}
	return nil
}

// proportion is Kubernetes' GetProportion: rs's share of a proportional
// scale of toAdd replicas, of which added are already handed out.
func proportion(rs *appsv1.ReplicaSet, d *appsv1.Deployment, toAdd, added int32) int32 {
	if rs == nil || rsReplicas(rs) == 0 || toAdd == 0 || toAdd == added {
		return 0
	}
	frac := fraction(rs, d)
	allowed := toAdd - added
	if toAdd > 0 {
		return min(frac, allowed)
	}
	return max(frac, allowed)
}

func fraction(rs *appsv1.ReplicaSet, d *appsv1.Deployment) int32 {
	if replicas(d.Spec.Replicas) == 0 {
		return -rsReplicas(rs)
	}
	total := replicas(d.Spec.Replicas) + MaxSurge(d)
	annotated, ok := intAnnotation(rs, MaxReplicasAnnotation)
	if !ok || annotated == 0 {
		annotated = d.Status.Replicas
	}
	if annotated == 0 {
		return 0
	}
	size := float64(rsReplicas(rs)*total) / float64(annotated)
	return int32(math.Round(size)) - rsReplicas(rs)
}

// Conditions.

// GetCondition returns the condition of type t, or nil.
func GetCondition(s appsv1.DeploymentStatus, t appsv1.DeploymentConditionType) *appsv1.DeploymentCondition {
	for i := range s.Conditions {
		if s.Conditions[i].Type == t {
			return &s.Conditions[i]
		}
	}
	return nil
}

func newCondition(t appsv1.DeploymentConditionType, st corev1.ConditionStatus, reason, msg string, now time.Time) appsv1.DeploymentCondition {
	n := metav1.NewTime(now)
	return appsv1.DeploymentCondition{Type: t, Status: st, Reason: reason, Message: msg, LastUpdateTime: n, LastTransitionTime: n}
}

// SetCondition sets c, keeping lastTransitionTime when the status does not
// change and doing nothing when status and reason are unchanged.
func SetCondition(s *appsv1.DeploymentStatus, c appsv1.DeploymentCondition) {
	cur := GetCondition(*s, c.Type)
	if cur != nil && cur.Status == c.Status && cur.Reason == c.Reason {
		return
	}
	if cur != nil && cur.Status == c.Status {
		c.LastTransitionTime = cur.LastTransitionTime
	}
	RemoveCondition(s, c.Type)
	s.Conditions = append(s.Conditions, c)
}

// RemoveCondition drops the condition of type t.
func RemoveCondition(s *appsv1.DeploymentStatus, t appsv1.DeploymentConditionType) {
	var out []appsv1.DeploymentCondition
	for _, c := range s.Conditions {
		if c.Type != t {
			out = append(out, c)
		}
	}
	s.Conditions = out
}

func progressDeadline(d *appsv1.Deployment) (time.Duration, bool) {
	p := int32(defaultProgressDeadline)
	if d.Spec.ProgressDeadlineSeconds != nil {
		p = *d.Spec.ProgressDeadlineSeconds
	}
	if p == math.MaxInt32 {
		return 0, false
	}
	return time.Duration(p) * time.Second, true
}

// DeploymentComplete reports whether every replica is updated and available.
func DeploymentComplete(d *appsv1.Deployment, s *appsv1.DeploymentStatus) bool {
	r := replicas(d.Spec.Replicas)
	return s.UpdatedReplicas == r && s.Replicas == r && s.AvailableReplicas == r && s.ObservedGeneration >= d.Generation
}

// DeploymentProgressing reports whether s moved forward from d.Status.
func DeploymentProgressing(d *appsv1.Deployment, s *appsv1.DeploymentStatus) bool {
	o := d.Status
	return s.UpdatedReplicas > o.UpdatedReplicas || (s.Replicas-s.UpdatedReplicas) < (o.Replicas-o.UpdatedReplicas) ||
		s.ReadyReplicas > o.ReadyReplicas || s.AvailableReplicas > o.AvailableReplicas
}

// DeploymentTimedOut reports whether the rollout has made no progress for
// progressDeadlineSeconds.
func DeploymentTimedOut(d *appsv1.Deployment, s *appsv1.DeploymentStatus, now time.Time) bool {
	deadline, ok := progressDeadline(d)
	if !ok {
		return false
	}
	c := GetCondition(*s, appsv1.DeploymentProgressing)
	if c == nil || c.Reason == NewRSAvailableReason {
		return false
	}
	if c.Reason == TimedOutReason {
		return true
	}
	return c.LastUpdateTime.Add(deadline).Before(now)
}
