package scheduler

import (
	"testing"

	"k8s.io/client-go/rest"
)

// The scheduler's API client speaks protobuf, as kube-scheduler's by
// default (clientConnection.contentType), whether its config comes from a
// kubeconfig or in-process; a content type set by the caller is kept.
func TestAPIClientSpeaksProtobuf(t *testing.T) {
	for _, tc := range []struct {
		name               string
		in                 *rest.Config
		wantType, wantAccs string
	}{
		{"in-process", &rest.Config{Host: "https://127.0.0.1:6443"}, "application/vnd.kubernetes.protobuf", "application/vnd.kubernetes.protobuf,application/json"},
		{"caller's JSON kept", &rest.Config{Host: "https://127.0.0.1:6443", ContentConfig: rest.ContentConfig{ContentType: "application/json"}}, "application/json", ""},
	} {
		rc, err := Config{RestConfig: tc.in}.restConfig()
		if err != nil {
			t.Fatal(err)
		}
		if rc.ContentType != tc.wantType || rc.AcceptContentTypes != tc.wantAccs {
			t.Errorf("%s: Content-Type %q, Accept %q; want %q, %q", tc.name, rc.ContentType, rc.AcceptContentTypes, tc.wantType, tc.wantAccs)
		}
	}
	rc, err := Config{Master: "https://127.0.0.1:6443"}.restConfig()
	if err != nil {
		t.Fatal(err)
	}
	if rc.ContentType != "application/vnd.kubernetes.protobuf" {
		t.Errorf("from flags: Content-Type %q, want protobuf", rc.ContentType)
	}
}
