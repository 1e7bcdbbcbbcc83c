package kubelet

import (
	"context"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
)

// The kubelet's Event reasons, as upstream's (pkg/kubelet/events).
const (
	EventPulling                = "Pulling"
	EventPulled                 = "Pulled"
	EventFailed                 = "Failed"
	EventBackOff                = "BackOff"
	EventCreated                = "Created"
	EventStarted                = "Started"
	EventKilling                = "Killing"
	EventUnhealthy              = "Unhealthy"
	EventFailedMount            = "FailedMount"
	EventFailedCreatePodSandBox = "FailedCreatePodSandBox"
	EventFailedKillPod          = "FailedKillPod"
	EventNodeReady              = "NodeReady"
	EventNodeNotReady           = "NodeNotReady"
	EventDeadlineExceeded       = "DeadlineExceeded"
	EventResizeDeferred         = "ResizeDeferred"
	EventResizeInfeasible       = "ResizeInfeasible"
	EventResizeCompleted        = "ResizeCompleted"
	EventResizeError            = "ResizeError"
)

// startEvents makes the kubelet's recorder: client-go's broadcaster with its
// correlator, which aggregates similar events and counts repeats into one
// Event (so a crash-looping pod updates a count instead of flooding).
func (k *Kubelet) startEvents(ctx context.Context) func() {
	if k.recorder != nil {
		return func() {}
	}
	b := record.NewBroadcaster(record.WithContext(ctx))
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: k.client.CoreV1().Events("")})
	k.recorder = b.NewRecorder(scheme.Scheme, v1.EventSource{Component: "kubelet", Host: k.cfg.NodeName})
	return b.Shutdown
}

// event records an Event about pod (its mirror for a static pod is the same
// name and namespace).
func (k *Kubelet) event(pod *v1.Pod, typ, reason, format string, args ...any) {
	if k.recorder == nil || pod == nil {
		return
	}
	ref := &v1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
	k.recorder.Eventf(ref, typ, reason, format, args...)
}

// containerEvent records an Event about one container of pod, with the
// fieldPath kubectl describe shows.
func (k *Kubelet) containerEvent(pod *v1.Pod, c string, typ, reason, format string, args ...any) {
	if k.recorder == nil || pod == nil {
		return
	}
	ref := &v1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID,
		FieldPath: "spec.containers{" + c + "}"}
	k.recorder.Eventf(ref, typ, reason, format, args...)
}

// nodeEvent records an Event about this node (upstream's reference: the
// Node by name, its UID the name).
func (k *Kubelet) nodeEvent(typ, reason, format string, args ...any) {
	if k.recorder == nil {
		return
	}
	ref := &v1.ObjectReference{Kind: "Node", Name: k.cfg.NodeName, UID: types.UID(k.cfg.NodeName)}
	k.recorder.Eventf(ref, typ, reason, format, args...)
}
