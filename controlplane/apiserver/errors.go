package apiserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/waggle-io/waggle/controlplane/storage"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// statusFor maps any error to a Kubernetes Status.
func statusFor(err error, gr schema.GroupResource, name string) *apierrors.StatusError {
	var se *apierrors.StatusError
	if errors.As(err, &se) {
		return se
	}
	var ce *storage.CompactedError
	switch {
	case errors.As(err, &ce):
		return apierrors.NewResourceExpired(fmt.Sprintf("too old resource version: %d (%d)", ce.Requested, ce.Compacted))
	case errors.Is(err, storage.ErrCompacted):
		return apierrors.NewResourceExpired("too old resource version")
	case errors.Is(err, storage.ErrNotFound):
		return apierrors.NewNotFound(gr, name)
	case errors.Is(err, storage.ErrExists):
		return apierrors.NewAlreadyExists(gr, name)
	case errors.Is(err, storage.ErrConflict):
		return apierrors.NewConflict(gr, name, errors.New("the object has been modified; please apply your changes to the latest version and try again"))
	case errors.Is(err, storage.ErrTooLarge):
		return apierrors.NewRequestEntityTooLargeError("object is too large for storage")
	case errors.Is(err, storage.ErrUnavailable):
		return apierrors.NewServiceUnavailable(err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return apierrors.NewTimeoutError("request did not complete within the allowed duration", 1)
	case errors.Is(err, errBadBody):
		return apierrors.NewBadRequest(err.Error())
	}
	return apierrors.NewInternalError(err)
}

// isTransient reports errors of reaching the store in time: 503/504 with
// Retry-After wherever they happen on the request path.
func isTransient(err error) bool {
	return errors.Is(err, storage.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
}

// errPathNotFound is kube-apiserver's answer for a path it does not serve
// (an unknown resource or subresource): a path-style 404 without a name,
// which kubectl and helm read as "this kind is not served".
func errPathNotFound() error {
	return apierrors.NewGenericServerResponse(http.StatusNotFound, "", schema.GroupResource{}, "", "", 0, false)
}

// writeStatus writes err as a Status object with its HTTP code.
func writeStatus(w http.ResponseWriter, err error, gr schema.GroupResource, name string) {
	st := statusFor(err, gr, name).ErrStatus
	st.Kind, st.APIVersion = "Status", "v1"
	if st.Status == "" {
		st.Status = metav1.StatusFailure
	}
	code := int(st.Code)
	if code == 0 {
		code = http.StatusInternalServerError
		st.Code = int32(code)
	}
	switch {
	case st.Details != nil && st.Details.RetryAfterSeconds > 0:
		w.Header().Set("Retry-After", strconv.Itoa(int(st.Details.RetryAfterSeconds)))
	case code == http.StatusServiceUnavailable || code == http.StatusGatewayTimeout:
		// Storage and timeout errors: worth retrying soon. (A 429 says
		// when only if its Status does, as kube-apiserver: an eviction
		// a budget forbids is not retried by client-go itself.)
		w.Header().Set("Retry-After", strconv.Itoa(1))
	}
	b, _ := json.Marshal(&st)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	w.Write(b)
}
