// Package apiclient is what Waggle's components share about their clients of
// the API server.
package apiclient

import "k8s.io/client-go/rest"

// The media types a component's client may speak.
const (
	Protobuf = "application/vnd.kubernetes.protobuf"
	JSON     = "application/json"
)

// SetContentType makes rc send contentType and, with protobuf, ask for
// protobuf first and JSON after it (what the server answers for kinds
// without a protobuf encoding), as upstream's kubelet, scheduler and
// controller-manager do by default (--kube-api-content-type,
// clientConnection.contentType). Clients made from rc for custom resources
// (client-go's dynamic client) set JSON themselves.
func SetContentType(rc *rest.Config, contentType string) {
	rc.ContentType = contentType
	if contentType == Protobuf {
		rc.AcceptContentTypes = Protobuf + "," + JSON
	} else {
		rc.AcceptContentTypes = ""
	}
}
