package controllers

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/waggle-io/waggle/internal/testutil"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Against the real API server, the controller-manager type-checks each
// ValidatingAdmissionPolicy against the OpenAPI schemas the server
// publishes: a sound policy gets status.typeChecking without warnings, a
// type-confused one gets a warning per bad expression.
func TestValidatingAdmissionPolicyTypeChecking(t *testing.T) {
	c := newCluster(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c.startManager("cm-0", nil)
	policy := func(name, expr string) {
		t.Helper()
		_, err := c.cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, &admissionregistrationv1.ValidatingAdmissionPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
				MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
						Rule:       admissionregistrationv1.Rule{APIGroups: []string{"apps"}, APIVersions: []string{"v1"}, Resources: []string{"deployments"}},
					}}}},
				Validations: []admissionregistrationv1.Validation{{Expression: expr}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	policy("sound", "object.spec.replicas > 1")
	policy("confused", "object.spec.replicas > '1'")
	check := func(name string, warnings int) {
		testutil.Eventually(t, 60*time.Second, func() error {
			p, err := c.cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p.Status.TypeChecking == nil {
				return fmt.Errorf("%s: no typeChecking yet", name)
			}
			if n := len(p.Status.TypeChecking.ExpressionWarnings); n != warnings {
				return fmt.Errorf("%s: %d warnings %+v, want %d", name, n, p.Status.TypeChecking.ExpressionWarnings, warnings)
			}
			return nil
		})
	}
	check("sound", 0)
	check("confused", 1)
}
