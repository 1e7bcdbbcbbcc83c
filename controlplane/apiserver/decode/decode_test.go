package decode

import (
	"errors"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

func TestDecodeFieldValidation(t *testing.T) {
	cases := []struct {
		name      string
		body      string
		directive string
		wantErr   error
		wantInErr string
		wantWarn  []string
		wantImage string
	}{
		{"valid json strict", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"nginx"}]}}`, Strict, nil, "", nil, "nginx"},
		{"valid yaml strict", "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n  - name: c\n    image: busybox\n", Strict, nil, "", nil, "busybox"},
		{"unknown field strict json", `{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"x","imagePullPolic":"Always"}]}}`, Strict,
			ErrStrict, `strict decoding error: unknown field "spec.containers[0].imagePullPolic"`, nil, ""},
		{"unknown field strict yaml", "metadata:\n  name: p\n  labelz: {}\n", Strict, ErrStrict, `unknown field "metadata.labelz"`, nil, ""},
		{"duplicate field strict json", `{"metadata":{"name":"a","name":"b"}}`, Strict, ErrStrict, `duplicate field "metadata.name"`, nil, ""},
		{"duplicate field strict yaml", "metadata:\n  name: a\n  name: b\n", Strict, ErrStrict, `duplicate field "name" (line 3)`, nil, ""},
		{"wrong case is unknown", `{"Metadata":{"name":"a"}}`, Strict, ErrStrict, `unknown field "Metadata"`, nil, ""},
		{"unknown field warn", `{"spec":{"containers":[{"name":"c","image":"x","bogus":1}]}}`, Warn, nil, "", []string{`unknown field "spec.containers[0].bogus"`}, "x"},
		{"default directive warns", `{"spec":{"containers":[{"name":"c","image":"y","bogus":1}]}}`, "", nil, "", []string{`unknown field "spec.containers[0].bogus"`}, "y"},
		{"unknown field ignore", `{"spec":{"containers":[{"name":"c","image":"z","bogus":1}]}}`, Ignore, nil, "", nil, "z"},
		{"malformed json", `{"metadata":`, Strict, ErrMalformed, "", nil, ""},
		{"wrong type", `{"metadata":{"name":5}}`, Ignore, ErrMalformed, "", nil, ""},
		{"malformed yaml", "metadata:\n  name: [\n", Strict, ErrMalformed, "", nil, ""},
		{"empty body", "  ", Strict, ErrMalformed, "", nil, ""},
		{"null body", "null", Strict, ErrMalformed, "", nil, ""},
		{"array for object", `[1,2]`, Strict, ErrMalformed, "", nil, ""},
		{"bad directive", `{}`, "strict", ErrDirective, "", nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var pod corev1.Pod
			warns, err := Decode([]byte(tc.body), &pod, tc.directive)
			if tc.wantErr == nil && err != nil || tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if tc.wantInErr != "" && !strings.Contains(err.Error(), tc.wantInErr) {
				t.Errorf("err %q does not contain %q", err, tc.wantInErr)
			}
			if strings.Join(warns, "|") != strings.Join(tc.wantWarn, "|") {
				t.Errorf("warnings = %q, want %q", warns, tc.wantWarn)
			}
			if tc.wantImage != "" && (len(pod.Spec.Containers) == 0 || pod.Spec.Containers[0].Image != tc.wantImage) {
				t.Errorf("decoded pod = %+v", pod.Spec)
			}
		})
	}
}

func TestStrictDecodeKeepsIntOrStringAndQuantities(t *testing.T) {
	var d appsv1.Deployment
	body := `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d"},"spec":{"replicas":3,
	"strategy":{"rollingUpdate":{"maxSurge":"25%","maxUnavailable":1}},
	"template":{"spec":{"containers":[{"name":"c","image":"i","resources":{"limits":{"cpu":"500m","memory":"1Gi"}}}]}}}}`
	if err := StrictDecode([]byte(body), &d); err != nil {
		t.Fatal(err)
	}
	if d.Kind != "Deployment" || *d.Spec.Replicas != 3 || d.Spec.Strategy.RollingUpdate.MaxSurge.String() != "25%" ||
		d.Spec.Strategy.RollingUpdate.MaxUnavailable.IntValue() != 1 ||
		d.Spec.Template.Spec.Containers[0].Resources.Limits.Cpu().MilliValue() != 500 {
		t.Errorf("decoded %+v", d)
	}
}

func TestBillionLaughsIsRefusedQuickly(t *testing.T) {
	var b strings.Builder
	b.WriteString("a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n")
	prev := "a"
	for _, n := range []string{"b", "c", "d", "e", "f", "g", "h", "i"} {
		b.WriteString(n + ": &" + n + " [*" + prev + ",*" + prev + ",*" + prev + ",*" + prev + ",*" + prev + ",*" + prev + ",*" + prev + ",*" + prev + ",*" + prev + "]\n")
		prev = n
	}
	var pod corev1.Pod
	if _, err := Decode([]byte(b.String()), &pod, Strict); !errors.Is(err, ErrMalformed) {
		t.Errorf("err = %v, want ErrMalformed", err)
	}
}

func TestDeepNestingIsAnError(t *testing.T) {
	deep := strings.Repeat("[", 100000) + strings.Repeat("]", 100000)
	var pod corev1.Pod
	if _, err := Decode([]byte(`{"metadata":{"annotations":`+deep+`}}`), &pod, Strict); !errors.Is(err, ErrMalformed) {
		t.Errorf("err = %v, want ErrMalformed", err)
	}
	yamlDeep := strings.Repeat("- ", 10000) + "x\n"
	if _, err := Decode([]byte(yamlDeep), &pod, Strict); !errors.Is(err, ErrMalformed) {
		t.Errorf("yaml err = %v, want ErrMalformed", err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"metadata":{"name":"a","name":"b"},"spec":{"x":1}}`))
	f.Add([]byte("metadata:\n  name: a\n  name: b\n"))
	f.Add([]byte("a: &a [1]\nb: [*a,*a]\n"))
	f.Add([]byte(`{"spec":{"containers":[{"resources":{"limits":{"cpu":"1e3"}}}]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, d := range []string{Strict, Warn, Ignore} {
			var pod corev1.Pod
			_, err := Decode(data, &pod, d)
			if err != nil && !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrStrict) {
				t.Fatalf("%s: uncategorised error %v", d, err)
			}
		}
	})
}
