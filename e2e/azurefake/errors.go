package main

import (
	"errors"
	"fmt"
	"net/http"
)

// armError is an error as Azure Resource Manager reports it: an HTTP status
// and the code and message of its envelope.
type armError struct {
	status  int
	code    string // ResourceNotFound, Conflict, PreconditionFailed, ...
	message string
	target  string // the offending parameter, when there is one
}

func (e *armError) Error() string { return fmt.Sprintf("%d %s: %s", e.status, e.code, e.message) }

// errResourceNotFound is ARM's 404 for a resource (a "Type/name" path under
// the resource group) that does not exist.
func errResourceNotFound(rg, resource string) *armError {
	return &armError{status: http.StatusNotFound, code: "ResourceNotFound",
		message: fmt.Sprintf("The Resource 'Microsoft.Compute/%s' under resource group '%s' was not found. "+
			"For more details please go to https://aka.ms/ARMResourceNotFoundFix", resource, rg)}
}

func errNotFound(format string, args ...any) *armError {
	return &armError{status: http.StatusNotFound, code: "NotFound", message: fmt.Sprintf(format, args...)}
}

func errConflict(format string, args ...any) *armError {
	return &armError{status: http.StatusConflict, code: "Conflict", message: fmt.Sprintf(format, args...)}
}

func errInvalidParameter(target, format string, args ...any) *armError {
	return &armError{status: http.StatusBadRequest, code: "InvalidParameter",
		message: fmt.Sprintf(format, args...), target: target}
}

func errPreconditionFailed(sent, current string) *armError {
	return &armError{status: http.StatusPreconditionFailed, code: "PreconditionFailed",
		message: fmt.Sprintf("The specified precondition 'If-Match = %s' failed; the current etag is %s.", sent, current)}
}

func errMissingAPIVersion() *armError {
	return &armError{status: http.StatusBadRequest, code: "MissingApiVersionParameter",
		message: "The api-version query parameter (?api-version=) is required for all requests."}
}

func errAuthenticationFailed(message string) *armError {
	return &armError{status: http.StatusUnauthorized, code: "AuthenticationFailed", message: message}
}

// injectedCodes are ARM's codes for the statuses /fake/fail can inject.
var injectedCodes = map[int]string{
	http.StatusBadRequest:          "BadRequest",
	http.StatusUnauthorized:        "AuthenticationFailed",
	http.StatusForbidden:           "AuthorizationFailed",
	http.StatusNotFound:            "NotFound",
	http.StatusConflict:            "Conflict",
	http.StatusPreconditionFailed:  "PreconditionFailed",
	http.StatusTooManyRequests:     "TooManyRequests",
	http.StatusServiceUnavailable:  "ServiceUnavailable",
	http.StatusInternalServerError: "InternalServerError",
}

// injectedError is what /fake/fail and /fake/fail-after answer with.
func injectedError(status int) *armError {
	code := injectedCodes[status]
	switch {
	case code != "":
	case status >= 500:
		code = "InternalServerError"
	default:
		code = "BadRequest"
	}
	return &armError{status: status, code: code, message: "Injected by the fake: " + http.StatusText(status) + "."}
}

func asARMError(err error) *armError {
	var e *armError
	if errors.As(err, &e) {
		return e
	}
	return &armError{status: http.StatusInternalServerError, code: "InternalServerError", message: err.Error()}
}

// errorEnvelope is the JSON body of every ARM error:
// {"error":{"code":"ResourceNotFound","message":"..."}}
type errorEnvelope struct {
	Error errorBody `json:"error"`
}

type errorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Target  string `json:"target,omitempty"`
}

// writeARMError answers e in ARM's envelope, its code in x-ms-error-code too;
// a 429 says Retry-After: 0.
func writeARMError(w http.ResponseWriter, e *armError) {
	setHeader(w, "x-ms-error-code", e.code)
	if e.status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "0")
	}
	writeJSON(w, e.status, errorEnvelope{Error: errorBody{Code: e.code, Message: e.message, Target: e.target}})
}
