package apiserver

import (
	"context"
	"fmt"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// connect serves log, exec, attach, portforward and proxy subresources.
// They need the node's kubelet API; until a connector is configured they
// answer 503 with a Status saying so.
func (s *Server) connect(ctx context.Context, w http.ResponseWriter, r *http.Request, req *request) error {
	return apierrors.NewServiceUnavailable(fmt.Sprintf("%s/%s is not connected to a kubelet yet", req.reg.res.Resource, req.sub))
}
