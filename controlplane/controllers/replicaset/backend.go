package replicaset

import (
	"context"
	"log/slog"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
)

// RCName is the ReplicationController controller's name (queue and metrics
// label, --controllers), as kube-controller-manager's "replicationcontroller".
const RCName = "replicationcontroller"

// backend is the owner kind the controller manages: ReplicaSets, or
// ReplicationControllers seen as ReplicaSets (an equality selector is a
// matchLabels selector), as Kubernetes runs its ReplicationManager on the
// ReplicaSet controller's code.
type backend interface {
	name() string
	component() string
	kind() string
	apiVersion() string
	get(ns, name string) (*appsv1.ReplicaSet, error)
	list(ns string) ([]*appsv1.ReplicaSet, error)
	getLive(ctx context.Context, ns, name string) (metav1.Object, error)
	updateStatus(ctx context.Context, rs *appsv1.ReplicaSet) error
	// eventObject is what Events about rs refer to.
	eventObject(rs *appsv1.ReplicaSet) runtime.Object
}

type rsBackend struct {
	client kubernetes.Interface
	lister appslisters.ReplicaSetLister
}

func (rsBackend) name() string       { return Name }
func (rsBackend) component() string  { return "replicaset-controller" }
func (rsBackend) kind() string       { return "ReplicaSet" }
func (rsBackend) apiVersion() string { return "apps/v1" }
func (b rsBackend) get(ns, name string) (*appsv1.ReplicaSet, error) {
	return b.lister.ReplicaSets(ns).Get(name)
}
func (b rsBackend) list(ns string) ([]*appsv1.ReplicaSet, error) {
	return b.lister.ReplicaSets(ns).List(labels.Everything())
}
func (b rsBackend) getLive(ctx context.Context, ns, name string) (metav1.Object, error) {
	return b.client.AppsV1().ReplicaSets(ns).Get(ctx, name, metav1.GetOptions{})
}
func (b rsBackend) updateStatus(ctx context.Context, rs *appsv1.ReplicaSet) error {
	_, err := b.client.AppsV1().ReplicaSets(rs.Namespace).UpdateStatus(ctx, rs, metav1.UpdateOptions{})
	return err
}
func (rsBackend) eventObject(rs *appsv1.ReplicaSet) runtime.Object { return rs }

// NewReplicationController returns the ReplicationController controller:
// the ReplicaSet controller's logic (slow-start creation, expectations,
// adoption and release, victim ranking, status) over core/v1
// ReplicationControllers.
func NewReplicationController(client kubernetes.Interface, factory informers.SharedInformerFactory, log *slog.Logger, opts Options) *Controller {
	inf := factory.Core().V1().ReplicationControllers()
	return newController(client, factory, log, opts, rcBackend{client: client, lister: inf.Lister()}, inf.Informer())
}

type rcBackend struct {
	client kubernetes.Interface
	lister corelisters.ReplicationControllerLister
}

func (rcBackend) name() string       { return RCName }
func (rcBackend) component() string  { return "replication-controller" }
func (rcBackend) kind() string       { return "ReplicationController" }
func (rcBackend) apiVersion() string { return "v1" }
func (b rcBackend) get(ns, name string) (*appsv1.ReplicaSet, error) {
	rc, err := b.lister.ReplicationControllers(ns).Get(name)
	if err != nil {
		return nil, err
	}
	return rcToRS(rc), nil
}
func (b rcBackend) list(ns string) ([]*appsv1.ReplicaSet, error) {
	l, err := b.lister.ReplicationControllers(ns).List(labels.Everything())
	out := make([]*appsv1.ReplicaSet, 0, len(l))
	for _, rc := range l {
		out = append(out, rcToRS(rc))
	}
	return out, err
}
func (b rcBackend) getLive(ctx context.Context, ns, name string) (metav1.Object, error) {
	return b.client.CoreV1().ReplicationControllers(ns).Get(ctx, name, metav1.GetOptions{})
}
func (b rcBackend) updateStatus(ctx context.Context, rs *appsv1.ReplicaSet) error {
	rc, err := b.lister.ReplicationControllers(rs.Namespace).Get(rs.Name)
	if err != nil {
		return err
	}
	rc = rc.DeepCopy()
	rc.ResourceVersion = rs.ResourceVersion
	rc.Status = corev1.ReplicationControllerStatus{
		Replicas: rs.Status.Replicas, FullyLabeledReplicas: rs.Status.FullyLabeledReplicas,
		ReadyReplicas: rs.Status.ReadyReplicas, AvailableReplicas: rs.Status.AvailableReplicas,
		ObservedGeneration: rs.Status.ObservedGeneration,
	}
	for _, c := range rs.Status.Conditions {
		rc.Status.Conditions = append(rc.Status.Conditions, corev1.ReplicationControllerCondition{
			Type: corev1.ReplicationControllerConditionType(c.Type), Status: c.Status,
			LastTransitionTime: c.LastTransitionTime, Reason: c.Reason, Message: c.Message})
	}
	_, err = b.client.CoreV1().ReplicationControllers(rc.Namespace).UpdateStatus(ctx, rc, metav1.UpdateOptions{})
	return err
}
func (rcBackend) eventObject(rs *appsv1.ReplicaSet) runtime.Object {
	return &corev1.ReplicationController{ObjectMeta: rs.ObjectMeta}
}

// rcToRS is the ReplicaSet a ReplicationController is equivalent to.
func rcToRS(rc *corev1.ReplicationController) *appsv1.ReplicaSet {
	rs := &appsv1.ReplicaSet{ObjectMeta: *rc.ObjectMeta.DeepCopy()}
	rs.Spec.Replicas = rc.Spec.Replicas
	rs.Spec.MinReadySeconds = rc.Spec.MinReadySeconds
	rs.Spec.Selector = &metav1.LabelSelector{MatchLabels: rc.Spec.Selector}
	if rc.Spec.Template != nil {
		rs.Spec.Template = *rc.Spec.Template.DeepCopy()
		if len(rc.Spec.Selector) == 0 { // the API server's default
			rs.Spec.Selector.MatchLabels = rc.Spec.Template.Labels
		}
	}
	rs.Status = appsv1.ReplicaSetStatus{
		Replicas: rc.Status.Replicas, FullyLabeledReplicas: rc.Status.FullyLabeledReplicas,
		ReadyReplicas: rc.Status.ReadyReplicas, AvailableReplicas: rc.Status.AvailableReplicas,
		ObservedGeneration: rc.Status.ObservedGeneration,
	}
	for _, c := range rc.Status.Conditions {
		rs.Status.Conditions = append(rs.Status.Conditions, appsv1.ReplicaSetCondition{
			Type: appsv1.ReplicaSetConditionType(c.Type), Status: c.Status,
			LastTransitionTime: c.LastTransitionTime, Reason: c.Reason, Message: c.Message})
	}
	return rs
}
