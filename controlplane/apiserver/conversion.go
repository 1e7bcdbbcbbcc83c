package apiserver

import (
	"fmt"
	"sync"

	"github.com/waggle-io/waggle/controlplane/apiserver/catalog"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// conversions between a served version and the version of its store, by
// "from -> to" kinds.
var conversions = map[[2]schema.GroupVersionKind]func(runtime.Object) (runtime.Object, error){
	{eventsv1.SchemeGroupVersion.WithKind("Event"), corev1.SchemeGroupVersion.WithKind("Event")}: func(o runtime.Object) (runtime.Object, error) {
		return eventToCore(o.(*eventsv1.Event)), nil
	},
	{corev1.SchemeGroupVersion.WithKind("Event"), eventsv1.SchemeGroupVersion.WithKind("Event")}: func(o runtime.Object) (runtime.Object, error) {
		return eventFromCore(o.(*corev1.Event)), nil
	},
}

var converters sync.Map // GroupVersionResource -> *converter

// converterFor returns the converter between res and the resource whose
// store it shares (owner; nil looks it up among the built-in resources).
func converterFor(res *catalog.Resource, owner *catalog.Resource) (*converter, error) {
	if c, ok := converters.Load(res.GroupVersionResource); ok {
		return c.(*converter), nil
	}
	if owner == nil {
		o, ok := catalog.Lookup(*res.StoredAs)
		if !ok {
			return nil, fmt.Errorf("apiserver: %s is stored as %s, which is not served", res.GroupVersionResource, res.StoredAs)
		}
		owner = o
	}
	to := conversions[[2]schema.GroupVersionKind{res.GroupVersionKind(), owner.GroupVersionKind()}]
	from := conversions[[2]schema.GroupVersionKind{owner.GroupVersionKind(), res.GroupVersionKind()}]
	if to == nil || from == nil {
		return nil, fmt.Errorf("apiserver: no conversion between %s and its storage version %s", res.GroupVersionKind(), owner.GroupVersionKind())
	}
	c := &converter{storage: owner, toStorage: to, fromStorage: from}
	converters.Store(res.GroupVersionResource, c)
	return c, nil
}

// eventToCore is events.k8s.io/v1 → core/v1, field for field as
// kube-apiserver converts them (both go through one internal type).
func eventToCore(e *eventsv1.Event) *corev1.Event {
	out := &corev1.Event{
		ObjectMeta:          *e.ObjectMeta.DeepCopy(),
		InvolvedObject:      e.Regarding,
		Reason:              e.Reason,
		Message:             e.Note,
		Source:              e.DeprecatedSource,
		FirstTimestamp:      e.DeprecatedFirstTimestamp,
		LastTimestamp:       e.DeprecatedLastTimestamp,
		Count:               e.DeprecatedCount,
		Type:                e.Type,
		EventTime:           e.EventTime,
		Action:              e.Action,
		Related:             e.Related.DeepCopy(),
		ReportingController: e.ReportingController,
		ReportingInstance:   e.ReportingInstance,
	}
	if e.Series != nil {
		out.Series = &corev1.EventSeries{Count: e.Series.Count, LastObservedTime: e.Series.LastObservedTime}
	}
	return out
}

// eventFromCore is core/v1 → events.k8s.io/v1.
func eventFromCore(e *corev1.Event) *eventsv1.Event {
	out := &eventsv1.Event{
		ObjectMeta:               *e.ObjectMeta.DeepCopy(),
		EventTime:                e.EventTime,
		ReportingController:      e.ReportingController,
		ReportingInstance:        e.ReportingInstance,
		Action:                   e.Action,
		Reason:                   e.Reason,
		Regarding:                e.InvolvedObject,
		Related:                  e.Related.DeepCopy(),
		Note:                     e.Message,
		Type:                     e.Type,
		DeprecatedSource:         e.Source,
		DeprecatedFirstTimestamp: e.FirstTimestamp,
		DeprecatedLastTimestamp:  e.LastTimestamp,
		DeprecatedCount:          e.Count,
	}
	if e.Series != nil {
		out.Series = &eventsv1.EventSeries{Count: e.Series.Count, LastObservedTime: e.Series.LastObservedTime}
	}
	return out
}
