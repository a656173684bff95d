package main

import (
	"errors"
	"fmt"
	"net/http"
)

// apiError is an error as Compute Engine reports it: an HTTP status and one
// entry of the envelope's "errors" list.
type apiError struct {
	status   int
	reason   string // notFound, alreadyExists, invalid, required, authError, ...
	message  string
	domain   string // "global" unless set
	location string // for auth errors: "Authorization"
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s: %s", e.status, e.reason, e.message) }

func errNotFound(resource string) *apiError {
	return &apiError{status: http.StatusNotFound, reason: "notFound",
		message: fmt.Sprintf("The resource '%s' was not found", resource)}
}

func errAlreadyExists(resource string) *apiError {
	return &apiError{status: http.StatusConflict, reason: "alreadyExists",
		message: fmt.Sprintf("The resource '%s' already exists", resource)}
}

func errInvalid(format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, reason: "invalid", message: fmt.Sprintf(format, args...)}
}

func errRequired(field string) *apiError {
	return &apiError{status: http.StatusBadRequest, reason: "required",
		message: fmt.Sprintf("Required field '%s' not specified", field)}
}

// injectedError is what /fake/fail and /fake/fail-after answer with: the
// reason GCE gives for that status.
func injectedError(status int) *apiError {
	e := &apiError{status: status, reason: "invalid", message: http.StatusText(status)}
	switch {
	case status == http.StatusTooManyRequests || status == http.StatusForbidden:
		e.reason, e.domain = "rateLimitExceeded", "usageLimits"
		e.message = "Quota exceeded for quota metric 'Queries' and limit 'Queries per minute' of service 'compute.googleapis.com'."
	case status >= 500:
		e.reason = "backendError"
		e.message = "Internal error. Please try again or contact Google Support. (Code: 'fake')"
	case status == http.StatusUnauthorized:
		e.reason = "authError"
	case status == http.StatusNotFound:
		e.reason = "notFound"
	case status == http.StatusConflict:
		e.reason = "alreadyExists"
	}
	return e
}

func asAPIError(err error) *apiError {
	var e *apiError
	if errors.As(err, &e) {
		return e
	}
	return &apiError{status: http.StatusInternalServerError, reason: "backendError", message: err.Error()}
}

// errorEnvelope is the JSON body of every compute error:
// {"error":{"code":404,"message":"...","errors":[{"message":"...","domain":"global","reason":"notFound"}]}}
type errorEnvelope struct {
	Error errorBody `json:"error"`
}

type errorBody struct {
	Code    int         `json:"code"`
	Message string      `json:"message"`
	Errors  []errorItem `json:"errors"`
	// Status is the google.rpc code name; the API front end adds it to the
	// errors it makes itself (authentication, quota), Compute's own lack it.
	Status string `json:"status,omitempty"`
}

type errorItem struct {
	Message      string `json:"message"`
	Domain       string `json:"domain"`
	Reason       string `json:"reason"`
	Location     string `json:"location,omitempty"`
	LocationType string `json:"locationType,omitempty"`
}

func writeAPIError(w http.ResponseWriter, e *apiError) {
	item := errorItem{Message: e.message, Domain: e.domain, Reason: e.reason}
	if item.Domain == "" {
		item.Domain = "global"
	}
	if e.location != "" {
		item.Location, item.LocationType = e.location, "header"
	}
	body := errorBody{Code: e.status, Message: e.message, Errors: []errorItem{item}}
	switch e.status {
	case http.StatusUnauthorized:
		body.Status = "UNAUTHENTICATED"
	case http.StatusTooManyRequests:
		body.Status = "RESOURCE_EXHAUSTED"
	}
	writeJSON(w, e.status, errorEnvelope{Error: body})
}
