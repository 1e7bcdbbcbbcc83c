package crd

import (
	"fmt"
	"reflect"
	"slices"

	apihelpers "k8s.io/apiextensions-apiserver/pkg/apihelpers"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/sets"
)

// SetCondition sets (or replaces) a condition, keeping lastTransitionTime
// when the status does not change, as upstream's helper.
func SetCondition(crd *apiextensionsv1.CustomResourceDefinition, c apiextensionsv1.CustomResourceDefinitionCondition) {
	c.ObservedGeneration = crd.Generation
	apihelpers.SetCRDCondition(crd, c)
}

// IsTrue reports whether the CRD's condition t is True.
func IsTrue(crd *apiextensionsv1.CustomResourceDefinition, t apiextensionsv1.CustomResourceDefinitionConditionType) bool {
	return apihelpers.IsCRDConditionTrue(crd, t)
}

// Reconcile computes the status the CRD controllers of apiextensions-apiserver
// would give crd, among the other CRDs of the cluster (others may include
// crd itself; it is skipped): accepted names and NamesAccepted as the naming
// controller decides them (a name another CRD of the group has accepted is
// a conflict), and Established once its resources are served (served: the
// establishing controller's step, at once with one API server). It returns
// the updated copy and whether anything changed.
func Reconcile(crd *apiextensionsv1.CustomResourceDefinition, others []*apiextensionsv1.CustomResourceDefinition, served bool) (*apiextensionsv1.CustomResourceDefinition, bool) {
	out := crd.DeepCopy()
	if !equality.Semantic.DeepEqual(crd.Spec.Names, crd.Status.AcceptedNames) || apihelpers.FindCRDCondition(crd, apiextensionsv1.NamesAccepted) == nil {
		names, accepted := acceptNames(crd, others)
		out.Status.AcceptedNames = names
		SetCondition(out, accepted)
		if accepted.Status == apiextensionsv1.ConditionTrue && !IsTrue(out, apiextensionsv1.Established) {
			SetCondition(out, apiextensionsv1.CustomResourceDefinitionCondition{
				Type: apiextensionsv1.Established, Status: apiextensionsv1.ConditionFalse,
				Reason: "Installing", Message: "the initial names have been accepted",
			})
		} else if accepted.Status != apiextensionsv1.ConditionTrue && apihelpers.FindCRDCondition(out, apiextensionsv1.Established) == nil {
			SetCondition(out, apiextensionsv1.CustomResourceDefinitionCondition{
				Type: apiextensionsv1.Established, Status: apiextensionsv1.ConditionFalse,
				Reason: "NotAccepted", Message: "not all names are accepted",
			})
		}
	}
	if served && IsTrue(out, apiextensionsv1.NamesAccepted) && !IsTrue(out, apiextensionsv1.Established) && out.DeletionTimestamp == nil {
		SetCondition(out, apiextensionsv1.CustomResourceDefinitionCondition{
			Type: apiextensionsv1.Established, Status: apiextensionsv1.ConditionTrue,
			Reason: "InitialNamesAccepted", Message: "the initial names have been accepted",
		})
	}
	changed := !equality.Semantic.DeepEqual(stripTimes(out.Status), stripTimes(crd.Status))
	return out, changed
}

func stripTimes(s apiextensionsv1.CustomResourceDefinitionStatus) apiextensionsv1.CustomResourceDefinitionStatus {
	s = *s.DeepCopy()
	for i := range s.Conditions {
		s.Conditions[i].LastTransitionTime = metav1.Time{}
	}
	return s
}

func acceptNames(in *apiextensionsv1.CustomResourceDefinition, others []*apiextensionsv1.CustomResourceDefinition) (apiextensionsv1.CustomResourceDefinitionNames, apiextensionsv1.CustomResourceDefinitionCondition) {
	resources, kinds := sets.New[string](), sets.New[string]()
	for _, o := range others {
		if o.Name == in.Name || o.Spec.Group != in.Spec.Group {
			continue
		}
		n := o.Status.AcceptedNames
		resources.Insert(n.Plural, n.Singular)
		resources.Insert(n.ShortNames...)
		kinds.Insert(n.Kind, n.ListKind)
	}
	cond := apiextensionsv1.CustomResourceDefinitionCondition{Type: apiextensionsv1.NamesAccepted, Status: apiextensionsv1.ConditionUnknown}
	conflict := func(reason string, err error) {
		cond.Status, cond.Reason, cond.Message = apiextensionsv1.ConditionFalse, reason, err.Error()
	}
	req, acc := in.Spec.Names, in.Status.AcceptedNames
	out := acc
	if err := freshOrAccepted(req.Plural, acc.Plural, resources); err != nil {
		conflict("PluralConflict", err)
	} else {
		out.Plural = req.Plural
	}
	if err := freshOrAccepted(req.Singular, acc.Singular, resources); err != nil {
		conflict("SingularConflict", err)
	} else {
		out.Singular = req.Singular
	}
	if !reflect.DeepEqual(req.ShortNames, acc.ShortNames) {
		var errs []error
		for _, sn := range req.ShortNames {
			if slices.Contains(acc.ShortNames, sn) {
				continue
			}
			if err := freshOrAccepted(sn, "", resources); err != nil {
				errs = append(errs, err)
			}
		}
		if err := utilerrors.NewAggregate(errs); err != nil {
			conflict("ShortNamesConflict", err)
		} else {
			out.ShortNames = req.ShortNames
		}
	}
	if err := freshOrAccepted(req.Kind, acc.Kind, kinds); err != nil {
		conflict("KindConflict", err)
	} else {
		out.Kind = req.Kind
	}
	if err := freshOrAccepted(req.ListKind, acc.ListKind, kinds); err != nil {
		conflict("ListKindConflict", err)
	} else {
		out.ListKind = req.ListKind
	}
	out.Categories = req.Categories
	if cond.Status == apiextensionsv1.ConditionUnknown {
		cond.Status, cond.Reason, cond.Message = apiextensionsv1.ConditionTrue, "NoConflicts", "no conflicts found"
	}
	return out, cond
}

func freshOrAccepted(requested, accepted string, used sets.Set[string]) error {
	if requested == accepted || !used.Has(requested) {
		return nil
	}
	return fmt.Errorf("%q is already in use", requested)
}
