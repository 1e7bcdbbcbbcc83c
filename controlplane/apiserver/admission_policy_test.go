package apiserver_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/waggle-io/waggle/controlplane/apiserver/apiservertest"
	"github.com/waggle-io/waggle/internal/testutil"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	kptr "k8s.io/utils/ptr"
)

func vapDeployment(name string, replicas int32, labels map[string]string) *appsv1.Deployment {
	sel := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: sel},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: sel},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}},
		},
	}
}

// TestValidatingAdmissionPolicy: CEL validations with params, a
// messageExpression, Deny and Warn bindings, and nothing stored on denial.
func TestValidatingAdmissionPolicy(t *testing.T) {
	s := apiservertest.Start(t, apiservertest.Options{})
	ctx := context.Background()
	cs := kubernetes.NewForConfigOrDie(s.Config)
	var warnings []string
	wcfg := rest.CopyConfig(s.Config)
	wcfg.WarningHandlerWithContext = warningCollector(func(m string) { warnings = append(warnings, m) })
	wcs := kubernetes.NewForConfigOrDie(wcfg)

	if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "limits"}, Data: map[string]string{"maxReplicas": "3"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "replica-limit"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: kptr.To(admissionregistrationv1.Fail),
			ParamKind:     &admissionregistrationv1.ParamKind{APIVersion: "v1", Kind: "ConfigMap"},
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{"apps"}, APIVersions: []string{"v1"}, Resources: []string{"deployments"}},
				}}}},
			Validations: []admissionregistrationv1.Validation{{
				Expression:        "object.spec.replicas <= int(params.data.maxReplicas)",
				MessageExpression: "'replicas must be at most ' + params.data.maxReplicas + ', not ' + string(object.spec.replicas)",
			}},
			AuditAnnotations: []admissionregistrationv1.AuditAnnotation{{Key: "replicas", ValueExpression: "string(object.spec.replicas)"}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bind := func(name string, actions []admissionregistrationv1.ValidationAction, selector map[string]string) {
		t.Helper()
		_, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
				PolicyName: "replica-limit", ValidationActions: actions,
				ParamRef: &admissionregistrationv1.ParamRef{Name: "limits", Namespace: "default",
					ParameterNotFoundAction: kptr.To(admissionregistrationv1.DenyAction)},
				MatchResources: &admissionregistrationv1.MatchResources{ObjectSelector: &metav1.LabelSelector{MatchLabels: selector}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	bind("deny", []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}, map[string]string{"policy": "deny"})
	bind("warn", []admissionregistrationv1.ValidationAction{admissionregistrationv1.Warn, admissionregistrationv1.Audit}, map[string]string{"policy": "warn"})

	want := `ValidatingAdmissionPolicy 'replica-limit' with binding 'deny' denied request: replicas must be at most 3, not 5`
	i := 0
	testutil.Eventually(t, 45*time.Second, func() error {
		i++
		// Dry runs until the policy is in force: they are admitted like
		// writes and store nothing.
		_, err := cs.AppsV1().Deployments("default").Create(ctx, vapDeployment(fmt.Sprintf("big-%d", i), 5, map[string]string{"policy": "deny"}), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), want) {
			return fmt.Errorf("over the limit: %v", err)
		}
		return nil
	})
	if _, err := cs.AppsV1().Deployments("default").Create(ctx, vapDeployment("big", 5, map[string]string{"policy": "deny"}), metav1.CreateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), want) {
		t.Errorf("over the limit: %v", err)
	}
	if l, _ := cs.AppsV1().Deployments("default").List(ctx, metav1.ListOptions{}); len(l.Items) != 0 {
		t.Errorf("denied deployments stored: %d", len(l.Items))
	}
	if _, err := cs.AppsV1().Deployments("default").Create(ctx, vapDeployment("small", 2, map[string]string{"policy": "deny"}), metav1.CreateOptions{}); err != nil {
		t.Errorf("within the limit: %v", err)
	}
	// An update over the limit is denied too.
	d, _ := cs.AppsV1().Deployments("default").Get(ctx, "small", metav1.GetOptions{})
	d.Spec.Replicas = kptr.To[int32](9)
	if _, err := cs.AppsV1().Deployments("default").Update(ctx, d, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
		t.Errorf("update over the limit: %v", err)
	}
	// Warn: stored, with the message as a warning.
	testutil.Eventually(t, 45*time.Second, func() error {
		warnings = nil
		name := fmt.Sprintf("warned-%d", time.Now().UnixNano())
		if _, err := wcs.AppsV1().Deployments("default").Create(ctx, vapDeployment(name, 7, map[string]string{"policy": "warn"}), metav1.CreateOptions{}); err != nil {
			return err
		}
		for _, w := range warnings {
			if strings.Contains(w, "Validation failed for ValidatingAdmissionPolicy 'replica-limit' with binding 'warn': replicas must be at most 3, not 7") {
				return nil
			}
		}
		return fmt.Errorf("warnings = %q", warnings)
	})
	// A missing param with parameterNotFoundAction Deny denies.
	if err := cs.CoreV1().ConfigMaps("default").Delete(ctx, "limits", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 45*time.Second, func() error {
		_, err := cs.AppsV1().Deployments("default").Create(ctx, vapDeployment(fmt.Sprintf("noparam-%d", time.Now().UnixNano()), 1, map[string]string{"policy": "deny"}), metav1.CreateOptions{})
		if err == nil || !strings.Contains(err.Error(), "no params found for policy binding with `Deny` parameterNotFoundAction") {
			return fmt.Errorf("without its param: %v", err)
		}
		return nil
	})
}

// TestMutatingAdmissionPolicy: an ApplyConfiguration mutation (GA and on by
// default since 1.36) changes what is stored.
func TestMutatingAdmissionPolicy(t *testing.T) {
	s := apiservertest.Start(t, apiservertest.Options{})
	ctx := context.Background()
	cs := kubernetes.NewForConfigOrDie(s.Config)
	_, err := cs.AdmissionregistrationV1().MutatingAdmissionPolicies().Create(ctx, &admissionregistrationv1.MutatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "label"},
		Spec: admissionregistrationv1.MutatingAdmissionPolicySpec{
			FailurePolicy:      kptr.To(admissionregistrationv1.Fail),
			ReinvocationPolicy: admissionregistrationv1.NeverReinvocationPolicy,
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}},
				}}}},
			Mutations: []admissionregistrationv1.Mutation{{
				PatchType: admissionregistrationv1.PatchTypeApplyConfiguration,
				ApplyConfiguration: &admissionregistrationv1.ApplyConfiguration{
					Expression: `Object{data: {"mutated": "by-policy"}}`,
				},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.AdmissionregistrationV1().MutatingAdmissionPolicyBindings().Create(ctx, &admissionregistrationv1.MutatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "label"},
		Spec:       admissionregistrationv1.MutatingAdmissionPolicyBindingSpec{PolicyName: "label"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 45*time.Second, func() error {
		name := fmt.Sprintf("c-%d", time.Now().UnixNano())
		if _, err := cs.CoreV1().ConfigMaps("default").Create(ctx, cm(name, nil), metav1.CreateOptions{}); err != nil {
			return err
		}
		got, err := cs.CoreV1().ConfigMaps("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got.Data["mutated"] != "by-policy" || got.Data["k"] != "v" {
			return fmt.Errorf("stored data %v", got.Data)
		}
		return nil
	})
}
